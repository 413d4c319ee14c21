package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// canaryNode has a GpuNode but no Node and no kubelet: pods bound there stay live (nobody runs or ends
// them), so the over-commit checker must judge them. kube-scheduler never offers it (no Node object).
const canaryNode = "canary-node"

// scenarioCanary plants, through the API and around the extender, each fault a checker exists to
// catch, and passes only if the checker meant for it reports it:
//
//	(a) two pods whose estimates over-commit one GPU    → over-commit checker, over-memory
//	(b) a bound carma pod with an unparsable estimate   → over-commit checker, unparsable-estimate
//	(c) a bound carma pod without assigned GPUs         → over-commit checker, no-assigned-gpus
//	(d) more pods on one GPU than its node's replicas   → over-commit checker, over-replicas
//	(e) a pod assigned a GPU its GpuNode does not list  → over-commit checker, unknown-gpu
//	(f) an allocation swapped between two running pods  → the admission check
//
// Its pods and GpuNode are then removed so the real checks stay clean.
func (e *env) scenarioCanary(ctx context.Context, s *summary) {
	ns := canaryNamespace
	e.ensureNamespace(ctx, ns)
	defer e.removeCanary(ctx)
	gpus, replicas, ok := e.plantGpuNode(ctx)
	if !ok {
		return
	}
	t0 := time.Now()
	over := `{"mib":` + fmt.Sprint(gpus[0].TotalMiB*3/4) + `,"source":"override"}`
	planted := []struct {
		name, gpu, estimate string
		want                finding
	}{
		{"overcommit-a", gpus[0].UUID, over, finding{Kind: findOverMemory, Key: canaryNode + "/" + gpus[0].UUID}},
		{"overcommit-b", gpus[0].UUID, over, finding{Kind: findOverMemory, Key: canaryNode + "/" + gpus[0].UUID}},
		{"bad-estimate", gpus[1].UUID, `{"mib": "lots"`, finding{Kind: findBadEstimate, Key: ns + "/bad-estimate"}},
		{"no-gpus", "", `{"mib":1024,"source":"override"}`, finding{Kind: findNoAssignedGPUs, Key: ns + "/no-gpus"}},
		{"unknown-gpu", "GPU-canary-none", `{"mib":1024,"source":"override"}`, finding{Kind: findUnknownGPU, Key: canaryNode + "/GPU-canary-none"}},
	}
	// One pod more than the replicas the planted GpuNode advertises, each of a tiny share, on one GPU.
	crowded := finding{Kind: findOverReplicas, Key: canaryNode + "/" + gpus[2].UUID}
	for i := 0; i <= replicas; i++ {
		planted = append(planted, struct {
			name, gpu, estimate string
			want                finding
		}{fmt.Sprintf("crowd-%d", i), gpus[2].UUID, `{"mib":1,"source":"override"}`, crowded})
	}
	for _, p := range planted {
		e.plantBoundPod(ctx, p.name, p.gpu, p.estimate)
	}
	wanted := map[string]bool{}
	for _, p := range planted {
		if !wanted[p.want.ID()] {
			wanted[p.want.ID()] = true
			s.planted++
		}
	}
	for id := range wanted {
		var f finding
		caught := poll(ctx, 250*time.Millisecond, 20*time.Second, func() bool {
			var ok bool
			f, ok = e.mon.plantedSince(id, t0)
			return ok
		})
		if e.check(caught, "canary: planted %s is reported by the over-commit checker: %s", id, f) {
			s.caught++
		}
	}

	s.planted++
	if e.check(e.plantSwap(ctx), "canary: an allocation swapped between two running pods is reported by the admission check") {
		s.caught++
	}
}

// plantGpuNode publishes a GpuNode for canaryNode with the GPUs of gpu-node-1 under new UUIDs; it
// returns them and the replicas per GPU it advertises (gpu-node-1's).
func (e *env) plantGpuNode(ctx context.Context) ([]gpu, int, bool) {
	src, err := e.dyn.Resource(gnGVR).Get(ctx, "gpu-node-1", metav1.GetOptions{})
	if !e.check(err == nil, "canary: read GpuNode gpu-node-1 as a model (%v)", err) {
		return nil, 0, false
	}
	replicas, found, _ := unstructured.NestedInt64(src.Object, "spec", "replicasPerGpu")
	if !e.check(found && replicas > 0, "canary: GpuNode gpu-node-1 advertises its replicas per GPU (%d)", replicas) {
		return nil, 0, false
	}
	status, _, _ := unstructured.NestedMap(src.Object, "status")
	list, _, _ := unstructured.NestedSlice(status, "gpus")
	var out []gpu
	for i, g := range list {
		m, ok := g.(map[string]any)
		if !e.check(ok, "canary: GpuNode gpu-node-1 status.gpus[%d] is an object", i) {
			return nil, 0, false
		}
		m["uuid"] = fmt.Sprintf("GPU-canary-%d", i)
		raw, _ := json.Marshal(m)
		var x gpu
		_ = json.Unmarshal(raw, &x)
		out = append(out, x)
	}
	status["gpus"] = list
	status["recentlyEnded"] = []any{}
	spec, _, _ := unstructured.NestedMap(src.Object, "spec")
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "carma.io/v1alpha1", "kind": "GpuNode",
		"metadata": map[string]any{"name": canaryNode, "labels": map[string]any{labelExpect: "canary"}},
		"spec":     spec,
	}}
	created, err := e.dyn.Resource(gnGVR).Create(ctx, obj, metav1.CreateOptions{})
	if !e.check(err == nil, "canary: create GpuNode %s (%v)", canaryNode, err) {
		return nil, 0, false
	}
	created.Object["status"] = status
	_, err = e.dyn.Resource(gnGVR).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return out, int(replicas), e.check(err == nil && len(out) >= 3, "canary: GpuNode %s lists %d GPUs (%v)", canaryNode, len(out), err)
}

// plantBoundPod creates a carma GPU pod that no node can take (a node selector nothing matches), with
// the annotations the extender would write, then binds it to canaryNode itself — around the extender.
func (e *env) plantBoundPod(ctx context.Context, name, gpuUUID, estimate string) {
	ann := map[string]string{annEstimate: estimate, annAssignedNode: canaryNode}
	if gpuUUID != "" {
		ann[annAssignedGPUs] = gpuUUID
	}
	p := gpuPod(name, canaryNamespace, e.schedulerName, ann)
	p.Spec.NodeSelector = map[string]string{"e2e.carma.io/no-such-node": "true"}
	pods := e.kube.CoreV1().Pods(canaryNamespace)
	created, err := pods.Create(ctx, p, metav1.CreateOptions{})
	if !e.check(err == nil, "canary: create pod %s (%v)", name, err) {
		return
	}
	err = pods.Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: canaryNamespace, UID: created.UID},
		Target:     v1.ObjectReference{Kind: "Node", Name: canaryNode},
	}, metav1.CreateOptions{})
	e.check(err == nil, "canary: bind pod %s to %s around the extender (%v)", name, canaryNode, err)
}

// plantSwap runs two exclusive pods through carma on one node, waits until the device manager admitted
// both, swaps their carma.io/assigned-gpus and reports whether the admission check flags both.
func (e *env) plantSwap(ctx context.Context) bool {
	pods := e.kube.CoreV1().Pods(canaryNamespace)
	names := []string{"swap-a", "swap-b"}
	for _, n := range names {
		p := gpuPod(n, canaryNamespace, e.schedulerName, map[string]string{annPolicy: "exclusive", annGPUMemory: "2Gi", annRunSeconds: "600"})
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "gpu-node-1"}
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); !e.check(err == nil, "canary: create pod %s (%v)", n, err) {
			return false
		}
	}
	live := map[string]*v1.Pod{}
	var adm map[string]admissionRecord
	running := poll(ctx, 500*time.Millisecond, 90*time.Second, func() bool {
		adm = e.admissions()
		for _, n := range names {
			p, err := pods.Get(ctx, n, metav1.GetOptions{})
			if err != nil || p.Status.Phase != v1.PodRunning {
				return false
			}
			if _, ok := adm[string(p.UID)]; !ok {
				return false
			}
			live[n] = p
		}
		return true
	})
	if !e.check(running, "canary: %v run, admitted by gpu-node-1's device manager", names) {
		return false
	}
	a, b := live["swap-a"], live["swap-b"]
	ga, gb := a.Annotations[annAssignedGPUs], b.Annotations[annAssignedGPUs]
	if !e.check(ga != "" && gb != "" && ga != gb, "canary: the exclusive pods hold different GPUs (%s, %s)", ga, gb) {
		return false
	}
	before := e.checkAdmission(a, adm[string(a.UID)], true) && e.checkAdmission(b, adm[string(b.UID)], true)
	e.check(before, "canary: before the swap the admission check passes both pods")
	for _, sw := range []struct {
		p   *v1.Pod
		gpu string
	}{{a, gb}, {b, ga}} {
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annAssignedGPUs, sw.gpu)
		updated, err := pods.Patch(ctx, sw.p.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if !e.check(err == nil, "canary: patch %s's %s to %s (%v)", sw.p.Name, annAssignedGPUs, sw.gpu, err) {
			return false
		}
		*sw.p = *updated
	}
	flagged := []string{}
	for _, p := range []*v1.Pod{a, b} {
		if !e.checkAdmission(p, adm[string(p.UID)], true) {
			flagged = append(flagged, p.Name)
		}
	}
	fmt.Printf("    swapped %s ↔ %s; the admission check flags %v\n", ga, gb, flagged)
	return before && len(flagged) == 2
}

// removeCanary deletes what the canary planted (force: no kubelet ends the pods on canaryNode) and
// waits until the checker's polls no longer see it.
func (e *env) removeCanary(ctx context.Context) {
	zero := int64(0)
	pods := e.kube.CoreV1().Pods(canaryNamespace)
	err := pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	e.check(err == nil, "canary: its pods deleted (%v)", err)
	_ = e.dyn.Resource(gnGVR).Delete(ctx, canaryNode, metav1.DeleteOptions{})
	gone := poll(ctx, 250*time.Millisecond, 30*time.Second, func() bool {
		l, err := pods.List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	t := time.Now()
	seen := poll(ctx, 250*time.Millisecond, 10*time.Second, func() bool { return e.mon.pollsAfter(t) })
	e.check(gone && seen, "canary: its pods are gone and the checker polled since")
}
