package main

import (
	"time"

	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carma/e2e/control-plane/internal/overcommit"
)

// A bound carma pod with an assignment is listed on its GPU using its reservation (so the extender's
// warm-up lock lifts), queued once for its allocated mark, and gone from the GPU once deleted.
func TestHollowNodeListsAndMarksABoundPod(t *testing.T) {
	b := &bench{cfg: config{carmaScheduler: "carma-x"}}
	h := &hollow{b: b, totalMiB: 81920, replicas: 8, allocQ: make(chan *v1.Pod, 4),
		nodes: map[string]*hnode{}, pods: map[string]string{}, marks: map[string]bool{}}
	hn := &hnode{name: nodeName(1), gpus: []string{gpuUUID(1, 0), gpuUUID(1, 1)}, pods: []map[string]hpod{{}, {}}}
	h.nodes[hn.name] = hn
	p := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: "p", UID: types.UID("u1"), Annotations: map[string]string{
			overcommit.AnnAssignedGPUs: gpuUUID(1, 1), overcommit.AnnEstimate: `{"mib":5632}`}},
		Spec: v1.PodSpec{SchedulerName: "carma-x", NodeName: hn.name, Containers: []v1.Container{{Name: "c",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{overcommit.GPUResource: resource.MustParse("1")}}}}},
	}
	h.sawPod(p, metav1.Now().Time)
	h.sawPod(p, metav1.Now().Time) // a second version: no second mark
	if len(h.allocQ) != 1 {
		t.Fatalf("%d marks queued, want 1", len(h.allocQ))
	}
	st := h.status(hn)
	gpus := st["gpus"].([]any)
	g1 := gpus[1].(map[string]any)
	pods := g1["pods"].([]any)
	if len(pods) != 1 || g1["memoryFreeMiB"].(int64) != 81920-5632 || g1["processes"].(int64) != 1 {
		t.Fatalf("GPU 1: %v", g1)
	}
	if pod := pods[0].(map[string]any); pod["observedMiB"].(int64) != 5632 || pod["uid"] != "u1" {
		t.Fatalf("pod entry: %v", pod)
	}
	if g0 := gpus[0].(map[string]any); len(g0["pods"].([]any)) != 0 || g0["memoryFreeMiB"].(int64) != 81920 {
		t.Fatalf("GPU 0: %v", g0)
	}
	if st["podCount"].(int64) != 1 || st["updatedAt"] == "" {
		t.Fatalf("status: %v", st)
	}
	h.gonePod("u1")
	if g1 := h.status(hn)["gpus"].([]any)[1].(map[string]any); len(g1["pods"].([]any)) != 0 || !hn.dirty {
		t.Fatalf("after deletion: %v", g1)
	}
}

// A node's sampler publishes when its pods changed or its heartbeat came, and not otherwise.
func TestAHollowNodeIsDueWhenItsPodsChangedOrItsHeartbeatCame(t *testing.T) {
	now := time.Now()
	hn := &hnode{lastPub: now.Add(-2 * time.Second), beat: time.Minute}
	if hn.due(now) {
		t.Fatal("due with no change and the heartbeat a minute off")
	}
	hn.dirty = true
	if !hn.due(now) {
		t.Fatal("not due after its pods changed")
	}
	hn.dirty = false
	hn.lastPub = now.Add(-time.Minute)
	if !hn.due(now) {
		t.Fatal("not due at its heartbeat")
	}
}
