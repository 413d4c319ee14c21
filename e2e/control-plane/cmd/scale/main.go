// Command scale is carma's scheduling benchmark on the real control plane that scale.sh starts
// (etcd, kube-apiserver, kube-scheduler built from their Go modules; the chart's kube-scheduler
// profile and extender run from the rendered pod specs). On N hollow nodes (hollow.go), each first
// given --filler-per-node other pods bound at creation (a busy, shared cluster), it runs the same
// pods in two phases, one scheduler at a time, carma first, --repeats times alternating:
//
//  1. carma: the chart's profile and extender (mutual TLS), pods asking for carma.io/gpu: 1 with a
//     carma.io/model-profile, GPUs shared under the chart's default policy; the first run begins
//     with a quiet window in which carma's API writes at rest are counted;
//  2. kube-scheduler alone: a second kube-scheduler with the default profile (schedulerName
//     default-scheduler), pods asking for nvidia.com/gpu: 1;
//
// both kube-schedulers with the same client rate limit (scale.sh's --client-qps, read back from each
// one's /configz, and their waits in it from rest_client_rate_limiter_duration_seconds), each as a
// saturated batch (P pods created as fast as the API takes them: pods/s from the first creation to
// the last bind) and a paced latency batch at one rate for every run (half of carma's first saturated
// rate unless --latency-rate; creation → bind p50 and p99), with optional churn (rounds of P pods
// created and deleted, the extender's RSS after each). Times are taken at this program's pod
// informer. After each batch the over-commit checker (internal/overcommit) judges every bound pod.
// It reads kube-scheduler's /metrics, kube-apiserver's apiserver_request_total (less this program's
// own requests, counted as the server labels them; and carma's writes by resource), the extender's
// /metrics, and the RSS and CPU time of the schedulers, the extender, kube-apiserver and etcd from
// /proc around each batch. Every figure printed is read from the cluster or the processes; a phase
// that did not run prints "not run".
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/carma/e2e/control-plane/internal/overcommit"
	"github.com/carma/e2e/control-plane/internal/release"
)

var gnGVR = schema.GroupVersionResource{Group: "carma.io", Version: "v1alpha1", Resource: "gpunodes"}

const (
	benchNS    = "scale"
	labelBatch = "scale.carma.io/batch"
	plainName  = "default-scheduler"
)

type config struct {
	kubeconfig       string
	work             string
	ctl              string
	examples         string
	nodes, gpus      int
	replicas         int
	gpuMiB           int64
	pods             int
	latencyPods      int
	latencyRate      float64
	churn            int
	phases           string
	publishCost      int
	carmaScheduler   string
	plainURL         string
	carmaURL         string
	extenderURL      string
	stall            time.Duration
	heartbeat        time.Duration
	createWorkers    int
	minLatencyPods   int
	plainPidFile     string
	carmaPidFile     string
	extenderPidFile  string
	apiserverPidFile string
	etcdPidFile      string
	kcmPidFile       string
	plantDRA         bool
	backlog          int
	backlogWindow    time.Duration
	fillerPerNode    int
	fillerNote       string
	repeats          int
	quiet            time.Duration
}

type podTimes struct {
	batch   string
	uid     string
	created time.Time
	bound   time.Time
	node    string
	gone    bool
}

type bench struct {
	cfg  config
	rest *rest.Config
	kube kubernetes.Interface
	dyn  dynamic.Interface
	// Clients with connections of their own (ownConnection): the pod informer, the hollow
	// kubelets' allocated marks, the hollow device plugins' GpuNode publications.
	watchKube kubernetes.Interface
	markKube  kubernetes.Interface
	pubDyn    dynamic.Interface
	// gnWatchDyn: the GpuNode watch that times each published change (publicationWatch).
	gnWatchDyn dynamic.Interface
	own        *counter
	metricsC   *http.Client
	h          *hollow
	profiles   []string

	mu   sync.Mutex
	pods map[string]*podTimes // by name
}

// kubeletVersion is the version the hollow nodes report: the Kubernetes release go.mod pins
// (internal/release).
var kubeletVersion string

func main() {
	var c config
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "admin kubeconfig")
	flag.StringVar(&c.work, "work", "", "scale.sh's work directory (pid files under pids/)")
	flag.StringVar(&c.ctl, "ctl", "", "command that starts and stops the schedulers (scale.sh ctl)")
	flag.StringVar(&c.examples, "examples", "", "deploy/examples (model profiles of the carma pods)")
	flag.IntVar(&c.nodes, "nodes", 100, "hollow nodes")
	flag.IntVar(&c.gpus, "gpus-per-node", 8, "GPUs per node")
	flag.IntVar(&c.replicas, "replicas", 8, "carma.io/gpu replicas per GPU (the chart's devicePlugin.replicasPerGpu)")
	flag.Int64Var(&c.gpuMiB, "gpu-mib", 81920, "memory per GPU (MiB)")
	flag.IntVar(&c.pods, "pods", 200, "pods per saturated batch (at most nodes × GPUs: phase 1 takes whole GPUs)")
	flag.IntVar(&c.latencyPods, "latency-pods", 0, "pods of the half-rate batch (default: pods/2, at least 100)")
	flag.Float64Var(&c.latencyRate, "latency-rate", 0, "offered rate of the latency batch in both phases (pods/s; default: half of the phase's saturated rate)")
	flag.IntVar(&c.churn, "churn", 0, "churn rounds after the carma batches: each creates and deletes pods")
	flag.StringVar(&c.phases, "phases", "plain,carma", "phases to run: plain (kube-scheduler alone), carma, and on the DRA path dra-carma, dra-whole, dra-tainted")
	flag.StringVar(&c.carmaScheduler, "carma-scheduler", "carma-scheduler", "the chart's scheduler profile name")
	flag.StringVar(&c.plainURL, "plain-scheduler-url", "", "the plain kube-scheduler's secure port (https://127.0.0.1:PORT)")
	flag.StringVar(&c.carmaURL, "carma-scheduler-url", "", "the chart's kube-scheduler's secure port (https://127.0.0.1:PORT)")
	flag.StringVar(&c.extenderURL, "extender-metrics-url", "", "the extender's metrics listener (http://127.0.0.1:PORT)")
	flag.DurationVar(&c.stall, "stall", 90*time.Second, "give up on a batch after this long without a bind")
	flag.DurationVar(&c.heartbeat, "heartbeat", 5*time.Minute, "GpuNode re-publication interval at rest (the device plugin's heartbeat, --publish-heartbeat)")
	flag.IntVar(&c.createWorkers, "create-workers", 64, "concurrent pod creations in a saturated batch")
	flag.StringVar(&c.plainPidFile, "plain-pid", "default-scheduler", "pid file (under work/pids) of the plain kube-scheduler")
	flag.StringVar(&c.carmaPidFile, "carma-scheduler-pid", "carma-scheduler-0", "pid file of the chart's kube-scheduler")
	flag.StringVar(&c.extenderPidFile, "extender-pid", "carma-scheduler-extender-0", "pid file of the extender")
	flag.StringVar(&c.apiserverPidFile, "apiserver-pid", "apiserver", "pid file of kube-apiserver")
	flag.StringVar(&c.etcdPidFile, "etcd-pid", "etcd", "pid file of etcd")
	flag.BoolVar(&c.plantDRA, "plant-dra-overcommit", false, "planted fault: a claim past the allocator over-commits a device in the first dra-carma run (the run must fail)")
	flag.IntVar(&c.publishCost, "publish-cost", 0, "before the phases: write this many GpuNode status publications by merge patch, by update and in the lean experiment, and print kube-apiserver's CPU per write (0: not run)")
	flag.IntVar(&c.backlog, "backlog", 0, "after the phases: fill every GPU, let this many more carma pods wait, and measure what their retries cost (0: not run)")
	flag.DurationVar(&c.backlogWindow, "backlog-window", 60*time.Second, "how long the backlog's waiting pods are watched")
	flag.StringVar(&c.kcmPidFile, "kcm-pid", "controller-manager", "pid file of kube-controller-manager (the DRA phases' resourceclaim controller)")
	flag.IntVar(&c.fillerPerNode, "filler-per-node", 10, "other (non-GPU) pods bound to every hollow node before the batches, as in a shared cluster")
	flag.StringVar(&c.fillerNote, "filler-note", "", "a note printed beside the filler count (e.g. why it is smaller than the default)")
	flag.IntVar(&c.repeats, "repeats", 1, "run each phase this many times (alternating), and print min / median / max")
	flag.DurationVar(&c.quiet, "quiet", 60*time.Second, "quiet window before the first carma batch in which carma's API writes at rest are counted (0: not measured)")
	flag.Parse()
	if c.repeats < 1 {
		c.repeats = 1
	}
	if c.latencyPods == 0 {
		c.latencyPods = max(c.pods/2, 100)
	}
	if c.pods > c.nodes*c.gpus || c.latencyPods > c.nodes*c.gpus {
		fatal("--pods %d / --latency-pods %d: at most nodes × GPUs (%d): phase 1 takes whole GPUs", c.pods, c.latencyPods, c.nodes*c.gpus)
	}

	var err error
	if kubeletVersion, err = release.KubeletVersion(); err != nil {
		fatal("kubelet version: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		fatal("kubeconfig: %v", err)
	}
	metricsCfg := rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 5000, 10000
	b := &bench{cfg: c, rest: cfg, own: &counter{n: map[requestKey]int64{}}, pods: map[string]*podTimes{}}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingRT{b.own, rt} })
	b.kube = kubernetes.NewForConfigOrDie(cfg)
	b.dyn = dynamic.NewForConfigOrDie(cfg)
	// The pod watch, the hollow kubelets' marks and their GpuNode publications each get a connection
	// of their own, so that none waits behind a batch's pod creations on a shared one.
	b.watchKube = kubernetes.NewForConfigOrDie(ownConnection(cfg))
	b.markKube = kubernetes.NewForConfigOrDie(ownConnection(cfg))
	b.pubDyn = dynamic.NewForConfigOrDie(ownConnection(cfg))
	b.gnWatchDyn = dynamic.NewForConfigOrDie(ownConnection(cfg))
	// kube-scheduler's /metrics: the admin's client certificate (delegated authentication and
	// authorization through the API server), its self-signed serving certificate not verified.
	metricsCfg.TLSClientConfig.Insecure = true
	metricsCfg.TLSClientConfig.CAFile, metricsCfg.TLSClientConfig.CAData = "", nil
	tlsCfg, err := rest.TLSConfigFor(metricsCfg)
	if err != nil {
		fatal("TLS config: %v", err)
	}
	b.metricsC = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	if tlsCfg == nil {
		b.metricsC.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // self-signed
	}
	b.profiles = loadProfiles(c.examples)
	b.h = &hollow{b: b, totalMiB: c.gpuMiB, replicas: c.replicas, heartbeat: c.heartbeat}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t0 := time.Now()
	ensureNamespace(ctx, b.kube, benchNS)
	fmt.Printf("creating %d hollow nodes × %d GPUs (Node + GpuNode each)\n", c.nodes, c.gpus)
	if err := b.h.createNodes(ctx, c.nodes, c.gpus); err != nil {
		fatal("hollow nodes: %v", err)
	}
	fmt.Printf("  %d nodes in %.1f s\n", c.nodes, time.Since(t0).Seconds())
	if c.publishCost > 0 {
		b.publishCost(ctx, c.publishCost)
	}
	b.watchPublications(ctx)
	b.h.run(ctx)
	b.startInformer(ctx)
	t1 := time.Now()
	if c.fillerPerNode > 0 {
		fmt.Printf("creating %d other pods on each hollow node (bound at creation, not GPU pods)%s\n", c.fillerPerNode, c.fillerNote)
	}
	filler, err := b.createFiller(ctx, c.nodes, c.fillerPerNode)
	if err != nil {
		fatal("other pods: %v", err)
	}
	fmt.Printf("  the API server lists %d other pods bound to nodes (%.1f s)\n", filler, time.Since(t1).Seconds())

	want := map[string]bool{}
	for _, p := range strings.Split(c.phases, ",") {
		want[strings.TrimSpace(p)] = true
	}
	anyDRA := false
	for _, m := range draModes {
		anyDRA = anyDRA || want[m.name]
	}
	delete(want, "none")
	for p := range want {
		if p != "plain" && p != "carma" && !slices.ContainsFunc(draModes, func(m draMode) bool { return m.name == p }) {
			fatal("--phases: unknown phase %q (plain, carma, dra-carma, dra-whole, dra-tainted)", p)
		}
	}
	if anyDRA {
		t := time.Now()
		if err := b.setupDRA(ctx); err != nil {
			fatal("DRA setup: %v", err)
		}
		inv, err := b.draInventory(ctx)
		if err != nil {
			fatal("DRA setup: %v", err)
		}
		fmt.Printf("  DRA: DeviceClasses %s and %s; the API server lists %s (%.1f s)\n",
			draCarmaClass, draWholeClass, inv, time.Since(t).Seconds())
	}
	var plains, carmas []phaseResult
	var dras []draResult
	failed := false
	latencyRate := c.latencyRate
	draLatencyRate := c.latencyRate
	// carma first in each run: its first saturated rate sets the latency batches' offered rate (half of
	// it, unless --latency-rate), which both sides then get. With both clients unthrottled carma is the
	// slower scheduler, and half of kube-scheduler's own rate would offer carma more than it sustains.
	for rep := 1; rep <= c.repeats; rep++ {
		if want["carma"] {
			r := b.runPhase(ctx, true, rep, &latencyRate, rep == 1 && c.quiet > 0)
			carmas = append(carmas, r)
			failed = failed || r.failed
		}
		if want["plain"] {
			r := b.runPhase(ctx, false, rep, &latencyRate, false)
			plains = append(plains, r)
			failed = failed || r.failed
		}
		for _, m := range draModes {
			if want[m.name] {
				r := b.runDRAPhase(ctx, m, rep, &draLatencyRate)
				dras = append(dras, r)
				failed = failed || r.failed
			}
		}
	}
	var backlog backlogResult
	if c.backlog > 0 {
		backlog = b.runBacklog(ctx)
		failed = failed || backlog.failed
	}
	nodes, gpus := b.clusterShape(ctx)
	if filler, err = b.countFiller(ctx); err != nil {
		fmt.Printf("  other pods could not be counted: %v\n", err)
		filler = -1
		failed = true
	}
	fmt.Println()
	for _, r := range plains {
		r.report(runTitle("kube-scheduler alone", r.rep, c.repeats), false)
	}
	if len(plains) == 0 && want["carma"] {
		phaseResult{}.report("kube-scheduler alone", false)
	}
	for _, r := range carmas {
		r.report(runTitle("with carma", r.rep, c.repeats), true)
	}
	if len(carmas) == 0 && want["plain"] {
		phaseResult{}.report("with carma", true)
	}
	fmt.Println()
	if want["plain"] || want["carma"] {
		s := summarize(plains, carmas)
		fmt.Println(s.line(nodes, gpus, latencyRate, filler))
		for _, l := range s.details(nodes, c.repeats) {
			fmt.Println(l)
		}
	}
	if backlog.ran {
		fmt.Println(backlog.line())
	}
	if anyDRA {
		for _, l := range draLines(nodes, gpus, dras, draLatencyRate) {
			fmt.Println(l)
		}
	}
	if failed {
		os.Exit(1)
	}
}

func lastErr(v *atomic.Value) string {
	if s, ok := v.Load().(string); ok && s != "" {
		return ", the last: " + s
	}
	return ""
}

func runTitle(title string, rep, repeats int) string {
	if repeats <= 1 {
		return title
	}
	return fmt.Sprintf("%s, run %d of %d", title, rep, repeats)
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "scale: "+format+"\n", args...)
	os.Exit(1)
}

// ownConnection copies cfg with a dialer of its own: client-go shares one transport, and so one
// HTTP/2 connection, between configs that are alike, and a config with its own Dial gets its own.
func ownConnection(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	c.Dial = d.DialContext
	return c
}

func ensureNamespace(ctx context.Context, kube kubernetes.Interface, ns string) {
	_, _ = kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	_, _ = kube.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
}

// loadProfiles reads the model profiles of deploy/examples: spec.modelProfile of each TrainingTask
// and the carma.io/model-profile annotation of each pod, as compact JSON.
func loadProfiles(dir string) []string {
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	var out []string
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, doc := range strings.Split(string(raw), "\n---") {
			var obj map[string]any
			if yaml.Unmarshal([]byte(doc), &obj) != nil || obj == nil {
				continue
			}
			var prof any
			switch obj["kind"] {
			case "TrainingTask":
				if spec, ok := obj["spec"].(map[string]any); ok {
					prof = spec["modelProfile"]
				}
			case "Pod":
				if md, ok := obj["metadata"].(map[string]any); ok {
					if ann, ok := md["annotations"].(map[string]any); ok {
						if s, ok := ann[annProfile].(string); ok {
							var m any
							if json.Unmarshal([]byte(s), &m) == nil {
								prof = m
							}
						}
					}
				}
			}
			if prof == nil {
				continue
			}
			j, err := json.Marshal(prof)
			if err == nil {
				out = append(out, string(j))
			}
		}
	}
	sort.Strings(out)
	if len(out) == 0 {
		fatal("no model profiles in %s", dir)
	}
	return out
}

// ---- the pod informer: creation and bind times -------------------------------------------------------

func (b *bench) startInformer(ctx context.Context) {
	factory := informers.NewSharedInformerFactoryWithOptions(b.watchKube, 0, informers.WithNamespace(benchNS))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { b.sawPod(o) },
		UpdateFunc: func(_, o any) { b.sawPod(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			p, ok := o.(*v1.Pod)
			if !ok {
				return
			}
			b.mu.Lock()
			if t := b.pods[p.Name]; t != nil && t.uid == string(p.UID) {
				t.gone = true
			}
			b.mu.Unlock()
			b.h.gonePod(string(p.UID))
		},
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		fatal("pod informer did not sync")
	}
}

func (b *bench) sawPod(o any) {
	p, ok := o.(*v1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	b.mu.Lock()
	t := b.pods[p.Name]
	if t == nil || t.uid != string(p.UID) {
		t = &podTimes{batch: p.Labels[labelBatch], uid: string(p.UID), created: now}
		b.pods[p.Name] = t
	}
	if t.bound.IsZero() && p.Spec.NodeName != "" {
		t.bound, t.node = now, p.Spec.NodeName
	}
	bound := t.bound
	b.mu.Unlock()
	b.h.sawPod(p, bound)
}

// ---- batches -----------------------------------------------------------------------------------------

type batchResult struct {
	name       string
	ran        bool
	want       int
	created    int
	bound      int
	createErrs int
	rate       float64 // offered creation rate (pods/s); 0: as fast as possible
	first      time.Time
	last       time.Time
	lastSeen   time.Time // the last creation the informer saw
	lat        []float64 // creation → bind (ms), sorted
}

// creationShare is the share of the batch's span (first creation → last bind) that creating its pods
// took: near 100 % the scheduler kept up with creation, and the rate is at least its throughput.
func (r batchResult) creationShare() float64 {
	d := r.last.Sub(r.first).Seconds()
	if d <= 0 || r.lastSeen.IsZero() {
		return math.NaN()
	}
	return 100 * r.lastSeen.Sub(r.first).Seconds() / d
}

func (r batchResult) throughput() float64 {
	d := r.last.Sub(r.first).Seconds()
	if r.bound == 0 || d <= 0 {
		return 0
	}
	return float64(r.bound) / d
}

func (b *bench) pod(batch string, i int, carma bool) *v1.Pod {
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%06d", batch, i), Namespace: benchNS,
			Labels: map[string]string{labelBatch: batch}},
		Spec: v1.PodSpec{
			RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{Name: "train", Image: "example.com/train:1",
				Resources: v1.ResourceRequirements{
					Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m"), v1.ResourceMemory: resource.MustParse("256Mi")},
				}}},
		},
	}
	one := *resource.NewQuantity(1, resource.DecimalSI)
	if carma {
		p.Spec.SchedulerName = b.cfg.carmaScheduler
		p.Annotations = map[string]string{annProfile: b.profiles[i%len(b.profiles)]}
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{overcommit.GPUResource: one}
	} else {
		p.Spec.SchedulerName = plainName
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{resGPUNvidia: one}
	}
	return p
}

// devicePod makes the pods of a device-plugin phase: carma.io/gpu with carma, else nvidia.com/gpu.
func (b *bench) devicePod(carma bool) func(string, int) *v1.Pod {
	return func(batch string, i int) *v1.Pod { return b.pod(batch, i, carma) }
}

// runBatch creates n pods of batch (made by mk) (as fast as possible when rate is 0, else paced at rate pods/s)
// and waits until every created pod is bound or none was bound for cfg.stall.
func (b *bench) runBatch(ctx context.Context, batch string, n int, mk func(batch string, i int) *v1.Pod, rate float64) batchResult {
	r := batchResult{name: batch, ran: true, want: n, rate: rate}
	var errs atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, b.cfg.createWorkers)
	start := time.Now()
	create := func(i int) {
		defer wg.Done()
		defer func() { <-sem }()
		if _, err := b.kube.CoreV1().Pods(benchNS).Create(ctx, mk(batch, i), metav1.CreateOptions{}); err != nil {
			if errs.Add(1) <= 3 {
				fmt.Printf("    create %s-%06d: %v\n", batch, i, err)
			}
		}
	}
	for i := 0; i < n; i++ {
		if rate > 0 {
			if d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second)))); d > 0 {
				time.Sleep(d)
			}
		}
		sem <- struct{}{}
		wg.Add(1)
		go create(i)
	}
	wg.Wait()
	r.createErrs = int(errs.Load())
	lastBound, lastCount := time.Now(), -1
	for {
		created, bound := b.counts(batch)
		if bound != lastCount {
			lastBound, lastCount = time.Now(), bound
		}
		if created >= n-r.createErrs && bound >= created {
			break
		}
		if time.Since(lastBound) > b.cfg.stall || ctx.Err() != nil {
			fmt.Printf("    %s: %d of %d pods bound; none for %s, giving up\n", batch, bound, created, b.cfg.stall)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.mu.Lock()
	for _, t := range b.pods {
		if t.batch != batch {
			continue
		}
		r.created++
		if r.first.IsZero() || t.created.Before(r.first) {
			r.first = t.created
		}
		if t.created.After(r.lastSeen) {
			r.lastSeen = t.created
		}
		if !t.bound.IsZero() {
			r.bound++
			if t.bound.After(r.last) {
				r.last = t.bound
			}
			r.lat = append(r.lat, float64(t.bound.Sub(t.created).Microseconds())/1000)
		}
	}
	b.mu.Unlock()
	sort.Float64s(r.lat)
	return r
}

func (b *bench) counts(batch string) (created, bound int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.pods {
		if t.batch == batch {
			created++
			if !t.bound.IsZero() {
				bound++
			}
		}
	}
	return
}

// deleteBatch deletes the batch's pods at once (grace period 0: no kubelet confirms a deletion here)
// and waits until the informer saw them go.
func (b *bench) deleteBatch(ctx context.Context, batch string) {
	zero := int64(0)
	err := b.kube.CoreV1().Pods(benchNS).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero},
		metav1.ListOptions{LabelSelector: labelBatch + "=" + batch})
	if err != nil {
		fmt.Printf("    delete %s: %v\n", batch, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		left := 0
		b.mu.Lock()
		for name, t := range b.pods {
			if t.batch == batch {
				if t.gone {
					delete(b.pods, name)
				} else {
					left++
				}
			}
		}
		b.mu.Unlock()
		if left == 0 {
			b.awaitPublications(ctx, batch)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("    %s: pods still listed 3 min after their deletion\n", batch)
}

// awaitPublications waits until the hollow device plugins have published every change of their pods
// (at each node's next sample). After a deletion those GpuNode writes are the aftermath of the batch
// just measured, and the next batch must not start among them; after a batch, its own last changes
// are then timed (publicationWatch) before the deletion's begin. kube-scheduler alone leaves no such writes
// (the hollow nodes publish carma pods only), so without the wait only carma's next batch would share
// the API server with up to one write per node in its first second.
func (b *bench) awaitPublications(ctx context.Context, batch string) {
	deadline := time.Now().Add(30 * time.Second)
	for b.h.unpublished() > 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			fmt.Printf("    %s: %d publications of changed nodes still to come 30 s after the batch\n", batch, b.h.unpublished())
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---- over-commit ---------------------------------------------------------------------------------------

// checkCarma runs the over-commit checker on every bound carma pod and every GpuNode.
func (b *bench) checkCarma(ctx context.Context) ([]string, error) {
	list, err := b.dyn.Resource(gnGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	gpus, replicas := overcommit.GPUsOf(list.Items)
	pods, err := b.kube.CoreV1().Pods(benchNS).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.schedulerName", b.cfg.carmaScheduler).String()})
	if err != nil {
		return nil, err
	}
	return findingStrings(overcommit.Findings(pods.Items, gpus, b.cfg.carmaScheduler, replicas)), nil
}

// findingStrings is each finding as the run prints it.
func findingStrings(fs []overcommit.Finding) []string {
	out := make([]string, 0, len(fs))
	for _, f := range fs {
		out = append(out, f.String())
	}
	return out
}

// checkPlain: no node holds more nvidia.com/gpu than it has (bound, live pods).
func (b *bench) checkPlain(ctx context.Context) ([]string, error) {
	nodes, err := b.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pods, err := b.kube.CoreV1().Pods(benchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	used := map[string]int64{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" || overcommit.Terminated(p) {
			continue
		}
		for _, c := range p.Spec.Containers {
			q := c.Resources.Limits[resGPUNvidia]
			used[p.Spec.NodeName] += q.Value()
		}
	}
	var out []string
	for _, n := range nodes.Items {
		q := n.Status.Allocatable[resGPUNvidia]
		if used[n.Name] > q.Value() {
			out = append(out, fmt.Sprintf("over-allocated %s: %d %s on %d", n.Name, used[n.Name], resGPUNvidia, q.Value()))
		}
	}
	return out, nil
}

// ---- phases --------------------------------------------------------------------------------------------

type procFigures struct {
	ok                        bool
	rssStart, rssPeak, rssEnd float64
	cpuS                      float64
}

type phaseResult struct {
	ran, failed   bool
	rep           int
	limiter       limiterFigures
	cpuSat        map[string]float64 // CPU seconds per 1,000 pods bound, by process
	cpuHalf       map[string]float64
	writesRest    writesWindow // carma's API writes in the quiet window (first carma run)
	writesLoad    writesWindow // carma's API writes over the saturated batch (carma runs)
	sat, half     batchResult
	churn         []churnRound
	findings      []string
	checks        int
	checkErrs     int
	pods          int // pods bound over every batch of the phase
	apiPerPod     float64
	schedPerPod   float64
	breakdown     []string
	attempts      map[string]float64
	algo, attempt hist
	points        map[string]hist // kube-scheduler's in-tree extension points (Filter, Score, ...)
	extVerbs      map[string]hist
	extBinds      map[string]float64
	extRejections map[string]float64
	ext, sched    procFigures
	marks         []float64
	// ms from a change of a node's pods to a GpuNode watch seeing it published, in each batch
	pubSat, pubHalf []float64
	marked          int64
	markErrs        int64
	published       int64
	seconds         float64
	machine         string
}

type churnRound struct {
	res    batchResult
	rssMiB float64
}

func (b *bench) ctlRun(args ...string) error {
	parts := append(strings.Fields(b.cfg.ctl), args...)
	cmd := exec.Command("bash", parts...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	return cmd.Run()
}

type snapshot struct {
	api   samples
	own   map[requestKey]int64
	sched samples
	ext   samples
}

func (b *bench) snap(ctx context.Context, schedURL string, carma bool) (snapshot, error) {
	s := snapshot{own: b.own.snapshot()}
	raw, err := b.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return s, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	if s.api, err = parseProm(strings.NewReader(string(raw))); err != nil {
		return s, err
	}
	if s.sched, err = scrape(ctx, b.metricsC, schedURL+"/metrics"); err != nil {
		return s, fmt.Errorf("kube-scheduler /metrics: %w", err)
	}
	if carma {
		if s.ext, err = scrape(ctx, http.DefaultClient, b.cfg.extenderURL+"/metrics"); err != nil {
			return s, fmt.Errorf("extender /metrics: %w", err)
		}
	}
	return s, nil
}

// apiScrape reads kube-apiserver's /metrics.
func (b *bench) apiScrape(ctx context.Context) (samples, error) {
	raw, err := b.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	return parseProm(strings.NewReader(string(raw)))
}

// runPhase runs one phase: the saturated batch, the latency batch at *latencyRate pods/s (when 0, half
// of this batch's saturated rate, which is then kept for every later latency batch, so that both
// phases are offered the same load), and for carma the churn rounds (in the last run); with quiet, a
// quiet window first in which carma's API writes at rest are counted.
func (b *bench) runPhase(ctx context.Context, carma bool, rep int, latencyRate *float64, quiet bool) phaseResult {
	r := phaseResult{ran: true, rep: rep}
	name, verb, schedURL, schedPid := "plain", "plain", b.cfg.plainURL, b.cfg.plainPidFile
	if carma {
		name, verb, schedURL, schedPid = "carma", "carma", b.cfg.carmaURL, b.cfg.carmaPidFile
	}
	fmt.Printf("\n=== phase %s (run %d of %d)\n", name, rep, b.cfg.repeats)
	if err := b.ctlRun("start-" + verb); err != nil {
		fmt.Printf("  FAIL starting the %s scheduler: %v\n", name, err)
		r.failed = true
		return r
	}
	defer func() {
		if err := b.ctlRun("stop-" + verb); err != nil {
			fmt.Printf("  stopping the %s scheduler: %v\n", name, err)
		}
	}()
	if qps, burst, err := b.clientLimits(ctx, schedURL); err != nil {
		fmt.Printf("  FAIL reading the client limits from kube-scheduler's /configz: %v\n", err)
		r.failed = true
	} else {
		r.limiter.qps, r.limiter.burst = qps, burst
		fmt.Printf("  kube-scheduler's client (its /configz): QPS %g, burst %d\n", qps, burst)
	}
	if quiet {
		fmt.Printf("  quiet window: %s with carma running and no pods to schedule\n", b.cfg.quiet)
		pub0, pubErr0 := b.h.published.Load(), b.h.publishErrs.Load()
		a0, err0 := b.apiScrape(ctx)
		t := time.Now()
		select {
		case <-ctx.Done():
		case <-time.After(b.cfg.quiet):
		}
		a1, err1 := b.apiScrape(ctx)
		if err0 != nil || err1 != nil {
			fmt.Printf("  FAIL metrics: %v %v\n", err0, err1)
			r.failed = true
		} else {
			r.writesRest = carmaWrites(a0, a1, time.Since(t).Seconds())
			fmt.Printf("  carma's API writes at rest: %s; the hollow device plugins published %d GpuNode statuses in it (%d failed%s)\n",
				r.writesRest, b.h.published.Load()-pub0, b.h.publishErrs.Load()-pubErr0, lastErr(&b.h.lastPubErr))
		}
	}
	t0 := time.Now()
	mw := watchMachine(5 * time.Second)
	proc := func(pidFile string) (int, float64, float64) {
		pid, err := pidOf(b.cfg.work, pidFile)
		if err != nil {
			return 0, 0, 0
		}
		rss, cpu, err := procStat(pid)
		if err != nil {
			return 0, 0, 0
		}
		return pid, rss, cpu
	}
	schedPID, sRSS, sCPU := proc(schedPid)
	var extPID int
	var eRSS, eCPU float64
	var sampler *rssSampler
	if carma {
		extPID, eRSS, eCPU = proc(b.cfg.extenderPidFile)
		if extPID > 0 {
			sampler = sampleRSS(extPID, 500*time.Millisecond)
		}
	}
	schedSampler := sampleRSS(max(schedPID, 1), time.Second)
	_ = b.h.markDelays()
	_ = b.h.seen.take()
	marked0, markErrs0, pub0 := b.h.marked.Load(), b.h.markErrs.Load(), b.h.published.Load()
	before, err := b.snap(ctx, schedURL, carma)
	if err != nil {
		fmt.Printf("  FAIL metrics: %v\n", err)
		r.failed = true
	}
	check := func() {
		var f []string
		var err error
		if carma {
			f, err = b.checkCarma(ctx)
		} else {
			f, err = b.checkPlain(ctx)
		}
		if err != nil {
			r.checkErrs++
			fmt.Printf("  over-commit check failed: %v\n", err)
			return
		}
		r.checks++
		for _, x := range f {
			fmt.Printf("  FINDING %s\n", x)
		}
		r.findings = append(r.findings, f...)
	}

	procs := b.cpuProcs(schedPID, extPID)
	a0, errA0 := b.apiScrape(ctx)
	c0, tSat := procs.now(), time.Now()
	r.sat = b.runBatch(ctx, name+"-sat", b.cfg.pods, b.devicePod(carma), 0)
	c1 := procs.now()
	a1, errA1 := b.apiScrape(ctx)
	if errA0 == nil && errA1 == nil {
		r.writesLoad = carmaWrites(a0, a1, time.Since(tSat).Seconds())
	}
	r.cpuSat = cpuPer1000(c0, c1, r.sat.bound)
	fmt.Printf("  saturated: %d of %d pods bound, %.1f pods/s (first creation → last bind %.1f s; creating them took %.0f %% of it)\n",
		r.sat.bound, r.sat.want, r.sat.throughput(), r.sat.last.Sub(r.sat.first).Seconds(), r.sat.creationShare())
	check()
	b.awaitPublications(ctx, name+"-sat")
	r.pubSat = b.h.seen.take()
	b.deleteBatch(ctx, name+"-sat")
	_ = b.h.seen.take() // the deletions' publications: not a batch's
	half := *latencyRate
	if half <= 0 {
		half = r.sat.throughput() / 2
		*latencyRate = half
	}
	if half > 0 {
		c0 := procs.now()
		r.half = b.runBatch(ctx, name+"-half", b.cfg.latencyPods, b.devicePod(carma), half)
		r.cpuHalf = cpuPer1000(c0, procs.now(), r.half.bound)
		fmt.Printf("  latency batch (%.1f pods/s offered): %d of %d bound, creation → bind p50 %.0f ms, p99 %.0f ms\n",
			half, r.half.bound, r.half.want, percentile(r.half.lat, 0.5), percentile(r.half.lat, 0.99))
		check()
		b.awaitPublications(ctx, name+"-half")
		r.pubHalf = b.h.seen.take()
		b.deleteBatch(ctx, name+"-half")
		_ = b.h.seen.take()
	}
	r.pods = r.sat.bound + r.half.bound
	if carma && rep == b.cfg.repeats {
		for i := 1; i <= b.cfg.churn; i++ {
			batch := fmt.Sprintf("carma-churn-%02d", i)
			res := b.runBatch(ctx, batch, b.cfg.pods, b.devicePod(true), 0)
			check()
			b.deleteBatch(ctx, batch)
			var rss float64
			if extPID > 0 {
				rss, _, _ = procStat(extPID)
			}
			r.churn = append(r.churn, churnRound{res: res, rssMiB: rss})
			r.pods += res.bound
			fmt.Printf("  churn %d/%d: %d of %d bound, %.1f pods/s; extender RSS %.0f MiB after deletion\n",
				i, b.cfg.churn, res.bound, res.want, res.throughput(), rss)
		}
	}
	after, err := b.snap(ctx, schedURL, carma)
	if err != nil {
		fmt.Printf("  FAIL metrics: %v\n", err)
		r.failed = true
	}
	r.seconds = time.Since(t0).Seconds()
	r.machine = mw.finish()
	{
		qps, burst := r.limiter.qps, r.limiter.burst
		r.limiter = limiterOf(before.sched, after.sched)
		r.limiter.qps, r.limiter.burst = qps, burst
		r.limiter.ok = r.limiter.ok && qps > 0
	}

	// API requests per scheduled pod: the server's count less this program's.
	apiB, apiA := apiRequests(before.api), apiRequests(after.api)
	per := map[requestKey]float64{}
	total := 0.0
	for k, v := range apiA {
		d := v - apiB[k] - float64(after.own[k]-before.own[k])
		per[k] = d
		total += d
	}
	for k, v := range after.own {
		if _, seen := apiA[k]; !seen {
			d := -float64(v - before.own[k])
			per[k] += d
			total += d
		}
	}
	if r.pods > 0 {
		r.apiPerPod = total / float64(r.pods)
		r.schedPerPod = (after.sched.sum("rest_client_requests_total", nil) - before.sched.sum("rest_client_requests_total", nil)) / float64(r.pods)
		type kv struct {
			k string
			v float64
		}
		var kvs []kv
		for k, v := range per {
			if math.Abs(v/float64(r.pods)) >= 0.005 {
				kvs = append(kvs, kv{k.String(), v / float64(r.pods)})
			}
		}
		sort.Slice(kvs, func(i, j int) bool { return math.Abs(kvs[i].v) > math.Abs(kvs[j].v) })
		for _, x := range kvs {
			r.breakdown = append(r.breakdown, fmt.Sprintf("%s %.2f", x.k, x.v))
		}
	}
	prof := map[string]string{}
	if carma {
		prof["profile"] = b.cfg.carmaScheduler
	} else {
		prof["profile"] = plainName
	}
	r.attempts = map[string]float64{}
	for k, v := range after.sched.by("scheduler_schedule_attempts_total", prof, "result") {
		r.attempts[k] = v - before.sched.by("scheduler_schedule_attempts_total", prof, "result")[k]
	}
	r.algo = after.sched.histogram("scheduler_scheduling_algorithm_duration_seconds", nil).minus(
		before.sched.histogram("scheduler_scheduling_algorithm_duration_seconds", nil))
	sched := map[string]string{"result": "scheduled", "profile": prof["profile"]}
	r.attempt = after.sched.histogram("scheduler_scheduling_attempt_duration_seconds", sched).minus(
		before.sched.histogram("scheduler_scheduling_attempt_duration_seconds", sched))
	r.points = map[string]hist{}
	for _, p := range extensionPoints {
		m := map[string]string{"extension_point": p, "profile": prof["profile"]}
		r.points[p] = after.sched.histogram("scheduler_framework_extension_point_duration_seconds", m).minus(
			before.sched.histogram("scheduler_framework_extension_point_duration_seconds", m))
	}
	if carma {
		r.extVerbs = map[string]hist{}
		for _, v := range []string{"filter", "choose", "prioritize", "bind"} {
			m := map[string]string{"verb": v}
			r.extVerbs[v] = after.ext.histogram("carma_extender_request_duration_seconds", m).minus(
				before.ext.histogram("carma_extender_request_duration_seconds", m))
		}
		r.extBinds = map[string]float64{}
		bb := before.ext.by("carma_extender_binds_total", nil, "result")
		for k, v := range after.ext.by("carma_extender_binds_total", nil, "result") {
			r.extBinds[k] = v - bb[k]
		}
		r.extRejections = map[string]float64{}
		rb := before.ext.by("carma_extender_rejections_total", nil, "reason")
		for k, v := range after.ext.by("carma_extender_rejections_total", nil, "reason") {
			if d := v - rb[k]; d > 0 {
				r.extRejections[k] = d
			}
		}
	}
	if extPID > 0 {
		peak, last, _ := sampler.finish()
		_, cpu, err := procStat(extPID)
		r.ext = procFigures{ok: err == nil, rssStart: eRSS, rssPeak: peak, rssEnd: last, cpuS: cpu - eCPU}
	}
	{
		peak, last, _ := schedSampler.finish()
		if schedPID > 0 {
			_, cpu, err := procStat(schedPID)
			r.sched = procFigures{ok: err == nil, rssStart: sRSS, rssPeak: peak, rssEnd: last, cpuS: cpu - sCPU}
		}
	}
	r.marks = b.h.markDelays()
	r.marked = b.h.marked.Load() - marked0
	r.markErrs = b.h.markErrs.Load() - markErrs0
	r.published = b.h.published.Load() - pub0
	if r.sat.bound < r.sat.want || (r.half.ran && r.half.bound < r.half.want) || len(r.findings) > 0 || r.checks == 0 {
		r.failed = true
	}
	for _, c := range r.churn {
		if c.res.bound < c.res.want {
			r.failed = true
		}
	}
	if carma && !r.ext.ok {
		fmt.Println("  FAIL the extender's process could not be read (did it die?)")
		r.failed = true
	}
	return r
}

// extensionPoints are the scheduling cycle's in-tree extension points kube-scheduler times per pod
// (scheduler_framework_extension_point_duration_seconds); the extender's filter and prioritize
// calls are outside them, inside scheduler_scheduling_algorithm_duration_seconds.
var extensionPoints = []string{"PreFilter", "Filter", "PreScore", "Score"}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(s float64) string {
	if math.IsNaN(s) {
		return "no samples"
	}
	return fmt.Sprintf("%.0f ms", s*1000)
}

// histQ prints a histogram's p50/p99, noting where the p99 is clipped at the highest finite bucket.
func histQ(h hist) string {
	if h.count <= 0 {
		return "no observations"
	}
	p99 := h.quantile(0.99)
	clip := ""
	if p99 >= h.highestFinite() {
		clip = "+ (above the highest bucket)"
	}
	return fmt.Sprintf("p50 %s, p99 %s%s (%d observations, mean %s)", ms(h.quantile(0.5)), ms(p99), clip,
		int64(h.count), ms(h.sum/h.count))
}

func (r phaseResult) report(title string, carma bool) {
	if !r.ran {
		fmt.Printf("%s: not run\n", title)
		return
	}
	fmt.Printf("%s (%.0f s):\n", title, r.seconds)
	fmt.Printf("  machine: %s\n", r.machine)
	fmt.Printf("  saturated: %d of %d pods bound, %.1f pods/s (creating them took %.0f %% of the batch's span)\n", r.sat.bound, r.sat.want, r.sat.throughput(), r.sat.creationShare())
	if r.half.ran {
		fmt.Printf("  latency batch: %.1f pods/s offered, %d of %d bound, creation → bind p50 %.0f ms, p99 %.0f ms, max %.0f ms\n",
			r.half.rate, r.half.bound, r.half.want, percentile(r.half.lat, 0.5), percentile(r.half.lat, 0.99), percentile(r.half.lat, 1))
	} else {
		fmt.Println("  latency batch: not run")
	}
	fmt.Printf("  kube-scheduler's client: QPS %g, burst %d (its /configz); rate-limiter wait %s\n", r.limiter.qps, r.limiter.burst, r.limiter)
	fmt.Printf("  CPU s per 1,000 pods bound: saturated batch %s; latency batch %s\n", fmtCPU(r.cpuSat), fmtCPU(r.cpuHalf))
	fmt.Printf("  kube-scheduler: scheduling algorithm (filter + score%s) %s\n", map[bool]string{true: ", the extender's filter + prioritize or choose included", false: ""}[carma], histQ(r.algo))
	var pts []string
	for _, p := range extensionPoints {
		if h := r.points[p]; h.count > 0 {
			pts = append(pts, fmt.Sprintf("%s p50 %s, p99 %s", p, ms(h.quantile(0.5)), ms(h.quantile(0.99))))
		}
	}
	fmt.Printf("  kube-scheduler: in-tree plugins by extension point: %s\n", strings.Join(pts, "; "))
	fmt.Printf("  kube-scheduler: attempt to bound (%s) %s\n", map[bool]string{true: "the extender's bind included", false: "its own bind"}[carma], histQ(r.attempt))
	fmt.Printf("  kube-scheduler: schedule attempts by result %v\n", fmtMap(r.attempts))
	fmt.Printf("  kube-scheduler process: RSS %.0f → %.0f MiB (peak %.0f), %.1f CPU s\n", r.sched.rssStart, r.sched.rssEnd, r.sched.rssPeak, r.sched.cpuS)
	fmt.Printf("  API requests per scheduled pod (%d pods): %.2f, of them kube-scheduler's %.2f; by request: %s\n",
		r.pods, r.apiPerPod, r.schedPerPod, strings.Join(r.breakdown, ", "))
	if carma {
		for _, v := range []string{"filter", "choose", "prioritize", "bind"} {
			fmt.Printf("  extender %s (its own histogram): %s\n", v, histQ(r.extVerbs[v]))
		}
		fmt.Printf("  extender binds by result %v; rejections by reason %v\n", fmtMap(r.extBinds), fmtMap(r.extRejections))
		fmt.Printf("  extender process: RSS %.0f → %.0f MiB (peak %.0f), %.1f CPU s\n", r.ext.rssStart, r.ext.rssEnd, r.ext.rssPeak, r.ext.cpuS)
		if len(r.churn) > 0 {
			var rs []string
			for _, c := range r.churn {
				rs = append(rs, fmt.Sprintf("%.0f", c.rssMiB))
			}
			fmt.Printf("  churn: %d rounds of %d pods created and deleted; extender RSS after each (MiB): %s\n",
				len(r.churn), r.churn[0].res.want, strings.Join(rs, " "))
		}
		fmt.Printf("  hollow kubelets: %d pods marked %s (%d failed), bind seen → mark answered p50 %.0f ms, p99 %.0f ms; %d GpuNode publications\n",
			r.marked, annAllocated, r.markErrs, percentile(r.marks, 0.5), percentile(r.marks, 0.99), r.published)
		fmt.Printf("  a change of a node's pods → a GpuNode watch saw it published: saturated batch %s; latency batch %s\n",
			delaySummary(r.pubSat), delaySummary(r.pubHalf))
	}
	fmt.Printf("  over-commit: %d findings in %d checks (%d checks failed)\n", len(r.findings), r.checks, r.checkErrs)
}

func fmtMap(m map[string]float64) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%.0f", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// clusterShape reads the hollow nodes and GPUs per GpuNode back from the cluster.
func (b *bench) clusterShape(ctx context.Context) (nodes, gpus string) {
	nl, err := b.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: "scale.carma.io/hollow=true"})
	if err != nil {
		return "?", "?"
	}
	gl, err := b.dyn.Resource(gnGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Sprint(len(nl.Items)), "?"
	}
	counts := map[int64]int{}
	for _, g := range gl.Items {
		n, _, _ := unstructured.NestedInt64(g.Object, "status", "gpuCount")
		counts[n]++
	}
	if len(counts) != 1 {
		return fmt.Sprint(len(nl.Items)), fmt.Sprint(counts)
	}
	for n := range counts {
		gpus = fmt.Sprint(n)
	}
	return fmt.Sprint(len(nl.Items)), gpus
}

// summary folds every run of both phases: medians where a phase ran more than once.
type summary struct {
	plains, carmas []phaseResult
}

func summarize(plains, carmas []phaseResult) summary { return summary{plains, carmas} }

func throughputs(rs []phaseResult) []float64 {
	var out []float64
	for _, r := range rs {
		out = append(out, r.sat.throughput())
	}
	return out
}

func p99s(rs []phaseResult) []float64 {
	var out []float64
	for _, r := range rs {
		if r.half.ran {
			out = append(out, percentile(r.half.lat, 0.99))
		}
	}
	return out
}

// medianCPU is the median over runs of each process's CPU seconds per 1,000 pods.
func medianCPU(rs []phaseResult, half bool) map[string]float64 {
	by := map[string][]float64{}
	for _, r := range rs {
		m := r.cpuSat
		if half {
			m = r.cpuHalf
		}
		for k, v := range m {
			by[k] = append(by[k], v)
		}
	}
	out := map[string]float64{}
	for k, v := range by {
		out[k] = spreadOf(v).median
	}
	return out
}

// clients is the summary's word on the schedulers' clients: the QPS each kube-scheduler reported
// in /configz, and "unthrottled" only when no run of either side waited in its rate limiter past the
// lowest bucket at p99.
func (s summary) clients() string {
	qps := map[float64]bool{}
	var qs []string
	bound, read := false, true
	for _, rs := range [][]phaseResult{s.plains, s.carmas} {
		for _, r := range rs {
			if !r.limiter.ok {
				read = false
				continue
			}
			if !qps[r.limiter.qps] {
				qps[r.limiter.qps] = true
				qs = append(qs, fmt.Sprintf("%g", r.limiter.qps))
			}
			bound = bound || r.limiter.bound()
		}
	}
	if len(qs) == 0 {
		return "clients not read"
	}
	q := "QPS " + strings.Join(qs, " and ")
	switch {
	case !read:
		return "a client's rate limiter not read (" + q + ")"
	case bound:
		return "clients throttled (" + q + ")"
	}
	return "clients unthrottled (" + q + ")"
}

// line is the run's one line; latencyRate is the rate every latency batch was offered.
func (s summary) line(nodes, gpus string, latencyRate float64, filler int) string {
	rate := func(rs []phaseResult) string {
		if len(rs) == 0 {
			return "not run"
		}
		return fmt.Sprintf("%.1f pods/s", spreadOf(throughputs(rs)).median)
	}
	p99 := func(rs []phaseResult) string {
		v := spreadOf(p99s(rs))
		if v.n == 0 {
			return "not run"
		}
		return fmt.Sprintf("%.0f ms", v.median)
	}
	ratio := "not run"
	if len(s.plains) > 0 && len(s.carmas) > 0 {
		pl, ca := spreadOf(throughputs(s.plains)).median, spreadOf(throughputs(s.carmas)).median
		if pl > 0 {
			ratio = fmt.Sprintf("%.0f %%", 100*ca/pl)
		} else {
			ratio = "no pod bound alone"
		}
	}
	rss := "not run"
	peak, ok := 0.0, false
	for _, r := range s.carmas {
		if r.ext.ok {
			peak, ok = math.Max(peak, r.ext.rssPeak), true
		}
	}
	if ok {
		rss = fmt.Sprintf("%.0f MiB", peak)
	}
	other := fmt.Sprintf("%d other pods", filler)
	if filler < 0 {
		other = "other pods not counted"
	}
	over := "not run"
	if len(s.plains)+len(s.carmas) > 0 {
		n, checks := 0, 0
		for _, rs := range [][]phaseResult{s.plains, s.carmas} {
			for _, r := range rs {
				n += len(r.findings)
				checks += r.checks
			}
		}
		over = fmt.Sprintf("%d over-committed GPUs", n)
		if checks == 0 {
			over = "over-commit not checked"
		}
	}
	load := "not run"
	if latencyRate > 0 {
		load = fmt.Sprintf("%.1f pods/s", latencyRate)
	}
	return fmt.Sprintf("scale %sx%s: kube-scheduler alone %s, with carma %s (%s), %s, p99 at %s %s alone / %s with carma, extender RSS %s with %s, %s",
		nodes, gpus, rate(s.plains), rate(s.carmas), ratio, s.clients(), load, p99(s.plains), p99(s.carmas), rss, other, over)
}

// details are the lines after the summary: the rate limiters' waits, CPU per 1,000 pods, carma's API
// writes, and with repeats the spread.
func (s summary) details(nodes string, repeats int) []string {
	var out []string
	lim := func(rs []phaseResult) string {
		if len(rs) == 0 {
			return "not run"
		}
		var parts []string
		for _, r := range rs {
			p := fmt.Sprintf("QPS %g burst %d: %s", r.limiter.qps, r.limiter.burst, r.limiter)
			if len(rs) > 1 {
				p = fmt.Sprintf("run %d %s", r.rep, p)
				if r.limiter.qps == rs[0].limiter.qps && r.limiter.burst == rs[0].limiter.burst && r.rep != rs[0].rep {
					p = fmt.Sprintf("run %d %s", r.rep, r.limiter)
				}
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "; ")
	}
	out = append(out, "rate-limiter wait over each phase (rest_client_rate_limiter_duration_seconds): alone "+lim(s.plains)+
		"; with carma "+lim(s.carmas)+" (the extender's client has no client-side limit)")
	of := "median of runs"
	if repeats <= 1 {
		of = "one run"
	}
	share := func(rs []phaseResult) string {
		var v []float64
		for _, r := range rs {
			v = append(v, r.sat.creationShare())
		}
		if sp := spreadOf(v); sp.n > 0 {
			return fmt.Sprintf("%.0f %%", sp.median)
		}
		return "not run"
	}
	out = append(out, fmt.Sprintf("saturated batches: creating the pods took %s of the span alone, %s with carma (%s; near 100 %%, pod creation, not the scheduler, set the pace)",
		share(s.plains), share(s.carmas), of))
	for _, half := range []bool{false, true} {
		what := "saturated batch"
		if half {
			what = "latency batch"
		}
		out = append(out, fmt.Sprintf("CPU s per 1,000 pods bound (%s, %s): alone %s; with carma %s", what, of,
			fmtCPU(medianCPU(s.plains, half)), fmtCPU(medianCPU(s.carmas, half))))
	}
	rest, load := math.NaN(), []float64{}
	var restW writesWindow
	for _, r := range s.carmas {
		if r.writesRest.ok {
			rest, restW = r.writesRest.perSecond(), r.writesRest
		}
		if r.writesLoad.ok {
			load = append(load, r.writesLoad.perSecond())
		}
	}
	if len(s.carmas) > 0 {
		w := "not measured"
		if !math.IsNaN(rest) {
			w = fmt.Sprintf("%.1f", rest)
		}
		v := "not measured"
		if sp := spreadOf(load); sp.n > 0 {
			v = fmt.Sprintf("%.1f", sp.median)
		}
		out = append(out, fmt.Sprintf("api-writes %s nodes: %s per second at rest, %s per second under load (carma's clients, from apiserver_request_total)", nodes, w, v))
		out = append(out, "  at rest: "+restW.String())
		for _, r := range s.carmas {
			out = append(out, fmt.Sprintf("  under load (saturated batch, run %d): %s", r.rep, r.writesLoad))
		}
	}
	if repeats > 1 {
		for _, x := range []struct {
			name string
			rs   []phaseResult
		}{{"alone", s.plains}, {"with carma", s.carmas}} {
			out = append(out, fmt.Sprintf("repeats %s (min / median / max of %d): %s pods/s, p99 %s ms", x.name, len(x.rs),
				spreadOf(throughputs(x.rs)).fmt("%.1f"), spreadOf(p99s(x.rs)).fmt("%.0f")))
		}
	}
	return out
}
