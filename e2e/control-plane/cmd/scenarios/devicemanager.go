package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }

func gpuContainer(name string, n int64) v1.Container {
	return v1.Container{Name: name, Image: "example.com/train:1",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpuResource: *resource.NewQuantity(n, resource.DecimalSI)}}}
}

// dmPod is a pod pinned to node (by node selector, so kube-scheduler and the extender still place it).
func (e *env) dmPod(name, node string, init []v1.Container, containers ...v1.Container) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "devices", Annotations: map[string]string{annGPUMemory: "3Gi", annRunSeconds: "3"}},
		Spec: v1.PodSpec{
			SchedulerName: e.schedulerName, RestartPolicy: v1.RestartPolicyNever,
			NodeSelector:   map[string]string{"kubernetes.io/hostname": node},
			InitContainers: init, Containers: containers,
		},
	}
}

// checkContainers judges a device-manager admission by admissionMatches and prints what broke it.
// Returns whether the pod is consistent ("not swapped").
func (e *env) checkContainers(p *v1.Pod, rec admissionRecord) bool {
	return admissionMatches(p, rec, func(container string, assigned, got, visible, cdi []string) {
		if container == "" {
			fmt.Printf("    %s: assigned %v, not every assigned GPU reached an app container\n", p.Name, assigned)
			return
		}
		fmt.Printf("    %s/%s: assigned %v, devices on %v, NVIDIA_VISIBLE_DEVICES %v, CDI %v\n", p.Name, container, assigned, got, visible, cdi)
	})
}

// scenarioDeviceManager: the kubelet's own device manager admits every pod shape through carma's
// plugin — one Allocate per container, init containers first, GetPreferredAllocation before it — two
// same-size pods bound to one node together, and a kubelet restart (checkpoint, re-registration).
func (e *env) scenarioDeviceManager(ctx context.Context, s *summary) {
	ns := "devices"
	e.ensureNamespace(ctx, ns)
	type shape struct {
		pod         *v1.Pod
		multi, init bool
	}
	shapes := []shape{
		{e.dmPod("single", "gpu-node-3", nil, gpuContainer("train", 1)), false, false},
		{e.dmPod("two-gpu-containers", "gpu-node-3", nil, gpuContainer("trainer", 1), gpuContainer("evaluator", 1)), true, false},
		{e.dmPod("gpu-init", "gpu-node-3", []v1.Container{gpuContainer("warmup", 1)}, gpuContainer("train", 1)), false, true},
		{e.dmPod("gpu-init-two-app", "gpu-node-3", []v1.Container{gpuContainer("prepare", 2)}, gpuContainer("a", 1), gpuContainer("b", 1)), true, true},
		{e.dmPod("cpu-sidecar", "gpu-node-3", nil, gpuContainer("train", 1), v1.Container{Name: "logger", Image: "example.com/log:1"}), true, false},
		{e.dmPod("twin-a", "gpu-node-4", nil, gpuContainer("train", 1)), false, false},
		{e.dmPod("twin-b", "gpu-node-4", nil, gpuContainer("train", 1)), false, false},
	}
	var wg sync.WaitGroup
	for _, sh := range shapes {
		wg.Add(1)
		go func(p *v1.Pod) {
			defer wg.Done()
			_, err := e.kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			e.check(err == nil, "create pod %s (%v)", p.Name, err)
		}(sh.pod)
	}
	wg.Wait()
	// Same-size twins in the other order too.
	for _, n := range []string{"twin-d", "twin-c"} {
		wg.Add(1)
		go func(n string) {
			defer wg.Done()
			_, err := e.kube.CoreV1().Pods(ns).Create(ctx, e.dmPod(n, "gpu-node-4", nil, gpuContainer("train", 1)), metav1.CreateOptions{})
			e.check(err == nil, "create pod %s (%v)", n, err)
		}(n)
	}
	wg.Wait()
	shapes = append(shapes, shape{pod: &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "twin-c"}}}, shape{pod: &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "twin-d"}}})

	finished := e.waitTerminated(ctx, ns, len(shapes), 500*time.Millisecond, 2*time.Minute)
	e.check(finished, "all %d device-manager pods finished", len(shapes))
	adm := e.admissions()
	swapped := 0
	for _, sh := range shapes {
		p, err := e.kube.CoreV1().Pods(ns).Get(ctx, sh.pod.Name, metav1.GetOptions{})
		if err != nil {
			e.check(false, "get pod %s: %v", sh.pod.Name, err)
			continue
		}
		rec, admitted := adm[string(p.UID)]
		consistent := admitted && e.checkContainers(p, rec)
		e.check(p.Status.Phase == v1.PodSucceeded && consistent,
			"pod %s: %s %s; admitted by the device manager with the assigned GPUs %v in every container", p.Name, p.Status.Phase, p.Status.Message, assignedGPUs(p))
		if p.Status.Phase == v1.PodSucceeded {
			s.dmAdmitted++
			if sh.multi {
				s.dmMulti++
			}
			if sh.init {
				s.dmInit++
			}
		}
		if admitted {
			e.recordAdmission(p.Namespace, consistent)
			if !consistent {
				swapped++
			}
		}
	}

	// kubelet restart: a new device manager reads its checkpoint; the plugin re-registers.
	node := "gpu-node-3"
	e.ctlRun("restart-node", node)
	time.Sleep(3 * time.Second) // the new device manager posts the node's capacity every 2 s
	ok := poll(ctx, 500*time.Millisecond, 60*time.Second, func() bool {
		n, err := e.kube.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		q := n.Status.Allocatable[gpuResource]
		return q.Value() == gpusPerNode*replicasPerGPU
	})
	_, err := e.kube.CoreV1().Pods(ns).Create(ctx, e.dmPod("after-restart", node, nil, gpuContainer("train", 1)), metav1.CreateOptions{})
	e.check(err == nil, "create pod after-restart (%v)", err)
	var p *v1.Pod
	admittedAfter := poll(ctx, 500*time.Millisecond, time.Minute, func() bool {
		p, err = e.kube.CoreV1().Pods(ns).Get(ctx, "after-restart", metav1.GetOptions{})
		return err == nil && p.Status.Phase == v1.PodSucceeded
	})
	s.dmReregistered = ok && admittedAfter
	if admittedAfter {
		s.dmAdmitted++
	}
	phase, msg := "", ""
	if p != nil {
		phase, msg = string(p.Status.Phase), p.Status.Message
	}
	e.check(s.dmReregistered, "after a kubelet restart on %s the plugin re-registered and a new pod was admitted (%s %s)", node, phase, msg)
	e.check(swapped == 0, "no container got GPUs other than its pod's assignment (%d pods differ)", swapped)
}
