package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func gpuPod(name, ns, scheduler string, ann map[string]string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann},
		Spec: v1.PodSpec{
			SchedulerName: scheduler, RestartPolicy: v1.RestartPolicyNever,
			Containers: []v1.Container{{Name: "train", Image: "example.com/train:1",
				Resources: v1.ResourceRequirements{Limits: v1.ResourceList{gpuResource: resource.MustParse("1")}}}},
		},
	}
}

// asDevicePlugin is a client with the node-bound ServiceAccount token run.sh gave node's device plugin.
func (e *env) asDevicePlugin(node string) kubernetes.Interface {
	tok, err := os.ReadFile(filepath.Join(e.work, "sa", "device-plugin-"+node, "token"))
	if err != nil {
		fatal("token of %s's device plugin: %v", node, err)
	}
	cfg := rest.AnonymousClientConfig(e.cfg)
	cfg.BearerToken = strings.TrimSpace(string(tok))
	return kubernetes.NewForConfigOrDie(cfg)
}

// scenarioPolicies: the chart's admission policies, the CRD schema and the extender's handling of a
// malformed annotation, all through the real API server.
func (e *env) scenarioPolicies(ctx context.Context, s *summary) {
	ns := "policies"
	e.ensureNamespace(ctx, ns)
	pods := e.kube.CoreV1().Pods(ns)

	// Policy 1: GPU pods are placed by carma's scheduler profile. One that names another scheduler, or
	// none (the API server then fills in default-scheduler), is steered to carma's profile at creation
	// (the chart's default on 1.36) and placed by carma like any other.
	for _, asked := range []string{"default-scheduler", ""} {
		name := "steered-gpu-" + map[string]string{"default-scheduler": "default", "": "unnamed"}[asked]
		steered := gpuPod(name, ns, asked, map[string]string{annGPUMemory: "2Gi", annRunSeconds: "30"})
		created, err := pods.Create(ctx, steered, metav1.CreateOptions{})
		if !e.check(err == nil, "a carma.io/gpu pod asking for scheduler %q is accepted (%v)", asked, err) {
			continue
		}
		e.check(created.Spec.SchedulerName == e.schedulerName && created.Annotations[annSteeredFrom] == "default-scheduler",
			"pod %s is steered to %s at admission (schedulerName %q, %s %q)", name, e.schedulerName,
			created.Spec.SchedulerName, annSteeredFrom, created.Annotations[annSteeredFrom])
		var p *v1.Pod
		poll(ctx, 300*time.Millisecond, time.Minute, func() bool {
			p, err = pods.Get(ctx, name, metav1.GetOptions{})
			return err == nil && p.Spec.NodeName != ""
		})
		e.check(p != nil && p.Spec.NodeName != "" && p.Annotations[annAssignedNode] == p.Spec.NodeName,
			"steered pod %s is bound where carma's extender chose (node %q)", name, nodeOf(p))
	}
	okPod, err := pods.Create(ctx, gpuPod("carma-gpu", ns, e.schedulerName, map[string]string{annGPUMemory: "4Gi", annRunSeconds: "30"}), metav1.CreateOptions{})
	e.check(err == nil, "a carma.io/gpu pod for %s is accepted (%v)", e.schedulerName, err)
	nodeNamed := gpuPod("node-named-gpu", ns, e.schedulerName, nil)
	nodeNamed.Spec.NodeName = "gpu-node-1"
	_, err = pods.Create(ctx, nodeNamed, metav1.CreateOptions{})
	e.check(err != nil && strings.Contains(err.Error(), "spec.nodeName"), "a carma.io/gpu pod that names its node is rejected: %v", err)

	// Policy 2: a device plugin may only touch pods of its own node (node-bound token).
	var bound *v1.Pod
	poll(ctx, 300*time.Millisecond, time.Minute, func() bool {
		p, err := pods.Get(ctx, okPod.GetName(), metav1.GetOptions{})
		bound = p
		return err == nil && p.Spec.NodeName != ""
	})
	if e.check(bound != nil && bound.Spec.NodeName != "", "pod carma-gpu is bound (%s)", bound.Spec.NodeName) {
		own := bound.Spec.NodeName
		other := "gpu-node-1"
		if own == other {
			other = "gpu-node-2"
		}
		patch := []byte(`{"metadata":{"annotations":{"e2e.carma.io/touched":"yes"}}}`)
		_, err = e.asDevicePlugin(own).CoreV1().Pods(ns).Patch(ctx, bound.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		e.check(err == nil, "the device plugin of %s may patch a pod bound to %s (%v)", own, own, err)
		_, err = e.asDevicePlugin(other).CoreV1().Pods(ns).Patch(ctx, bound.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		e.check(err != nil && strings.Contains(err.Error(), "own node"), "the device plugin of %s may not patch a pod bound to %s: %v", other, own, err)
	}

	// The CRD schema rejects malformed TrainingTasks with a message naming the field.
	bad := map[string]string{
		"gpus: -1":                         `{"gpus": -1}`,
		"modelProfile.batchSize: \"many\"": `{"gpus": 1, "modelProfile": {"family": "mlp", "batchSize": "many"}}`,
		"modelProfile.family: rnn":         `{"gpus": 1, "modelProfile": {"family": "rnn", "batchSize": 8}}`,
	}
	for what, spec := range bad {
		doc := fmt.Sprintf(`{"apiVersion":"carma.io/v1alpha1","kind":"TrainingTask","metadata":{"name":"bad","namespace":"%s"},
			"spec":{"template":{"spec":{"containers":[{"name":"t","image":"x"}]}}}}`, ns)
		u := &unstructured.Unstructured{}
		_ = u.UnmarshalJSON([]byte(doc))
		var specMap map[string]any
		_ = jsonUnmarshal(spec, &specMap)
		for k, v := range specMap {
			_ = unstructured.SetNestedField(u.Object, v, "spec", k)
		}
		_, err := e.dyn.Resource(ttGVR).Namespace(ns).Create(ctx, u, metav1.CreateOptions{})
		field := strings.SplitN(what, ":", 2)[0]
		e.check(err != nil && strings.Contains(err.Error(), "spec."+field), "TrainingTask with %s is rejected by the CRD schema: %v", what, err)
	}

	// carma's own policy through the real scheduler: a pack pod with an expected SM activity is bound.
	packPod, err := pods.Create(ctx, gpuPod("pack-gpu", ns, e.schedulerName, map[string]string{
		annPolicy: "pack", annSMActivity: "0.3", annGPUMemory: "4Gi", annRunSeconds: "30"}), metav1.CreateOptions{})
	e.check(err == nil, "a pack pod is accepted (%v)", err)
	if err == nil {
		var p *v1.Pod
		poll(ctx, 300*time.Millisecond, time.Minute, func() bool {
			p, err = pods.Get(ctx, packPod.GetName(), metav1.GetOptions{})
			return err == nil && p.Spec.NodeName != ""
		})
		e.check(p != nil && p.Spec.NodeName != "" && p.Annotations[annAssignedNode] == p.Spec.NodeName,
			"pod pack-gpu (policy pack) is bound where the extender chose (%v)", p != nil && p.Spec.NodeName != "")
	}

	// Malformed input annotations: the pod stays pending with an Event naming the annotation.
	malformed := []struct{ name, key, value string }{
		{"bad-profile", annProfile, `{"family": "mlp", "batchSize": "lots"`},
		{"bad-activity", annSMActivity, "1.5"},
	}
	for _, m := range malformed {
		badPod := gpuPod(m.name, ns, e.schedulerName, map[string]string{annPolicy: "pack", m.key: m.value})
		badPod.Labels = map[string]string{labelExpect: expectPending} // not counted among the pods that must bind
		_, err = pods.Create(ctx, badPod, metav1.CreateOptions{})
		e.check(err == nil, "a pod with a malformed %s is accepted by the API (%v)", m.key, err)
		var reason string
		ok := poll(ctx, 500*time.Millisecond, time.Minute, func() bool {
			evs, _ := e.kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("involvedObject.name", m.name).String()})
			for _, ev := range evs.Items {
				if strings.Contains(ev.Message, m.key) {
					reason = ev.Reason + ": " + ev.Message
					return true
				}
			}
			return false
		})
		p, _ := pods.Get(ctx, m.name, metav1.GetOptions{})
		e.check(ok && p != nil && p.Spec.NodeName == "", "pod %s stays pending with an Event naming %s: %s", m.name, m.key, reason)
		_ = pods.Delete(ctx, m.name, metav1.DeleteOptions{})
	}
}

// nodeOf is the pod's node, or "" while it has none (or there is no pod).
func nodeOf(p *v1.Pod) string {
	if p == nil {
		return ""
	}
	return p.Spec.NodeName
}
