package overcommit

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func gpuNode(name string, replicas int64, uuids ...string) unstructured.Unstructured {
	var gpus []interface{}
	for _, u := range uuids {
		gpus = append(gpus, map[string]interface{}{"uuid": u, "memoryTotalMiB": int64(81920)})
	}
	return unstructured.Unstructured{Object: map[string]interface{}{
		"metadata": map[string]interface{}{"name": name},
		"spec":     map[string]interface{}{"replicasPerGpu": replicas},
		"status":   map[string]interface{}{"gpus": gpus},
	}}
}

func gpuPod(name, node, gpu, estimate string) v1.Pod {
	return v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name,
			Annotations: map[string]string{AnnAssignedGPUs: gpu, AnnEstimate: estimate}},
		Spec: v1.PodSpec{SchedulerName: "carma", NodeName: node, Containers: []v1.Container{{
			Resources: v1.ResourceRequirements{Limits: v1.ResourceList{GPUResource: resource.MustParse("1")}}}}},
		Status: v1.PodStatus{Phase: v1.PodRunning},
	}
}

// The GpuNodes' GPUs and replicas, read as Findings needs them: two pods within a GPU's memory pass,
// a planted third that overflows it is found, and a GPU no GpuNode lists is found too.
func TestGPUsOfFeedsFindings(t *testing.T) {
	gpus, replicas := GPUsOf([]unstructured.Unstructured{gpuNode("n1", 4, "GPU-a", "GPU-b"), gpuNode("n2", 8, "GPU-c")})
	if replicas != 4 || len(gpus["n1"]) != 2 || gpus["n2"]["GPU-c"].TotalMiB != 81920 {
		t.Fatalf("GPUsOf: replicas %d, gpus %v", replicas, gpus)
	}
	// A GpuNode that does not give replicasPerGpu (not yet published) leaves the minimum alone.
	unsaid := gpuNode("n3", 0, "GPU-d")
	delete(unsaid.Object["spec"].(map[string]interface{}), "replicasPerGpu")
	if _, r := GPUsOf([]unstructured.Unstructured{gpuNode("n1", 4, "GPU-a"), unsaid, gpuNode("n2", 8, "GPU-c")}); r != 4 {
		t.Fatalf("a GpuNode without replicasPerGpu moved the minimum to %d", r)
	}
	pods := []v1.Pod{gpuPod("a", "n1", "GPU-a", `{"mib":40000}`), gpuPod("b", "n1", "GPU-a", `{"mib":40000}`)}
	if f := Findings(pods, gpus, "carma", replicas); len(f) != 0 {
		t.Fatalf("within memory: %v", f)
	}
	pods = append(pods, gpuPod("c", "n1", "GPU-a", `{"mib":2000}`), gpuPod("d", "n2", "GPU-z", `{"mib":1}`))
	f := Findings(pods, gpus, "carma", replicas)
	if len(f) != 2 || f[0].Kind != OverMemory || f[0].Key != "n1/GPU-a" || f[1].Kind != UnknownGPU {
		t.Fatalf("planted faults: %v", f)
	}
}
