package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

const loadPods = 300

// loadPod is one pod of the mixed load: a memory override, an MLP model profile, a large job, a
// two-GPU job or an exclusive one; it runs a few seconds and succeeds.
func (e *env) loadPod(i int, rng *rand.Rand) *v1.Pod {
	ann := map[string]string{annRunSeconds: fmt.Sprintf("%.1f", 3+rng.Float64()*7)}
	gpus := int64(1)
	switch r := rng.Intn(100); {
	case r < 40:
		ann[annGPUMemory] = []string{"2Gi", "4Gi", "8Gi", "12Gi"}[rng.Intn(4)]
	case r < 65:
		profile := map[string]any{"family": "mlp", "batchSize": []int{32, 64, 128, 256}[rng.Intn(4)],
			"parameters": 500_000 + rng.Intn(20_000_000), "activations": 2_000 + rng.Intn(30_000), "depth": 4 + rng.Intn(8),
			"activation": "ReLU", "layers": map[string]int{"linear": 3 + rng.Intn(6), "batchNorm": rng.Intn(3), "dropout": rng.Intn(2)}}
		raw, _ := json.Marshal(profile)
		ann[annProfile] = string(raw)
	case r < 80:
		ann[annGPUMemory] = []string{"20Gi", "30Gi", "40Gi"}[rng.Intn(3)]
	case r < 90:
		ann[annGPUMemory] = "6Gi"
		gpus = 2
	default:
		ann["carma.io/policy"] = "exclusive"
		ann[annGPUMemory] = "10Gi"
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("load-%03d", i), Namespace: "load", Annotations: ann},
		Spec: v1.PodSpec{
			SchedulerName: e.schedulerName,
			RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{
				Name: "train", Image: "example.com/train:1",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpuResource: *resource.NewQuantity(gpus, resource.DecimalSI)}},
			}},
		},
	}
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

// scenarioLoad: 300 mixed pods at once on 4 nodes × 8 GPUs, with the extender SIGKILLed and restarted
// in the middle; no GPU is ever over-committed; then operator failover and a device-plugin restart.
func (e *env) scenarioLoad(ctx context.Context, s *summary) {
	e.ensureNamespace(ctx, "load")

	var mu sync.Mutex
	created := map[string]time.Time{}
	bound := map[string]time.Time{}
	// An informer, as a controller would watch: the first sight of spec.nodeName is the bind time.
	factory := informers.NewSharedInformerFactoryWithOptions(e.kube, 0, informers.WithNamespace("load"))
	inf := factory.Core().V1().Pods().Informer()
	record := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		mu.Lock()
		if _, seen := bound[p.Name]; !seen {
			bound[p.Name] = time.Now()
		}
		mu.Unlock()
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: record, UpdateFunc: func(_, o any) { record(o) }})
	stopInf := make(chan struct{})
	defer close(stopInf)
	factory.Start(stopInf)
	e.check(factory.WaitForCacheSync(stopInf)[reflect.TypeOf(&v1.Pod{})], "pod informer for namespace load synced")

	rng := rand.New(rand.NewSource(42))
	pods := make([]*v1.Pod, loadPods)
	for i := range pods {
		pods[i] = e.loadPod(i, rng)
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	var createErrs atomic.Int64
	for _, p := range pods {
		wg.Add(1)
		sem <- struct{}{}
		go func(p *v1.Pod) {
			defer wg.Done()
			defer func() { <-sem }()
			mu.Lock()
			created[p.Name] = time.Now()
			mu.Unlock()
			if _, err := e.kube.CoreV1().Pods("load").Create(ctx, p, metav1.CreateOptions{}); err != nil {
				createErrs.Add(1)
				fmt.Printf("    create %s: %v\n", p.Name, err)
			}
		}(p)
	}
	wg.Wait()
	e.check(createErrs.Load() == 0, "%d pods created in %.1f s", loadPods, time.Since(t0).Seconds())

	// Kill the extender once a third of the pods are bound, and start it again.
	poll(ctx, 200*time.Millisecond, 3*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(bound) >= loadPods/3
	})
	mu.Lock()
	atKill := len(bound)
	mu.Unlock()
	e.ctlRun("kill-extender")
	fmt.Printf("    extender SIGKILLed with %d pods bound\n", atKill)
	time.Sleep(2 * time.Second)
	e.ctlRun("start-extender")

	done := e.waitTerminated(ctx, "load", loadPods, time.Second, 8*time.Minute)
	list, _ := e.kube.CoreV1().Pods("load").List(ctx, metav1.ListOptions{})
	var succeeded, failed, pending int
	adm := e.admissions()
	swapped, unadmitted := 0, 0
	for i := range list.Items {
		p := &list.Items[i]
		switch {
		case p.Status.Phase == v1.PodSucceeded:
			succeeded++
		case p.Status.Phase == v1.PodFailed:
			failed++
			fmt.Printf("    %s failed: %s %s\n", p.Name, p.Status.Reason, p.Status.Message)
		case p.Spec.NodeName == "":
			pending++
			e.checkPendingReason(ctx, p)
		}
		if p.Spec.NodeName != "" {
			rec, ok := adm[string(p.UID)]
			switch {
			case !ok:
				unadmitted++
			case !e.checkAdmission(p, rec, true):
				swapped++
			}
		}
	}
	e.check(done, "every load pod finished within 8 minutes (%d succeeded, %d failed, %d pending)", succeeded, failed, pending)
	e.check(failed == 0, "no load pod failed admission or ran on GPUs it was not assigned")
	e.check(swapped == 0 && unadmitted == 0,
		"every bound load pod was admitted by its node's device manager (%d not) with devices and NVIDIA_VISIBLE_DEVICES that match its assigned GPUs (%d differ)",
		unadmitted, swapped)
	polls, _, _, _ := e.mon.counts()
	e.check(len(e.mon.real()) == 0, "the over-commit checker found nothing so far (%d polls, the extender's crash included)", polls)

	mu.Lock()
	var lat []float64
	for name, b := range bound {
		if c, ok := created[name]; ok {
			lat = append(lat, float64(b.Sub(c).Microseconds())/1000)
		}
	}
	mu.Unlock()
	sort.Float64s(lat)
	s.p99BindMs = percentile(lat, 0.99)
	fmt.Printf("    %d pods bound; creation → binding p50 %.0f ms, p99 %.0f ms, max %.0f ms (load of %d pods at once, extender restarted once)\n",
		len(lat), percentile(lat, 0.5), s.p99BindMs, percentile(lat, 1), loadPods)
	e.check(len(lat) == loadPods, "all %d load pods were bound (%d)", loadPods, len(lat))

	e.scenarioOperatorFailover(ctx, s)
	e.scenarioDevicePluginRestart(ctx)
}

// checkPendingReason: a pod left pending carries the extender's reason in a FailedScheduling Event.
func (e *env) checkPendingReason(ctx context.Context, p *v1.Pod) {
	evs, _ := e.kube.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", p.Name).String()})
	msg := ""
	for _, ev := range evs.Items {
		if ev.Reason == "FailedScheduling" {
			msg = ev.Message
		}
	}
	e.check(msg != "", "pending pod %s has a FailedScheduling reason: %q", p.Name, msg)
}

// leaseHolder reads the operator's Lease.
func (e *env) leaseHolder(ctx context.Context) string {
	l, err := e.kube.CoordinationV1().Leases(e.namespace).Get(ctx, "carma-operator", metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// scenarioOperatorFailover: SIGKILL the leading operator while a TrainingTask is in flight; the other
// replica takes the Lease within its duration (15 s) and the task completes with no attempt lost or
// duplicated.
func (e *env) scenarioOperatorFailover(ctx context.Context, s *summary) {
	fmt.Println("  -- operator failover")
	e.ensureNamespace(ctx, "failover")
	leader := e.leaseHolder(ctx)
	if !e.check(leader != "", "the operator Lease has a holder (%s)", leader) {
		return
	}
	t := oomTask("failover-task", "cuda-oom,succeed", 2)
	t.SetNamespace("failover")
	_ = unstructured.SetNestedField(t.Object, "6", "spec", "template", "metadata", "annotations", annRunSeconds)
	_, err := e.dyn.Resource(ttGVR).Namespace("failover").Create(ctx, t, metav1.CreateOptions{})
	e.check(err == nil, "create TrainingTask failover/failover-task (%v)", err)
	poll(ctx, 200*time.Millisecond, time.Minute, func() bool {
		st, err := e.task(ctx, "failover", "failover-task")
		return err == nil && len(st.attempts) >= 1
	})
	t0 := time.Now()
	e.ctlRun("kill-operator", leader)
	var next string
	ok := poll(ctx, 100*time.Millisecond, 45*time.Second, func() bool {
		next = e.leaseHolder(ctx)
		return next != "" && next != leader
	})
	s.failoverS = time.Since(t0).Seconds()
	// A killed leader cannot release the Lease: the other replica may take it once the last renewal
	// is a lease duration (15 s) old, and tries every retry period (2 s); 3 s of slack for a loaded
	// machine.
	e.check(ok && s.failoverS <= 15+2+3, "after SIGKILL of %s, %s holds the Lease in %.1f s (lease duration 15 s, retry 2 s)", leader, next, s.failoverS)
	st := e.waitTask(ctx, "failover", "failover-task", "Succeeded", 2*time.Minute)
	pods, _ := e.kube.CoreV1().Pods("failover").List(ctx, metav1.ListOptions{LabelSelector: "carma.io/task=failover-task"})
	e.check(st.phase == "Succeeded" && len(st.attempts) == 2 && len(pods.Items) == 2,
		"failover-task: %s with %d attempts recorded and %d attempt pods (an OOM across the failover; none lost or duplicated)",
		st.phase, len(st.attempts), len(pods.Items))
	e.ctlRun("start-operator", leader)
}

// scenarioDevicePluginRestart: a restarted device plugin re-registers with the device manager and its
// GpuNode status resumes.
func (e *env) scenarioDevicePluginRestart(ctx context.Context) {
	fmt.Println("  -- device plugin restart")
	node := "gpu-node-2"
	updated := func() string {
		u, err := e.dyn.Resource(gnGVR).Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		s, _, _ := unstructured.NestedString(u.Object, "status", "updatedAt")
		return s
	}
	e.ctlRun("restart-device-plugin", node)
	t0 := time.Now()
	before := updated()
	ok := poll(ctx, 500*time.Millisecond, 60*time.Second, func() bool {
		u := updated()
		ts, err := time.Parse(time.RFC3339, u)
		return u != before && err == nil && ts.After(t0.Add(-time.Second))
	})
	e.check(ok, "GpuNode %s status resumes after the device plugin restart (updatedAt %s → %s)", node, before, updated())
	ok = poll(ctx, 500*time.Millisecond, 30*time.Second, func() bool {
		n, err := e.kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q := n.Status.Allocatable[gpuResource]
		return q.Value() == gpusPerNode*replicasPerGPU
	})
	e.check(ok, "node %s advertises %d %s again after the plugin re-registered", node, gpusPerNode*replicasPerGPU, gpuResource)
}
