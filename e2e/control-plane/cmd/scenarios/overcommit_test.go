package main

import (
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const testScheduler = "carma-test"

var testGPUs = map[string]map[string]gpu{"n1": {"G0": {UUID: "G0", TotalMiB: 1000}, "G1": {UUID: "G1", TotalMiB: 1000}}}

func boundPod(ns, name, gpus, estimate string) v1.Pod {
	ann := map[string]string{}
	if gpus != "" {
		ann[annAssignedGPUs] = gpus
	}
	if estimate != "" {
		ann[annEstimate] = estimate
	}
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: ann},
		Spec: v1.PodSpec{SchedulerName: testScheduler, NodeName: "n1", Containers: []v1.Container{{Name: "c",
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpuResource: resource.MustParse("1")}}}}},
	}
}

func kinds(fs []finding) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.ID())
	}
	return strings.Join(out, "; ")
}

func TestFitsIsClean(t *testing.T) {
	pods := []v1.Pod{boundPod("a", "p1", "G0", `{"mib":600}`), boundPod("a", "p2", "G0", `{"mib":400}`)}
	if fs := overCommitFindings(pods, testGPUs, testScheduler, 8); len(fs) != 0 {
		t.Fatalf("exactly full GPU reported: %s", kinds(fs))
	}
}

func TestOverMemoryIsFound(t *testing.T) {
	pods := []v1.Pod{boundPod("a", "p1", "G0", `{"mib":600}`), boundPod("b", "p2", "G0", `{"mib":401}`)}
	fs := overCommitFindings(pods, testGPUs, testScheduler, 8)
	if kinds(fs) != "over-memory n1/G0" || planted(fs[0]) {
		t.Fatalf("got %s", kinds(fs))
	}
}

func TestUnjudgeablePodsAreFindingsNotSkips(t *testing.T) {
	pods := []v1.Pod{
		boundPod("a", "garbled", "G0", `{"mib": "lots"`),
		boundPod("a", "missing", "G0", ""),
		boundPod("a", "zero", "G1", `{"mib":0}`),
		boundPod("a", "unassigned", "", `{"mib":10}`),
	}
	got := kinds(overCommitFindings(pods, testGPUs, testScheduler, 8))
	want := "no-assigned-gpus a/unassigned; unparsable-estimate a/garbled; unparsable-estimate a/missing; unparsable-estimate a/zero"
	if got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestExclusiveHoldsTheWholeGPU(t *testing.T) {
	ex := boundPod("a", "ex", "G1", "")
	ex.Annotations[annExclusive] = "true"
	pods := []v1.Pod{ex, boundPod("a", "small", "G1", `{"mib":1}`)}
	if got := kinds(overCommitFindings(pods, testGPUs, testScheduler, 8)); got != "over-memory n1/G1" {
		t.Fatalf("got %s", got)
	}
}

func TestReplicasAndUnknownGPUs(t *testing.T) {
	var pods []v1.Pod
	for i := 0; i < 3; i++ {
		pods = append(pods, boundPod("a", string(rune('a'+i)), "G0", `{"mib":1}`))
	}
	pods = append(pods, boundPod("a", "lost", "G9", `{"mib":1}`))
	if got := kinds(overCommitFindings(pods, testGPUs, testScheduler, 2)); got != "over-replicas n1/G0; unknown-gpu n1/G9" {
		t.Fatalf("got %s", got)
	}
}

func TestOnlyLiveBoundCarmaGPUPodsAreJudged(t *testing.T) {
	done := boundPod("a", "done", "", "")
	done.Status.Phase = v1.PodSucceeded
	pending := boundPod("a", "pending", "", "")
	pending.Spec.NodeName = ""
	other := boundPod("a", "other", "", "")
	other.Spec.SchedulerName = "default-scheduler"
	cpu := boundPod("a", "cpu", "", "")
	cpu.Spec.Containers[0].Resources = v1.ResourceRequirements{}
	init := boundPod("a", "init", "", "")
	init.Spec.InitContainers, init.Spec.Containers = init.Spec.Containers, []v1.Container{{Name: "app"}}
	got := kinds(overCommitFindings([]v1.Pod{done, pending, other, cpu, init}, testGPUs, testScheduler, 8))
	if got != "no-assigned-gpus a/init" {
		t.Fatalf("got %s", got)
	}
}

func TestPlantedOnlyWhenEveryPodIsTheCanarys(t *testing.T) {
	pods := []v1.Pod{boundPod(canaryNamespace, "p1", "G0", `{"mib":600}`), boundPod("load", "p2", "G0", `{"mib":600}`)}
	if fs := overCommitFindings(pods, testGPUs, testScheduler, 8); len(fs) != 1 || planted(fs[0]) {
		t.Fatalf("a finding with a real pod counted as planted: %v", fs)
	}
	pods[1].Namespace = canaryNamespace
	if fs := overCommitFindings(pods, testGPUs, testScheduler, 8); len(fs) != 1 || !planted(fs[0]) {
		t.Fatalf("a canary-only finding not counted as planted: %v", fs)
	}
}

func TestRecovered(t *testing.T) {
	cases := map[string]bool{
		"GpuOutOfMemory,Succeeded":                true,
		"GpuOutOfMemory,GpuOutOfMemory,Succeeded": true,
		"Succeeded,GpuOutOfMemory":                false,
		"HostOOMKilled,Succeeded":                 false,
		"GpuOutOfMemory,Failed":                   false,
		"":                                        false,
	}
	for in, want := range cases {
		if got := recovered(strings.Split(in, ",")); got != want {
			t.Errorf("recovered(%s) = %v", in, got)
		}
	}
}

type recContainer = struct {
	Devices []string          `json:"devices"`
	Env     map[string]string `json:"env"`
	CDI     []string          `json:"cdi"`
}

func gave(gpus ...string) recContainer {
	c := recContainer{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(gpus, ",")}}
	for _, g := range gpus {
		c.Devices = append(c.Devices, g+"::3")
		c.CDI = append(c.CDI, "nvidia.com/gpu="+g)
	}
	return c
}

func TestAdmissionMatchesCatchesASwap(t *testing.T) {
	p := boundPod("a", "p", "G0", `{"mib":1}`)
	rec := admissionRecord{Containers: map[string]recContainer{"c": gave("G0")}}
	if !admissionMatches(&p, rec, func(string, []string, []string, []string, []string) {}) {
		t.Fatal("a matching admission was flagged")
	}
	p.Annotations[annAssignedGPUs] = "G1"
	var flagged []string
	if admissionMatches(&p, rec, func(c string, _, _, _, _ []string) { flagged = append(flagged, c) }) || len(flagged) != 2 {
		t.Fatalf("a swapped assignment passed (%v)", flagged)
	}
}

// The load and device-manager scenarios share one rule: a pod's GPUs may be split over its
// containers, but each container's devices, environment and CDI names agree and are assigned to it,
// and the app containers together use them all.
func TestAdmissionMatchesPerContainerSubsets(t *testing.T) {
	p := boundPod("a", "p", "G0,G1", `{"mib":1}`)
	p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "d"})
	none := func(string, []string, []string, []string, []string) {}
	split := admissionRecord{Containers: map[string]recContainer{"c": gave("G0"), "d": gave("G1")}}
	if !admissionMatches(&p, split, none) {
		t.Fatal("two containers with one assigned GPU each were flagged")
	}
	half := admissionRecord{Containers: map[string]recContainer{"c": gave("G0")}}
	if admissionMatches(&p, half, none) {
		t.Fatal("an assigned GPU no app container received passed")
	}
	stray := admissionRecord{Containers: map[string]recContainer{"c": gave("G0"), "d": gave("G1", "G2")}}
	if admissionMatches(&p, stray, none) {
		t.Fatal("a container holding an unassigned GPU passed")
	}
	envOff := gave("G1")
	envOff.Env["NVIDIA_VISIBLE_DEVICES"] = "G0"
	if admissionMatches(&p, admissionRecord{Containers: map[string]recContainer{"c": gave("G0"), "d": envOff}}, none) {
		t.Fatal("a container whose environment names another GPU than its devices passed")
	}
}

// Checks from many goroutines, as the device-manager scenario makes them, are all kept.
func TestConcurrentChecksAreAllRecorded(t *testing.T) {
	e := &env{}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.check(false, "failure")
			e.recordAdmission("load", false)
		}()
	}
	wg.Wait()
	checked, swapped := e.admissionCounts()
	if len(e.failures) != 50 || checked != 50 || swapped != 50 {
		t.Fatalf("%d failures, %d checked, %d swapped recorded of 50", len(e.failures), checked, swapped)
	}
}
