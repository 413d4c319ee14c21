package main

// What makes the comparison like for like, and what it costs: the schedulers' client rate limits
// (read back from each kube-scheduler's /configz) and how long their requests waited in them
// (rest_client_rate_limiter_duration_seconds); a busy cluster (other pods bound to every hollow node,
// as in a shared cluster, before the batches); CPU seconds per 1,000 pods of each process from
// /proc/<pid>/stat; carma's API writes at rest and under load from kube-apiserver's
// apiserver_request_total; the spread over repeated runs.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const fillerNS = "scale-filler"

// ---- the busy cluster ---------------------------------------------------------------------------------

// createFiller creates perNode pods on every hollow node, bound at creation (spec.nodeName set, as a
// pod another scheduler placed long ago), concurrently, in a namespace of their own (the benchmark's
// pod informer does not see them; both kube-schedulers and the extender do). It returns how many the
// API server lists afterwards.
func (b *bench) createFiller(ctx context.Context, nodes, perNode int) (int, error) {
	if perNode <= 0 {
		return b.countFiller(ctx)
	}
	ensureNamespace(ctx, b.kube, fillerNS)
	var errs atomic.Int64
	g := new(errgroup.Group)
	g.SetLimit(b.cfg.createWorkers)
	for n := 1; n <= nodes; n++ {
		for i := 0; i < perNode; i++ {
			g.Go(func() error {
				_, err := b.kube.CoreV1().Pods(fillerNS).Create(ctx, fillerPod(nodeName(n), i), metav1.CreateOptions{})
				if err != nil && !apierrors.IsAlreadyExists(err) {
					if errs.Add(1) <= 3 {
						fmt.Printf("    filler on %s: %v\n", nodeName(n), err)
					}
				}
				return nil
			})
		}
	}
	_ = g.Wait()
	if e := errs.Load(); e > 0 {
		return 0, fmt.Errorf("%d filler pods could not be created", e)
	}
	return b.countFiller(ctx)
}

func fillerPod(node string, i int) *v1.Pod {
	q := resource.MustParse
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%02d", node, i), Namespace: fillerNS,
			Labels: map[string]string{"app": "scale-filler", labelBatch: "filler"}},
		Spec: v1.PodSpec{
			NodeName:      node,
			RestartPolicy: v1.RestartPolicyAlways,
			Containers: []v1.Container{{Name: "app", Image: "example.com/app:1",
				Resources: v1.ResourceRequirements{
					Requests: v1.ResourceList{v1.ResourceCPU: q("100m"), v1.ResourceMemory: q("128Mi")},
				}}},
		},
	}
}

// countFiller lists the filler namespace (pages of 5,000) and counts the pods bound to a node.
func (b *bench) countFiller(ctx context.Context) (int, error) {
	n := 0
	opts := metav1.ListOptions{Limit: 5000}
	for {
		l, err := b.kube.CoreV1().Pods(fillerNS).List(ctx, opts)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return n, nil
			}
			return n, err
		}
		for i := range l.Items {
			if l.Items[i].Spec.NodeName != "" {
				n++
			}
		}
		if l.Continue == "" {
			return n, nil
		}
		opts.Continue = l.Continue
	}
}

// ---- the schedulers' clients ------------------------------------------------------------------------

// clientLimits reads clientConnection.qps and burst from a kube-scheduler's /configz (its effective
// configuration, defaults applied).
func (b *bench) clientLimits(ctx context.Context, schedURL string) (qps float64, burst int64, err error) {
	raw, err := b.configz(ctx, schedURL)
	if err != nil {
		return 0, 0, err
	}
	return parseConfigz(raw)
}

// configz is a kube-scheduler's /configz.
func (b *bench) configz(ctx context.Context, schedURL string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, schedURL+"/configz", nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.metricsC.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/configz: HTTP %d: %.200s", schedURL, resp.StatusCode, raw)
	}
	return raw, nil
}

func parseConfigz(raw []byte) (qps float64, burst int64, err error) {
	var cz struct {
		ComponentConfig struct {
			ClientConnection struct {
				QPS   *float64 `json:"qps"`
				Burst *int64   `json:"burst"`
			} `json:"clientConnection"`
		} `json:"componentconfig"`
	}
	if err := json.Unmarshal(raw, &cz); err != nil {
		return 0, 0, fmt.Errorf("configz: %w", err)
	}
	cc := cz.ComponentConfig.ClientConnection
	if cc.QPS == nil || cc.Burst == nil {
		return 0, 0, fmt.Errorf("configz has no clientConnection.qps/burst")
	}
	return *cc.QPS, *cc.Burst, nil
}

// limiterFigures is how long a kube-scheduler's requests waited in its client's rate limiter over a
// phase (rest_client_rate_limiter_duration_seconds, every client of the process).
type limiterFigures struct {
	ok         bool
	qps        float64
	burst      int64
	requests   float64
	waitS      float64 // sum of the waits
	p99        float64 // seconds; NaN without observations
	firstBound float64 // the histogram's lowest bucket bound (a p99 at or below it is "within it")
	byVerb     map[string]float64
}

func limiterOf(before, after samples) limiterFigures {
	h := after.histogram("rest_client_rate_limiter_duration_seconds", nil).minus(
		before.histogram("rest_client_rate_limiter_duration_seconds", nil))
	f := limiterFigures{requests: h.count, waitS: h.sum, p99: h.quantile(0.99), firstBound: math.Inf(1)}
	for le := range h.buckets {
		f.firstBound = math.Min(f.firstBound, le)
	}
	f.ok = len(h.buckets) > 0
	f.byVerb = map[string]float64{}
	b := before.by("rest_client_rate_limiter_duration_seconds_sum", nil, "verb")
	for k, v := range after.by("rest_client_rate_limiter_duration_seconds_sum", nil, "verb") {
		if d := v - b[k]; d >= 0.005 {
			f.byVerb[k] = d
		}
	}
	return f
}

// bound says whether the client held the scheduler back: more than 1 % of its requests waited past
// the limiter histogram's lowest bucket (5 ms).
func (f limiterFigures) bound() bool {
	return f.ok && f.requests > 0 && f.p99 > f.firstBound
}

func (f limiterFigures) String() string {
	if !f.ok {
		return "rate limiter not read"
	}
	p99 := "no requests"
	if f.requests > 0 {
		p99 = fmt.Sprintf("p99 %.0f ms", f.p99*1000)
		if f.p99 <= f.firstBound {
			p99 = fmt.Sprintf("p99 ≤ %.0f ms (its lowest bucket)", f.firstBound*1000)
		}
	}
	by := ""
	if len(f.byVerb) > 0 {
		var verbs []string
		for k := range f.byVerb {
			verbs = append(verbs, k)
		}
		sort.Strings(verbs)
		var parts []string
		for _, k := range verbs {
			parts = append(parts, fmt.Sprintf("%s %.2f s", k, f.byVerb[k]))
		}
		by = " (" + strings.Join(parts, ", ") + ")"
	}
	return fmt.Sprintf("%s, %.2f s in all over %.0f requests%s", p99, f.waitS, f.requests, by)
}

// ---- CPU per batch -----------------------------------------------------------------------------------

// cpuProcs names the processes whose CPU time is read around each batch.
type cpuProcs map[string]int // name → pid

func (b *bench) cpuProcs(schedPID, extPID int) cpuProcs {
	p := cpuProcs{"benchmark": os.Getpid()}
	if schedPID > 0 {
		p["kube-scheduler"] = schedPID
	}
	if extPID > 0 {
		p["extender"] = extPID
	}
	for name, file := range map[string]string{"kube-apiserver": b.cfg.apiserverPidFile, "etcd": b.cfg.etcdPidFile} {
		if pid, err := pidOf(b.cfg.work, file); err == nil {
			p[name] = pid
		}
	}
	return p
}

// cpuNow reads each process's user + system CPU seconds; a process that cannot be read is left out.
func (p cpuProcs) now() map[string]float64 {
	out := map[string]float64{}
	for name, pid := range p {
		if _, cpu, err := procStat(pid); err == nil {
			out[name] = cpu
		}
	}
	return out
}

// cpuPer1000 is CPU seconds per 1,000 pods bound, by process, between two readings.
func cpuPer1000(before, after map[string]float64, pods int) map[string]float64 {
	out := map[string]float64{}
	if pods <= 0 {
		return out
	}
	for name, a := range after {
		if bf, ok := before[name]; ok {
			out[name] = (a - bf) * 1000 / float64(pods)
		}
	}
	return out
}

var cpuOrder = []string{"kube-scheduler", "extender", "kube-apiserver", "etcd", "benchmark"}

func fmtCPU(m map[string]float64) string {
	var parts []string
	for _, name := range cpuOrder {
		if v, ok := m[name]; ok {
			parts = append(parts, fmt.Sprintf("%s %.1f", name, v))
		}
	}
	if len(parts) == 0 {
		return "not read"
	}
	return strings.Join(parts, ", ")
}

// ---- carma's API writes --------------------------------------------------------------------------------

// mutating are the verbs apiserver_request_total gives writes.
var mutating = map[string]bool{"POST": true, "PUT": true, "PATCH": true, "DELETE": true, "APPLY": true}

// carmaWrite says whether a write counted by apiserver_request_total is one of carma's components'
// (the metric has no user or client label, so it goes by resource): anything in carma's API group
// (GpuNode publications of the device plugins, here the hollow ones; TrainingTasks of the operator),
// Leases (the chart's kube-scheduler's leader election; kube-apiserver's own identity lease is among
// them too), Events (the chart's kube-scheduler's), pod Bindings (the extender's bind) and pod
// patches and updates (the device plugins' allocated marks; kube-scheduler's status patches) — but
// not pod creation or deletion, which is the workload's. Counted only while carma's scheduler is
// the one running.
func carmaWrite(l map[string]string) bool {
	if !mutating[l["verb"]] {
		return false
	}
	switch {
	case l["group"] == "carma.io":
		return true
	case l["resource"] == "leases" || l["resource"] == "events":
		return true
	case l["resource"] == "pods" && l["subresource"] == "binding":
		return true
	case l["resource"] == "pods" && (l["verb"] == "PATCH" || l["verb"] == "PUT" || l["verb"] == "APPLY"):
		return true
	}
	return false
}

// writesWindow is carma's writes between two scrapes of kube-apiserver.
type writesWindow struct {
	ok      bool
	seconds float64
	total   float64
	by      map[string]float64
}

func carmaWrites(before, after samples, seconds float64) writesWindow {
	w := writesWindow{ok: before != nil && after != nil, seconds: seconds, by: map[string]float64{}}
	count := func(ss samples) map[string]float64 {
		m := map[string]float64{}
		for _, s := range ss.matching("apiserver_request_total", nil) {
			if carmaWrite(s.labels) {
				k := requestKey{s.labels["verb"], s.labels["resource"], s.labels["subresource"]}.String()
				m[k] += s.value
			}
		}
		return m
	}
	b, a := count(before), count(after)
	for k, v := range a {
		if d := v - b[k]; d > 0 {
			w.by[k] = d
			w.total += d
		}
	}
	return w
}

func (w writesWindow) perSecond() float64 {
	if !w.ok || w.seconds <= 0 {
		return math.NaN()
	}
	return w.total / w.seconds
}

func (w writesWindow) String() string {
	if !w.ok {
		return "not measured"
	}
	type kv struct {
		k string
		v float64
	}
	var kvs []kv
	for k, v := range w.by {
		kvs = append(kvs, kv{k, v})
	}
	sort.Slice(kvs, func(i, j int) bool { return kvs[i].v > kvs[j].v || (kvs[i].v == kvs[j].v && kvs[i].k < kvs[j].k) })
	var parts []string
	for _, x := range kvs {
		parts = append(parts, fmt.Sprintf("%s %.1f/s", x.k, x.v/w.seconds))
	}
	return fmt.Sprintf("%.1f per second over %.0f s (%.0f writes: %s)", w.perSecond(), w.seconds, w.total, strings.Join(parts, ", "))
}

// ---- repeats -----------------------------------------------------------------------------------------

// spread is min / median / max of the finite values.
type spread struct {
	n                int
	min, median, max float64
}

func spreadOf(xs []float64) spread {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return spread{min: math.NaN(), median: math.NaN(), max: math.NaN()}
	}
	sort.Float64s(v)
	med := v[len(v)/2]
	if len(v)%2 == 0 {
		med = (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return spread{n: len(v), min: v[0], median: med, max: v[len(v)-1]}
}

func (s spread) fmt(format string) string {
	if s.n == 0 {
		return "not run"
	}
	return fmt.Sprintf(format+" / "+format+" / "+format, s.min, s.median, s.max)
}
