package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carma/e2e/control-plane/internal/overcommit"
)

// What a hollow node is (docs/scale.md says the same): a Node object as a registered kubelet
// leaves it (capacity and allocatable of cpu, memory, pods, nvidia.com/gpu: G and carma.io/gpu:
// G × replicas as carma's device plugin advertises it through the device manager; Ready; the
// not-ready taint the API server adds on creation lifted, as the node lifecycle controller would),
// a GpuNode as carma's device plugin publishes it (publisher.rs: spec backend, replicasPerGpu, mps;
// status per GPU: index, UUID, model, memory total and free, the three risk scores, activity source,
// gate rule, sharingAllowed, healthy, processes, pods with reservedMiB / observedMiB / peakMiB;
// gpuCount, podCount, summary, updatedAt, recentlyEnded), and the two things the node's kubelet and
// device plugin do for carma:
//
//   - Allocate's mark: a carma pod bound to the node with carma.io/assigned-gpus is patched
//     carma.io/allocated: "true" as soon as the watch shows it (the device plugin does this in
//     Allocate; the extender's bind handoff waits for it);
//   - telemetry: the pod is listed on its assigned GPUs using exactly its reservation
//     (observedMiB = reservedMiB, free memory down by as much), so the extender's warm-up lock lifts
//     as it does when a real pod's memory shows; the node's GpuNode status is re-published at the
//     next sample (1 s) after its pod set changes, and otherwise once per heartbeat (5 min, the
//     device plugin's, each interval shortened by up to a tenth as the device plugin's is), so
//     telemetry never turns stale (the extender's limit is two heartbeats). The first heartbeat of
//     each node comes at a random point of its first interval, as in a cluster whose device plugins
//     started at different times: the writes at rest are then the steady N / (0.95 × heartbeat) a
//     second from the start, not none for 4.5 min and then all nodes at once.
//
// It does not run containers, report pod phases, renew Node leases or heartbeats (nothing here reads
// them: no kube-controller-manager runs), call a device plugin, or check what kubelet's device manager
// would give the container. Phase 1 (nvidia.com/gpu) pods get nothing from it: kube-scheduler's own
// bind needs no kubelet.

const (
	resGPUNvidia   = "nvidia.com/gpu"
	annAllocated   = "carma.io/allocated"
	annProfile     = "carma.io/model-profile"
	annExclusive   = overcommit.AnnExclusive
	sampleInterval = time.Second
	gateRule       = "smact-smocc-drama"
)

type hpod struct {
	namespace, name, uid string
	mib                  int64
}

type hnode struct {
	name    string
	gpus    []string // UUIDs by index
	pods    []map[string]hpod
	lastPub time.Time
	beat    time.Duration // the current heartbeat interval (jittered)
	dirty   bool
	// changedAt: when the oldest change not yet published happened (zero when none is pending).
	changedAt time.Time
}

// changed records a change of the node's pods made at at, keeping the oldest unpublished one (a
// failed publication gives its change back after newer ones may have come). Callers hold h.mu.
func (hn *hnode) changed(at time.Time) {
	if hn.changedAt.IsZero() || at.Before(hn.changedAt) {
		hn.changedAt = at
	}
	hn.dirty = true
}

// nextBeat is a heartbeat interval: base shortened by up to a tenth, at random (the device plugin's
// jittered_heartbeat does the same with a hash of the node name and its write count).
func nextBeat(base time.Duration) time.Duration {
	return base - time.Duration(rand.Int64N(int64(base/10)+1))
}

// hollow holds the hollow nodes and plays their kubelets' and device plugins' part.
type hollow struct {
	b         *bench
	totalMiB  int64
	replicas  int
	heartbeat time.Duration

	mu    sync.Mutex
	nodes map[string]*hnode
	pods  map[string]string // pod UID → node (pods listed on GPUs)
	marks map[string]bool   // pod UIDs marked (or being marked) allocated

	allocQ      chan *v1.Pod
	published   atomic.Int64
	seen        publicationWatch // when a watch of GpuNodes saw each change published
	publishing  atomic.Int64     // publications written now
	publishErrs atomic.Int64
	lastPubErr  atomic.Value // string: the last publication's error
	marked      atomic.Int64
	markErrs    atomic.Int64
	markDelay   delayLog // ms from the watch showing the pod bound to the mark's answer
}

func nodeName(i int) string { return fmt.Sprintf("hollow-%05d", i) }

func gpuUUID(node, index int) string {
	return fmt.Sprintf("GPU-%08x-%04x-4000-8000-%012x", node, index, node*1000+index)
}

// createNodes creates n Nodes and their GpuNodes, workers at a time.
func (h *hollow) createNodes(ctx context.Context, n, gpus int) error {
	h.nodes = map[string]*hnode{}
	h.pods = map[string]string{}
	h.marks = map[string]bool{}
	for i := 1; i <= n; i++ {
		// The first heartbeat at a random point of the first interval (see the comment at the top).
		hn := &hnode{name: nodeName(i), beat: time.Duration(rand.Int64N(int64(h.heartbeat) + 1))}
		for g := 0; g < gpus; g++ {
			hn.gpus = append(hn.gpus, gpuUUID(i, g))
			hn.pods = append(hn.pods, map[string]hpod{})
		}
		h.nodes[hn.name] = hn
	}
	g := new(errgroup.Group)
	g.SetLimit(32)
	for i := 1; i <= n; i++ {
		g.Go(func() error {
			if err := h.createNode(ctx, i, gpus); err != nil {
				return fmt.Errorf("%s: %w", nodeName(i), err)
			}
			return nil
		})
	}
	return g.Wait()
}

func (h *hollow) createNode(ctx context.Context, i, gpus int) error {
	name := nodeName(i)
	q := func(s string) resource.Quantity { return resource.MustParse(s) }
	res := v1.ResourceList{
		v1.ResourceCPU:         q("128"),
		v1.ResourceMemory:      q("1Ti"),
		v1.ResourcePods:        *resource.NewQuantity(int64(gpus*h.replicas+16+h.b.cfg.fillerPerNode), resource.DecimalSI),
		resGPUNvidia:           *resource.NewQuantity(int64(gpus), resource.DecimalSI),
		overcommit.GPUResource: *resource.NewQuantity(int64(gpus*h.replicas), resource.DecimalSI),
	}
	now := metav1.Now()
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"scale.carma.io/hollow": "true"}},
		Status: v1.NodeStatus{
			Capacity: res, Allocatable: res,
			Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
				Message: "hollow node", LastHeartbeatTime: now, LastTransitionTime: now}},
			Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: fmt.Sprintf("10.%d.%d.%d", 64+i>>16, (i>>8)&255, i&255)},
				{Type: v1.NodeHostName, Address: name}},
			NodeInfo: v1.NodeSystemInfo{KubeletVersion: kubeletVersion, OperatingSystem: "linux", Architecture: "amd64"},
		},
	}
	created, err := h.b.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = h.b.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return err
	}
	if len(created.Spec.Taints) > 0 {
		// The API server taints a new node not-ready; the node lifecycle controller (not run here)
		// lifts the taint once the kubelet reports Ready.
		if _, err := h.b.kube.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType,
			[]byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{}); err != nil {
			return err
		}
	}
	gn := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "carma.io/v1alpha1", "kind": "GpuNode",
		"metadata": map[string]any{
			"name":   name,
			"labels": map[string]any{"app.kubernetes.io/managed-by": "carma-device-plugin"},
			"ownerReferences": []any{map[string]any{"apiVersion": "v1", "kind": "Node", "name": name,
				"uid": string(created.UID)}},
		},
		"spec": map[string]any{"backend": "simulated", "replicasPerGpu": int64(h.replicas), "mps": false},
	}}
	if _, err := h.b.dyn.Resource(gnGVR).Create(ctx, gn, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return h.publish(ctx, name)
}

// status is the GpuNode status of hn as the device plugin would publish it now. Callers hold h.mu.
func (h *hollow) status(hn *hnode) map[string]any {
	var gpus []any
	var summary []string
	podCount := 0
	for idx, uuid := range hn.gpus {
		used := int64(0)
		var pods []any
		keys := make([]string, 0, len(hn.pods[idx]))
		for uid := range hn.pods[idx] {
			keys = append(keys, uid)
		}
		sort.Strings(keys)
		for _, uid := range keys {
			p := hn.pods[idx][uid]
			used += p.mib
			pods = append(pods, map[string]any{"namespace": p.namespace, "name": p.name, "uid": p.uid,
				"reservedMiB": p.mib, "observedMiB": p.mib, "peakMiB": p.mib})
		}
		podCount += len(keys)
		free := h.totalMiB - used
		if free < 0 {
			free = 0
		}
		n := float64(len(keys))
		sm := math.Min(0.1*n, 0.6)
		round3 := func(x float64) float64 { return math.Round(x*1000) / 1000 }
		if pods == nil {
			pods = []any{}
		}
		gpus = append(gpus, map[string]any{
			"index": int64(idx), "uuid": uuid, "model": fmt.Sprintf("carma hollow GPU %dGiB", h.totalMiB/1024),
			"memoryTotalMiB": h.totalMiB, "memoryFreeMiB": free,
			"smActivity": round3(sm), "smOccupancy": round3(0.5 * sm), "dramActivity": round3(0.3 * sm),
			"activitySource": "simulated", "gateRule": gateRule, "sharingAllowed": true,
			"powerWatts": round3(55 + 300*sm), "healthy": true, "processes": int64(len(keys)), "pods": pods,
		})
		if len(keys) == 0 {
			summary = append(summary, fmt.Sprintf("%d:idle", idx))
		} else {
			summary = append(summary, fmt.Sprintf("%d:%d/%dGiB %.0f%%", idx, used/1024, h.totalMiB/1024, 100*sm))
		}
	}
	return map[string]any{
		"gpus": gpus, "gpuCount": int64(len(hn.gpus)), "podCount": int64(podCount),
		"summary":   fmt.Sprint(summary),
		"updatedAt": time.Now().UTC().Format(time.RFC3339), "recentlyEnded": []any{},
	}
}

// publish writes node's GpuNode status (a JSON merge patch of the status subresource, as the device
// plugin writes it).
func (h *hollow) publish(ctx context.Context, node string) error {
	h.publishing.Add(1)
	defer h.publishing.Add(-1)
	h.mu.Lock()
	hn := h.nodes[node]
	st := h.status(hn)
	change := hn.changedAt
	hn.changedAt = time.Time{}
	hn.dirty = false
	if !hn.lastPub.IsZero() {
		hn.beat = nextBeat(h.heartbeat)
	}
	hn.lastPub = time.Now()
	h.mu.Unlock()
	out, err := h.b.patchStatus(ctx, node, st)
	if err != nil {
		h.publishErrs.Add(1)
		h.lastPubErr.Store(err.Error())
		h.mu.Lock()
		if !change.IsZero() {
			hn.changed(change)
		}
		hn.dirty = true
		h.mu.Unlock()
		return err
	}
	h.published.Add(1)
	if !change.IsZero() {
		h.seen.expect(node, out.GetResourceVersion(), change)
	}
	return nil
}

// patchStatus writes status st of node's GpuNode as the device plugin does: a JSON merge patch of
// the status subresource, on the publications' own connection.
func (b *bench) patchStatus(ctx context.Context, node string, st map[string]any) (*unstructured.Unstructured, error) {
	raw, err := json.Marshal(map[string]any{"status": st})
	if err != nil {
		return nil, err
	}
	return b.pubDyn.Resource(gnGVR).Patch(ctx, node, types.MergePatchType, raw, metav1.PatchOptions{}, "status")
}

// run marks bound carma pods allocated and publishes each node's GpuNode status on that node's own
// sample clock, until ctx ends.
func (h *hollow) run(ctx context.Context) {
	// As many markers as nodes, and a sampler per node: on a cluster each node's device plugin marks
	// and publishes its own pods, in parallel with every other node's, so no node waits behind
	// another's. Each device plugin samples every second from the moment it started, so the nodes'
	// samples fall at different points of the second: one clock shared by all nodes would send every
	// node's publication in the same instant, a burst of writes once a second that a cluster does not
	// see and that every other request would queue behind.
	h.mu.Lock()
	writers := max(16, len(h.nodes))
	names := make([]string, 0, len(h.nodes))
	for name := range h.nodes {
		names = append(names, name)
	}
	h.mu.Unlock()
	h.allocQ = make(chan *v1.Pod, 1<<16)
	for w := 0; w < writers; w++ {
		go h.allocator(ctx)
	}
	for _, name := range names {
		go h.sampler(ctx, name, time.Duration(rand.Int64N(int64(sampleInterval))))
	}
}

// sampler is one node's device plugin sampling: first after phase, then every sample interval, it
// publishes the node's status when its pods changed or its heartbeat is due. A failed publication
// marks the node dirty again (publish), so the next sample retries it.
func (h *hollow) sampler(ctx context.Context, name string, phase time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(phase):
	}
	t := time.NewTicker(sampleInterval)
	defer t.Stop()
	for {
		h.mu.Lock()
		due := h.nodes[name].due(time.Now())
		h.mu.Unlock()
		if due {
			_ = h.publish(ctx, name)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// unpublished counts the nodes whose pods changed since their last publication and the publications
// still being written.
func (h *hollow) unpublished() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := int(h.publishing.Load())
	for _, hn := range h.nodes {
		if hn.dirty {
			n++
		}
	}
	return n
}

// due: the node's pods changed since its last publication, or its heartbeat is due.
func (hn *hnode) due(now time.Time) bool {
	return hn.dirty || now.Sub(hn.lastPub) >= hn.beat
}

func (h *hollow) allocator(ctx context.Context) {
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, annAllocated))
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-h.allocQ:
			seen := time.Now()
			if v, ok := p.Annotations["scale.carma.io/bound-seen"]; ok {
				if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
					seen = t
				}
			}
			_, err := h.b.markKube.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
			if err != nil {
				if !apierrors.IsNotFound(err) {
					h.markErrs.Add(1)
				}
				continue
			}
			h.marked.Add(1)
			h.markDelay.add(float64(time.Since(seen).Microseconds()) / 1000)
		}
	}
}

// sawPod is called from the pod informer (one goroutine) with every version of every pod of the
// benchmark's namespace: a bound carma pod with an assignment is listed on its GPUs and, once,
// marked allocated.
func (h *hollow) sawPod(p *v1.Pod, boundSeen time.Time) {
	if p.Spec.SchedulerName != h.b.cfg.carmaScheduler || p.Spec.NodeName == "" || !overcommit.RequestsGPU(p) {
		return
	}
	gpus := overcommit.AssignedGPUs(p)
	if len(gpus) == 0 {
		return
	}
	uid := string(p.UID)
	h.mu.Lock()
	defer h.mu.Unlock()
	hn := h.nodes[p.Spec.NodeName]
	if hn == nil {
		return
	}
	if _, listed := h.pods[uid]; !listed {
		mib, err := overcommit.EstimateMiB(p)
		if p.Annotations[annExclusive] == "true" || err != nil {
			mib = h.totalMiB
		}
		for i, u := range hn.gpus {
			for _, a := range gpus {
				if a == u {
					hn.pods[i][uid] = hpod{namespace: p.Namespace, name: p.Name, uid: uid, mib: mib}
				}
			}
		}
		h.pods[uid] = hn.name
		hn.changed(time.Now())
	}
	if p.Annotations[annAllocated] != "true" && !h.marks[uid] {
		h.marks[uid] = true
		q := p.DeepCopy()
		if q.Annotations == nil {
			q.Annotations = map[string]string{}
		}
		q.Annotations["scale.carma.io/bound-seen"] = boundSeen.Format(time.RFC3339Nano)
		select {
		case h.allocQ <- q:
		default:
			h.markErrs.Add(1)
		}
	}
}

// gonePod: the pod was deleted; its GPUs are free of it.
func (h *hollow) gonePod(uid string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.marks, uid)
	node, ok := h.pods[uid]
	if !ok {
		return
	}
	delete(h.pods, uid)
	hn := h.nodes[node]
	for i := range hn.pods {
		delete(hn.pods[i], uid)
	}
	hn.changed(time.Now())
}

// markDelays returns the allocated marks' delays so far (ms), sorted, and resets them.
func (h *hollow) markDelays() []float64 { return h.markDelay.take() }
