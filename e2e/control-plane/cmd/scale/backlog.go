package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The cost of carma's retry request on a full cluster (--backlog N): when every node fails a pod
// only by rules that telemetry or time can lift (here: not enough free memory on any GPU), the
// extender answers a retry request, and kube-scheduler puts the pod in its backoff queue (at most
// the chart's podMaxBackoffSeconds) instead of parking it for five minutes. So a waiting pod costs
// one scheduling cycle and one extender call per backoff period. The benchmark fills one pod per
// GPU with a reservation that leaves no GPU room for another, creates N more such pods, and reads
// over a window what the waiting costs: kube-scheduler's attempts by result, the extender's calls,
// the CPU of kube-scheduler, the extender and kube-apiserver, and carma's API writes.

const annGPUMemory = "carma.io/gpu-memory"

// backlogMiB leaves no GPU of cfg.gpuMiB room for a second pod: the memory test wants
// free − 512 MiB ≥ reservation + 2,048 MiB.
func (b *bench) backlogMiB() int64 { return b.cfg.gpuMiB*3/4 - 2560 }

func (b *bench) backlogPod(batch string, i int) *v1.Pod {
	p := b.pod(batch, i, true)
	p.Annotations[annGPUMemory] = fmt.Sprintf("%dMi", b.backlogMiB())
	return p
}

type backlogResult struct {
	ran, failed       bool
	waiting, full     int
	seconds           float64
	boundDuringWindow int
	attempts          map[string]float64
	chooseCalls       float64
	rejections        map[string]float64
	cpu               map[string]float64 // CPU seconds per second of the window
	writes            writesWindow
	backoffSeconds    string
}

// runBacklog fills the cluster, lets b.cfg.backlog pods wait for b.cfg.backlogWindow, and measures.
func (b *bench) runBacklog(ctx context.Context) backlogResult {
	r := backlogResult{ran: true}
	fmt.Printf("\n=== phase backlog: %d pods waiting on a full cluster\n", b.cfg.backlog)
	if err := b.ctlRun("start-carma"); err != nil {
		fmt.Printf("  FAIL starting the carma scheduler: %v\n", err)
		r.failed = true
		return r
	}
	defer func() {
		if err := b.ctlRun("stop-carma"); err != nil {
			fmt.Printf("  stopping the carma scheduler: %v\n", err)
		}
	}()
	r.backoffSeconds = b.podMaxBackoff(ctx)
	fill := b.runBatch(ctx, "backlog-fill", b.cfg.nodes*b.cfg.gpus, b.backlogPod, 0)
	r.full = fill.bound
	fmt.Printf("  filled: %d of %d GPUs hold a %d MiB pod (%.1f pods/s)\n", fill.bound, fill.want, b.backlogMiB(), fill.throughput())
	if fill.bound < fill.want {
		r.failed = true
	}
	// Let the fill's binds and warm-up settle, so the window sees only the waiting pods.
	time.Sleep(10 * time.Second)
	schedPID, _ := pidOf(b.cfg.work, b.cfg.carmaPidFile)
	extPID, _ := pidOf(b.cfg.work, b.cfg.extenderPidFile)
	procs := b.cpuProcs(schedPID, extPID)
	r.waiting = b.createOnly(ctx, "backlog-wait", b.cfg.backlog, b.backlogPod)
	// The window starts 15 s after the last waiting pod exists, once each has had its first try
	// (the first refusal writes its condition and its first Event, which waiting then does not).
	time.Sleep(15 * time.Second)
	s0, e0 := scrape(ctx, b.metricsC, b.cfg.carmaURL+"/metrics")
	x0, f0 := scrape(ctx, http.DefaultClient, b.cfg.extenderURL+"/metrics")
	a0, g0 := b.apiScrape(ctx)
	c0, t0 := procs.now(), time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(b.cfg.backlogWindow):
	}
	s1, e1 := scrape(ctx, b.metricsC, b.cfg.carmaURL+"/metrics")
	x1, f1 := scrape(ctx, http.DefaultClient, b.cfg.extenderURL+"/metrics")
	a1, g1 := b.apiScrape(ctx)
	c1 := procs.now()
	r.seconds = time.Since(t0).Seconds()
	if err := firstErr(e0, e1, f0, f1, g0, g1); err != nil {
		fmt.Printf("  FAIL metrics: %v\n", err)
		r.failed = true
	} else {
		prof := map[string]string{"profile": b.cfg.carmaScheduler}
		r.attempts = map[string]float64{}
		bb := s0.by("scheduler_schedule_attempts_total", prof, "result")
		for k, v := range s1.by("scheduler_schedule_attempts_total", prof, "result") {
			r.attempts[k] = v - bb[k]
		}
		v := map[string]string{"verb": "choose"}
		r.chooseCalls = x1.histogram("carma_extender_request_duration_seconds", v).count - x0.histogram("carma_extender_request_duration_seconds", v).count
		r.rejections = map[string]float64{}
		rb := x0.by("carma_extender_rejections_total", nil, "reason")
		for k, v := range x1.by("carma_extender_rejections_total", nil, "reason") {
			if d := v - rb[k]; d > 0 {
				r.rejections[k] = d
			}
		}
		r.writes = carmaWrites(a0, a1, r.seconds)
	}
	r.cpu = map[string]float64{}
	for k, v := range c1 {
		if bf, ok := c0[k]; ok {
			r.cpu[k] = (v - bf) / r.seconds
		}
	}
	_, r.boundDuringWindow = b.counts("backlog-wait")
	b.deleteBatch(ctx, "backlog-wait")
	b.deleteBatch(ctx, "backlog-fill")
	fmt.Printf("  %s\n", r.line())
	return r
}

// createOnly creates n pods of batch, createWorkers at a time, and returns how many the informer
// saw within 30 s (none of them is expected to bind).
func (b *bench) createOnly(ctx context.Context, batch string, n int, mk func(string, int) *v1.Pod) int {
	g := new(errgroup.Group)
	g.SetLimit(b.cfg.createWorkers)
	for i := 0; i < n; i++ {
		g.Go(func() error {
			_, err := b.kube.CoreV1().Pods(benchNS).Create(ctx, mk(batch, i), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		fmt.Printf("    create %s: %v\n", batch, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		created, _ := b.counts(batch)
		if created >= n || time.Now().After(deadline) {
			return created
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// podMaxBackoff reads podMaxBackoffSeconds from the carma kube-scheduler's /configz.
func (b *bench) podMaxBackoff(ctx context.Context) string {
	raw, err := b.configz(ctx, b.cfg.carmaURL)
	if err != nil {
		return "not read"
	}
	var cz struct {
		ComponentConfig struct {
			PodMaxBackoffSeconds *int64 `json:"podMaxBackoffSeconds"`
		} `json:"componentconfig"`
	}
	if json.Unmarshal(raw, &cz) != nil || cz.ComponentConfig.PodMaxBackoffSeconds == nil {
		return "not read"
	}
	return fmt.Sprintf("%d s", *cz.ComponentConfig.PodMaxBackoffSeconds)
}

func (r backlogResult) line() string {
	if !r.ran {
		return "retry backlog: not run"
	}
	att := []string{}
	total := 0.0
	for k, v := range r.attempts {
		att = append(att, fmt.Sprintf("%s %.0f", k, v))
		total += v
	}
	sort.Strings(att)
	rej := []string{}
	for k, v := range r.rejections {
		rej = append(rej, fmt.Sprintf("%s %.0f", k, v))
	}
	sort.Strings(rej)
	perPod := 0.0
	if r.waiting > 0 && r.seconds > 0 {
		perPod = total / float64(r.waiting) / r.seconds * 60
	}
	cpu := []string{}
	for _, k := range []string{"kube-scheduler", "extender", "kube-apiserver", "etcd"} {
		if v, ok := r.cpu[k]; ok {
			cpu = append(cpu, fmt.Sprintf("%s %.3f", k, v))
		}
	}
	return fmt.Sprintf("retry backlog: %d pods waiting on %d full GPUs for %.0f s (podMaxBackoffSeconds %s): %.1f scheduling attempts/s (%.1f per waiting pod a minute; %s), "+
		"%.1f extender calls/s, %d bound; CPU seconds per second: %s; carma's API writes %s; extender rejections %s",
		r.waiting, r.full, r.seconds, r.backoffSeconds, total/r.seconds, perPod, strings.Join(att, ", "),
		r.chooseCalls/r.seconds, r.boundDuringWindow, strings.Join(cpu, ", "), r.writes, strings.Join(rej, ", "))
}
