package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carma/e2e/control-plane/internal/overcommit"
)

// The DRA path at scale (docs/scale.md, "The DRA path"): every hollow node also publishes two
// ResourceSlices, and three phases schedule claim pods on them:
//
//   - dra-carma: carma's slice as its DRA driver publishes it (dra-driver/src/slice.rs: one device per
//     GPU, allowMultipleAllocations, memory as consumable capacity with the whole memory as the
//     default request and a 1 MiB step, slots = the replicas per GPU, attributes uuid, model,
//     gateRule, index) and claims from the operator's templates (api/src/dra.rs claim_template: one
//     device of class carma-gpu booking <MiB>Mi of memory), scheduled by the chart's kube-scheduler;
//   - dra-whole: a whole-GPU driver's slice (one device per GPU, memory as a plain capacity, no
//     sharing, as a driver that hands out whole GPUs publishes it) and claims for one whole device,
//     scheduled by kube-scheduler alone;
//   - dra-tainted: dra-carma with a tenth of carma's devices tainted by the utilization gate
//     (NoSchedule, as dra-driver/src/taints.rs sets it), which the booking claims do not tolerate.
//
// kube-controller-manager's resourceclaim controller (started by scale.sh) makes each pod's claim
// from its template; the benchmark deletes the claims of a batch after its pods (the garbage
// collector's part; the controller then clears the allocation and the finalizer).
const (
	draCarmaDriver = "gpu.carma.io"
	draWholeDriver = "whole-gpu.scale.carma.io"
	draCarmaClass  = "carma-gpu"
	draWholeClass  = "scale-whole-gpu"
	draClaim       = "carma-gpu" // the pod's claim entry (api/src/dra.rs CLAIM_NAME)
	draGateTaint   = "gpu.carma.io/utilization-gate"
	draMinShareMiB = 1024 // the driver's --min-share-mib default
)

// draModes are the DRA phases by name, in the order a run takes them (dra-carma first: its
// saturated rate sets the offered rate of every DRA latency batch).
var draModes = []draMode{
	{name: "dra-carma", title: "carma's slices", carma: true},
	{name: "dra-whole", title: "kube-scheduler alone, whole-GPU claims"},
	{name: "dra-tainted", title: "carma's slices, a tenth of the GPUs tainted", carma: true, tainted: true},
}

type draMode struct {
	name, title    string
	carma, tainted bool
}

// draBookings are the MiB the dra-carma pods book, in turn: the sizes the operator's templates
// take for the example TrainingTasks' estimates are of this order (a few GiB to 16 GiB).
var draBookings = []int64{4096, 8192, 12288, 16384}

func draTemplateName(mib int64) string {
	if mib == 0 {
		return draWholeClass + "-g1-whole"
	}
	return fmt.Sprintf("%s-g1-m%d", draCarmaClass, mib)
}

// setupDRA creates the two DeviceClasses (carma's exactly as the chart renders it), the claim
// templates, and both slices on every hollow node.
func (b *bench) setupDRA(ctx context.Context) error {
	classes := []resourcev1.DeviceClass{
		{ObjectMeta: metav1.ObjectMeta{Name: draCarmaClass}, Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + draCarmaDriver + `"`}}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: draWholeClass}, Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + draWholeDriver + `"`}}}}},
	}
	for i := range classes {
		if _, err := b.kube.ResourceV1().DeviceClasses().Create(ctx, &classes[i], metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("DeviceClass %s: %w", classes[i].Name, err)
		}
	}
	for _, mib := range append([]int64{0}, draBookings...) {
		if _, err := b.kube.ResourceV1().ResourceClaimTemplates(benchNS).Create(ctx, draTemplate(mib), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("ResourceClaimTemplate %s: %w", draTemplateName(mib), err)
		}
	}
	return b.publishSlices(ctx, 0)
}

// draInventory is what the API server lists of the DRA setup: ResourceSlices by driver and claim
// templates in the benchmark's namespace.
func (b *bench) draInventory(ctx context.Context) (string, error) {
	sl, err := b.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	tl, err := b.kube.ResourceV1().ResourceClaimTemplates(benchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", err
	}
	by := map[string]int{}
	for _, s := range sl.Items {
		by[s.Spec.Driver]++
	}
	return fmt.Sprintf("%d ResourceSlices of %s and %d of %s, %d claim templates",
		by[draCarmaDriver], draCarmaDriver, by[draWholeDriver], draWholeDriver, len(tl.Items)), nil
}

// countTainted lists carma's devices and those carrying the gate's taint.
func (b *bench) countTainted(ctx context.Context) (tainted, devices int, err error) {
	l, err := b.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	for _, s := range l.Items {
		if s.Spec.Driver != draCarmaDriver {
			continue
		}
		for _, d := range s.Spec.Devices {
			devices++
			if slices.ContainsFunc(d.Taints, func(t resourcev1.DeviceTaint) bool { return t.Key == draGateTaint }) {
				tainted++
			}
		}
	}
	return tainted, devices, nil
}

// draTemplate: mib > 0 is the operator's template booking mib on one carma GPU; 0 is one whole
// device of the whole-GPU class.
func draTemplate(mib int64) *resourcev1.ResourceClaimTemplate {
	req := resourcev1.ExactDeviceRequest{DeviceClassName: draWholeClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}
	if mib > 0 {
		req.DeviceClassName = draCarmaClass
		req.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(fmt.Sprintf("%dMi", mib))}}
	}
	return &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: draTemplateName(mib), Namespace: benchNS,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "carma"}},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: draClaim, Exactly: &req}}}}},
	}
}

// publishSlices writes both slices of every hollow node; with taintEvery > 0, every taintEvery-th
// carma device (counted over the cluster) carries the utilization gate's taint. An existing slice is
// replaced at the next pool generation, as the driver's publisher does.
func (b *bench) publishSlices(ctx context.Context, taintEvery int) error {
	g := new(errgroup.Group)
	g.SetLimit(32)
	for i := 1; i <= b.cfg.nodes; i++ {
		g.Go(func() error {
			node := nodeName(i)
			for _, s := range []*resourcev1.ResourceSlice{b.carmaSlice(i, taintEvery), b.wholeSlice(i)} {
				if err := b.putSlice(ctx, s); err != nil {
					return fmt.Errorf("%s: slice %s: %w", node, s.Name, err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

func (b *bench) putSlice(ctx context.Context, s *resourcev1.ResourceSlice) error {
	api := b.kube.ResourceV1().ResourceSlices()
	old, err := api.Get(ctx, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, s, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	s.ResourceVersion = old.ResourceVersion
	s.Spec.Pool.Generation = old.Spec.Pool.Generation + 1
	_, err = api.Update(ctx, s, metav1.UpdateOptions{})
	return err
}

func mibQ(n int64) resource.Quantity { return resource.MustParse(fmt.Sprintf("%dMi", n)) }

func (b *bench) carmaSlice(node, taintEvery int) *resourcev1.ResourceSlice {
	name := nodeName(node)
	yes := true
	one := resource.MustParse("1")
	var devs []resourcev1.Device
	for g := 0; g < b.cfg.gpus; g++ {
		d := resourcev1.Device{
			Name:                     fmt.Sprintf("gpu-%d", g),
			AllowMultipleAllocations: &yes,
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"uuid":     {StringValue: strPtr(gpuUUID(node, g))},
				"model":    {StringValue: strPtr(fmt.Sprintf("carma hollow GPU %dGiB", b.cfg.gpuMiB/1024))},
				"gateRule": {StringValue: strPtr(gateRule)},
				"index":    {IntValue: int64Ptr(int64(g))},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				"memory": {Value: mibQ(b.cfg.gpuMiB), RequestPolicy: &resourcev1.CapacityRequestPolicy{
					Default:    qPtr(mibQ(b.cfg.gpuMiB)),
					ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: qPtr(mibQ(min(draMinShareMiB, b.cfg.gpuMiB))), Step: qPtr(mibQ(1))}}},
				"slots": {Value: *resource.NewQuantity(int64(b.cfg.replicas), resource.DecimalSI), RequestPolicy: &resourcev1.CapacityRequestPolicy{
					Default: qPtr(one), ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: qPtr(one), Max: qPtr(one)}}},
			},
		}
		if taintEvery > 0 && ((node-1)*b.cfg.gpus+g)%taintEvery == 0 {
			d.Taints = []resourcev1.DeviceTaint{{Key: draGateTaint, Effect: resourcev1.DeviceTaintEffectNoSchedule}}
		}
		devs = append(devs, d)
	}
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + draCarmaDriver},
		Spec: resourcev1.ResourceSliceSpec{Driver: draCarmaDriver, NodeName: &name,
			Pool: resourcev1.ResourcePool{Name: name, ResourceSliceCount: 1}, Devices: devs},
	}
}

func (b *bench) wholeSlice(node int) *resourcev1.ResourceSlice {
	name := nodeName(node)
	var devs []resourcev1.Device
	for g := 0; g < b.cfg.gpus; g++ {
		devs = append(devs, resourcev1.Device{
			Name: fmt.Sprintf("gpu-%d", g),
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				"uuid":  {StringValue: strPtr(gpuUUID(node, g))},
				"index": {IntValue: int64Ptr(int64(g))},
			},
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: mibQ(b.cfg.gpuMiB)}},
		})
	}
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + draWholeDriver},
		Spec: resourcev1.ResourceSliceSpec{Driver: draWholeDriver, NodeName: &name,
			Pool: resourcev1.ResourcePool{Name: name, ResourceSliceCount: 1}, Devices: devs},
	}
}

func strPtr(s string) *string                     { return &s }
func int64Ptr(n int64) *int64                     { return &n }
func qPtr(q resource.Quantity) *resource.Quantity { return &q }

// draPod is a pod of batch whose one GPU is a claim from a template: carma's bookings in turn, or
// one whole device.
func (b *bench) draPod(batch string, i int, carma bool) *v1.Pod {
	p := b.pod(batch, i, false)
	p.Spec.Containers[0].Resources.Limits = nil
	tmpl := draTemplateName(0)
	if carma {
		p.Spec.SchedulerName = b.cfg.carmaScheduler
		tmpl = draTemplateName(draBookings[i%len(draBookings)])
	}
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: draClaim, ResourceClaimTemplateName: &tmpl}}
	p.Spec.Containers[0].Resources.Claims = []v1.ResourceClaim{{Name: draClaim}}
	return p
}

// checkClaims runs the claims over-commit checker over every slice and every claim.
func (b *bench) checkClaims(ctx context.Context) ([]string, error) {
	sl, err := b.kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	claims, err := b.kube.ResourceV1().ResourceClaims(benchNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return findingStrings(overcommit.ClaimFindings(sl.Items, claims.Items)), nil
}

// plantOvercommit is the checker's planted fault (--plant-dra-overcommit): a claim whose status
// says it holds 1 TiB of memory on the first node's first carma device, written as an admin would,
// past the allocator. The check after the saturated batch must report it, and the run must fail.
func (b *bench) plantOvercommit(ctx context.Context) error {
	c := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "planted-overcommit", Namespace: benchNS},
		Spec:       draTemplate(draBookings[0]).Spec.Spec,
	}
	created, err := b.kube.ResourceV1().ResourceClaims(benchNS).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	node := nodeName(1)
	created.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: draClaim, Driver: draCarmaDriver, Pool: node, Device: "gpu-0",
			ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Ti"), "slots": resource.MustParse("1")},
		}}},
		NodeSelector: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	_, err = b.kube.ResourceV1().ResourceClaims(benchNS).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err == nil {
		fmt.Printf("  planted: claim %s/planted-overcommit holds 1Ti on %s/%s/gpu-0\n", benchNS, draCarmaDriver, node)
	}
	return err
}

// deleteDRABatch deletes the batch's pods, then every claim of the namespace, and waits until the
// API server lists none (the controller must deallocate each before it goes).
func (b *bench) deleteDRABatch(ctx context.Context, batch string) {
	b.deleteBatch(ctx, batch)
	api := b.kube.ResourceV1().ResourceClaims(benchNS)
	if err := api.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		fmt.Printf("    delete the claims of %s: %v\n", batch, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		l, err := api.List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("    %s: claims still listed 3 min after their deletion\n", batch)
}

type draResult struct {
	mode      draMode
	ran       bool
	failed    bool
	rep       int
	qps       float64
	burst     int64
	sat, half batchResult
	cpuSat    map[string]float64
	findings  []string
	checks    int
	attempts  map[string]float64
	extCalls  float64 // the extender's calls over the phase (carma's kube-scheduler only)
	tainted   int     // carma devices the API server listed with the gate's taint (dra-tainted)
	devices   int
	points    map[string]hist // kube-scheduler's extension points over the phase
	algo      hist
	seconds   float64
	machine   string
}

// runDRAPhase runs one DRA phase: the saturated batch, then the latency batch at *latencyRate
// (half of this saturated rate when 0, then kept for every later DRA latency batch), each checked
// for over-commit before its pods and claims are deleted.
func (b *bench) runDRAPhase(ctx context.Context, m draMode, rep int, latencyRate *float64) draResult {
	r := draResult{mode: m, ran: true, rep: rep}
	verb, schedURL, schedPid, profile := "plain", b.cfg.plainURL, b.cfg.plainPidFile, plainName
	if m.carma {
		verb, schedURL, schedPid, profile = "carma", b.cfg.carmaURL, b.cfg.carmaPidFile, b.cfg.carmaScheduler
	}
	fmt.Printf("\n=== phase %s: %s (run %d of %d)\n", m.name, m.title, rep, b.cfg.repeats)
	if m.tainted {
		var err error
		if err = b.publishSlices(ctx, 10); err != nil {
			fmt.Printf("  FAIL tainting a tenth of carma's devices: %v\n", err)
			r.failed = true
			return r
		}
		defer func() {
			if err := b.publishSlices(ctx, 0); err != nil {
				fmt.Printf("  FAIL lifting the taints: %v\n", err)
			}
		}()
		if r.tainted, r.devices, err = b.countTainted(ctx); err != nil {
			fmt.Printf("  FAIL counting the tainted devices: %v\n", err)
			r.failed = true
		}
		fmt.Printf("  the API server lists %d of %d carma devices tainted %s:NoSchedule\n", r.tainted, r.devices, draGateTaint)
	}
	if err := b.ctlRun("start-" + verb); err != nil {
		fmt.Printf("  FAIL starting the scheduler: %v\n", err)
		r.failed = true
		return r
	}
	defer func() {
		if err := b.ctlRun("stop-" + verb); err != nil {
			fmt.Printf("  stopping the scheduler: %v\n", err)
		}
	}()
	if qps, burst, err := b.clientLimits(ctx, schedURL); err != nil {
		fmt.Printf("  FAIL reading the client limits from kube-scheduler's /configz: %v\n", err)
		r.failed = true
	} else {
		r.qps, r.burst = qps, burst
	}
	t0 := time.Now()
	mw := watchMachine(5 * time.Second)
	schedPID, _ := pidOf(b.cfg.work, schedPid)
	procs := b.cpuProcs(schedPID, 0)
	if pid, err := pidOf(b.cfg.work, b.cfg.kcmPidFile); err == nil {
		procs["kube-controller-manager"] = pid
	}
	before, errB := scrape(ctx, b.metricsC, schedURL+"/metrics")
	// The extender is configured for carma.io/gpu only; a pod holding just a claim should never
	// reach it. Counted rather than assumed.
	extCalls := func() (float64, error) {
		x, err := scrape(ctx, http.DefaultClient, b.cfg.extenderURL+"/metrics")
		if err != nil {
			return 0, err
		}
		n := 0.0
		for _, v := range []string{"filter", "choose", "prioritize", "bind"} {
			n += x.histogram("carma_extender_request_duration_seconds", map[string]string{"verb": v}).count
		}
		return n, nil
	}
	var ext0 float64
	var extErr error
	if m.carma {
		ext0, extErr = extCalls()
	}
	check := func() {
		f, err := b.checkClaims(ctx)
		if err != nil {
			fmt.Printf("  over-commit check failed: %v\n", err)
			return
		}
		r.checks++
		for _, x := range f {
			fmt.Printf("  FINDING %s\n", x)
		}
		r.findings = append(r.findings, f...)
	}
	mk := func(batch string, i int) *v1.Pod { return b.draPod(batch, i, m.carma) }
	c0 := procs.now()
	r.sat = b.runBatch(ctx, m.name+"-sat", b.cfg.pods, mk, 0)
	r.cpuSat = cpuPer1000(c0, procs.now(), r.sat.bound)
	fmt.Printf("  saturated: %d of %d pods bound, %.1f pods/s (first creation → last bind %.1f s; creating them took %.0f %% of it)\n",
		r.sat.bound, r.sat.want, r.sat.throughput(), r.sat.last.Sub(r.sat.first).Seconds(), r.sat.creationShare())
	if b.cfg.plantDRA && m.name == "dra-carma" {
		if err := b.plantOvercommit(ctx); err != nil {
			fmt.Printf("  FAIL planting the over-commit: %v\n", err)
			r.failed = true
		}
	}
	check()
	b.deleteDRABatch(ctx, m.name+"-sat")
	half := *latencyRate
	if half <= 0 {
		half = r.sat.throughput() / 2
		*latencyRate = half
	}
	if half > 0 {
		r.half = b.runBatch(ctx, m.name+"-half", b.cfg.latencyPods, mk, half)
		fmt.Printf("  latency batch (%.1f pods/s offered): %d of %d bound, creation → bind p50 %.0f ms, p99 %.0f ms\n",
			half, r.half.bound, r.half.want, percentile(r.half.lat, 0.5), percentile(r.half.lat, 0.99))
		check()
		b.deleteDRABatch(ctx, m.name+"-half")
	}
	after, errA := scrape(ctx, b.metricsC, schedURL+"/metrics")
	if errB == nil && errA == nil {
		r.attempts = map[string]float64{}
		prof := map[string]string{"profile": profile}
		bb := before.by("scheduler_schedule_attempts_total", prof, "result")
		for k, v := range after.by("scheduler_schedule_attempts_total", prof, "result") {
			r.attempts[k] = v - bb[k]
		}
		r.points = map[string]hist{}
		for _, p := range draPoints {
			m := map[string]string{"extension_point": p, "profile": profile}
			r.points[p] = after.histogram("scheduler_framework_extension_point_duration_seconds", m).minus(
				before.histogram("scheduler_framework_extension_point_duration_seconds", m))
		}
		r.algo = after.histogram("scheduler_scheduling_algorithm_duration_seconds", nil).minus(
			before.histogram("scheduler_scheduling_algorithm_duration_seconds", nil))
	} else {
		fmt.Printf("  FAIL kube-scheduler /metrics: %v %v\n", errB, errA)
		r.failed = true
	}
	if m.carma {
		ext1, err := extCalls()
		if extErr == nil && err == nil {
			r.extCalls = ext1 - ext0
		} else {
			fmt.Printf("  FAIL extender /metrics: %v %v\n", extErr, err)
			r.failed = true
		}
	}
	r.seconds = time.Since(t0).Seconds()
	r.machine = mw.finish()
	if r.sat.bound < r.sat.want || (r.half.ran && r.half.bound < r.half.want) || len(r.findings) > 0 || r.checks == 0 {
		r.failed = true
	}
	fmt.Printf("  %s\n", r.detail())
	return r
}

// draPoints are the extension points where DRA's plugin works: the allocator runs in Filter,
// the claim's status is written in PreBind.
var draPoints = []string{"PreFilter", "Filter", "Score", "Reserve", "PreBind"}

func (r draResult) detail() string {
	cpu := []string{}
	for _, k := range []string{"kube-scheduler", "kube-apiserver", "kube-controller-manager", "etcd", "benchmark"} {
		if v, ok := r.cpuSat[k]; ok {
			cpu = append(cpu, fmt.Sprintf("%s %.1f", k, v))
		}
	}
	att := []string{}
	for k, v := range r.attempts {
		att = append(att, fmt.Sprintf("%s %.0f", k, v))
	}
	sort.Strings(att)
	pts := []string{}
	for _, p := range draPoints {
		if h := r.points[p]; h.count > 0 {
			pts = append(pts, fmt.Sprintf("%s %s", p, ms(h.sum/h.count)))
		}
	}
	algo := "no observations"
	if r.algo.count > 0 {
		algo = ms(r.algo.sum / r.algo.count)
	}
	ext := "not called by this kube-scheduler"
	if r.mode.carma {
		ext = fmt.Sprintf("%.0f calls", r.extCalls)
	}
	return fmt.Sprintf("client QPS %g, burst %d; CPU s per 1,000 pods, saturated: %s; schedule attempts: %s; "+
		"per pod, mean: scheduling algorithm %s, %s; extender: %s; %d over-commit checks; machine: %s",
		r.qps, r.burst, strings.Join(cpu, ", "), strings.Join(att, ", "), algo, strings.Join(pts, ", "), ext, r.checks, r.machine)
}

// draLines is the summary of the DRA phases (medians over the runs):
// scale-dra <N>x<G>: kube-scheduler alone <a> pods/s (whole GPUs), with carma's slices <b> pods/s (<r> %), p99 at <R> pods/s <x> ms / <y> ms, 0 over-committed GPUs
// and a second line for the tainted phase when it ran (its counts as the API server listed them).
func draLines(nodes, gpus string, rs []draResult, latencyRate float64) []string {
	by := map[string][]draResult{}
	for _, r := range rs {
		by[r.mode.name] = append(by[r.mode.name], r)
	}
	tput := func(name string) (float64, bool) {
		var v []float64
		for _, r := range by[name] {
			v = append(v, r.sat.throughput())
		}
		return spreadOf(v).median, len(v) > 0
	}
	p99 := func(name string) string {
		var v []float64
		for _, r := range by[name] {
			if r.half.ran {
				v = append(v, percentile(r.half.lat, 0.99))
			}
		}
		if len(v) == 0 {
			return "not run"
		}
		return fmt.Sprintf("%.0f ms", spreadOf(v).median)
	}
	fig := func(name string) string {
		if t, ok := tput(name); ok {
			return fmt.Sprintf("%.1f pods/s", t)
		}
		return "not run"
	}
	findings, checks := 0, 0
	for _, r := range rs {
		findings += len(r.findings)
		checks += r.checks
	}
	ratio := "not run"
	if w, ok1 := tput("dra-whole"); ok1 && w > 0 {
		if c, ok2 := tput("dra-carma"); ok2 {
			ratio = fmt.Sprintf("%.0f %%", 100*c/w)
		}
	}
	over := fmt.Sprintf("%d over-committed GPUs", findings)
	if checks == 0 {
		over = "over-commit not checked"
	}
	out := []string{fmt.Sprintf("scale-dra %sx%s: kube-scheduler alone %s (whole GPUs), with carma's slices %s (%s), p99 at %.1f pods/s %s / %s, %s",
		nodes, gpus, fig("dra-whole"), fig("dra-carma"), ratio, latencyRate, p99("dra-whole"), p99("dra-carma"), over)}
	var repeats []string
	for _, m := range draModes {
		if len(by[m.name]) < 2 {
			continue
		}
		var t, p []float64
		for _, r := range by[m.name] {
			t = append(t, r.sat.throughput())
			if r.half.ran {
				p = append(p, percentile(r.half.lat, 0.99))
			}
		}
		repeats = append(repeats, fmt.Sprintf("repeats %s (min / median / max of %d): %s pods/s, p99 %s ms",
			m.name, len(by[m.name]), spreadOf(t).fmt("%.1f"), spreadOf(p).fmt("%.0f")))
	}
	if _, ok := tput("dra-tainted"); ok {
		cost := "not comparable"
		if c, ok := tput("dra-carma"); ok && c > 0 {
			t, _ := tput("dra-tainted")
			cost = fmt.Sprintf("%.0f %% of untainted", 100*t/c)
		}
		r0 := by["dra-tainted"][0]
		out = append(out, fmt.Sprintf("scale-dra %sx%s, %d of %d of carma's GPUs tainted: %s (%s), p99 %s",
			nodes, gpus, r0.tainted, r0.devices, fig("dra-tainted"), cost, p99("dra-tainted")))
	}
	return append(out, repeats...)
}
