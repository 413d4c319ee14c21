package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The operator's lease timing (operator/src/leader.rs, the chart's defaults).
const (
	operatorRenewDeadline = 10 * time.Second
	operatorLeaseDuration = 15 * time.Second
)

// scenarioOperatorHang: the leading operator's API server accepts its requests and never answers (its
// hangproxy.py stops relaying; the process neither dies nor loses its connections). The leader must stop
// leading within its renew deadline, before its lease can expire for the other replica; the other then
// takes the Lease; no sample ever shows both replicas leading; a TrainingTask in flight completes with
// no attempt lost or duplicated.
func (e *env) scenarioOperatorHang(ctx context.Context, s *summary) {
	ports, err := e.operatorMetricsPorts()
	if !e.check(err == nil && len(ports) == 2, "operator metrics ports from %s (%v)", filepath.Join(e.work, "env.sh"), err) {
		return
	}
	leader := e.leaseHolder(ctx)
	idx := strings.LastIndex(leader, "-")
	i, err := strconv.Atoi(leader[idx+1:])
	if !e.check(idx >= 0 && err == nil && i >= 0 && i < 2, "the operator Lease holder is a replica (%q)", leader) {
		return
	}
	other := fmt.Sprintf("%s-%d", leader[:idx], 1-i)
	// Both replicas' view, from their own /metrics (served locally, not through the hung proxy).
	leading := func(r int) (bool, bool) {
		v, ok := scrapeGauge(fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[r]), "carma_operator_leader")
		return v == 1, ok
	}
	if l, ok := leading(i); !e.check(ok && l, "%s reports itself leader on /metrics before the hang", leader) {
		return
	}

	ns := "hang"
	e.ensureNamespace(ctx, ns)
	t := oomTask("hang-task", "cuda-oom,succeed", 2)
	t.SetNamespace(ns)
	_ = unstructured.SetNestedField(t.Object, "6", "spec", "template", "metadata", "annotations", annRunSeconds)
	_, err = e.dyn.Resource(ttGVR).Namespace(ns).Create(ctx, t, metav1.CreateOptions{})
	e.check(err == nil, "create TrainingTask %s/hang-task (%v)", ns, err)
	poll(ctx, 200*time.Millisecond, time.Minute, func() bool {
		st, err := e.task(ctx, ns, "hang-task")
		return err == nil && len(st.attempts) >= 1
	})

	fmt.Printf("  -- %s's API server hangs (accepts, never answers)\n", leader)
	t0 := time.Now()
	e.ctlRun("hang-operator-api", leader)
	var demoted, takenOver time.Duration
	both, samples := 0, 0
	poll(ctx, 100*time.Millisecond, operatorLeaseDuration+15*time.Second, func() bool {
		hungLeads, ok1 := leading(i)
		otherLeads, ok2 := leading(1 - i)
		if ok1 && ok2 {
			samples++
			if hungLeads && otherLeads {
				both++
			}
		}
		if samples <= 3 || (demoted == 0 && ok1 && !hungLeads) {
			fmt.Printf("    %.1f s: %s leads %v (read %v), %s leads %v (read %v), Lease %s\n",
				time.Since(t0).Seconds(), leader, hungLeads, ok1, other, otherLeads, ok2, e.leaseHolder(ctx))
		}
		if demoted == 0 && ok1 && !hungLeads {
			demoted = time.Since(t0)
		}
		if takenOver == 0 && e.leaseHolder(ctx) == other && ok2 && otherLeads {
			takenOver = time.Since(t0)
		}
		return demoted > 0 && takenOver > 0
	})
	e.ctlRun("unhang-operator-api", leader)
	s.hangRan = true
	s.hangDemoted, s.hangTakeover, s.hangBothLeading, s.hangSamples = demoted, takenOver, both, samples
	// The hang began somewhere after the last renewal, so the leader must step down within the renew
	// deadline of it; 2 s of slack for a loaded machine.
	e.check(demoted > 0 && demoted <= operatorRenewDeadline+2*time.Second,
		"%s stopped leading %s after its API server hung (renew deadline %s)", leader, seconds(demoted), operatorRenewDeadline)
	e.check(takenOver > 0 && demoted > 0 && takenOver > demoted,
		"%s took the Lease %s after the hang, after %s stepped down (%s)", other, seconds(takenOver), leader, seconds(demoted))
	e.check(both == 0 && samples > 0, "never two leaders: %d of %d samples of both replicas' /metrics show both leading", both, samples)

	st := e.waitTask(ctx, ns, "hang-task", "Succeeded", 2*time.Minute)
	pods, _ := e.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "carma.io/task=hang-task"})
	e.check(st.phase == "Succeeded" && len(st.attempts) == 2 && len(pods.Items) == 2,
		"hang-task: %s with %d attempts recorded and %d attempt pods (an OOM across the hang; none lost or duplicated)",
		st.phase, len(st.attempts), len(pods.Items))
	// Released, the hung replica follows: it must not lead again while the other holds the Lease.
	time.Sleep(3 * time.Second)
	l, ok := leading(i)
	e.check(ok && !l && e.leaseHolder(ctx) == other, "once its API server answers again, %s follows %s", leader, other)
}

// seconds prints a moment seen, or "never" for one not seen (0).
func seconds(d time.Duration) string {
	if d == 0 {
		return "never"
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}

// operatorMetricsPorts reads the operators' metrics ports (OP_PORTS) from run.sh's env.sh.
func (e *env) operatorMetricsPorts() ([]int, error) {
	f, err := os.Open(filepath.Join(e.work, "env.sh"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for _, part := range strings.Split(sc.Text(), ";") {
			v, ok := strings.CutPrefix(strings.TrimSpace(part), "OP_PORTS=")
			if !ok {
				continue
			}
			var out []int
			for _, p := range strings.Fields(strings.Trim(v, `"`)) {
				n, err := strconv.Atoi(p)
				if err != nil {
					return nil, fmt.Errorf("OP_PORTS %q: %v", v, err)
				}
				out = append(out, n)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("no OP_PORTS line")
}

// scrapeGauge reads one unlabelled sample of metric from a Prometheus text endpoint.
func scrapeGauge(url, metric string) (float64, bool) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == metric {
			v, err := strconv.ParseFloat(fields[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}
