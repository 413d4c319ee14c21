package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// task reads a TrainingTask's phase and attempts.
type taskState struct {
	phase    string
	attempts []map[string]any
}

func (e *env) task(ctx context.Context, ns, name string) (taskState, error) {
	u, err := e.dyn.Resource(ttGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return taskState{}, err
	}
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	raw, _, _ := unstructured.NestedSlice(u.Object, "status", "attempts")
	var attempts []map[string]any
	for _, a := range raw {
		if m, ok := a.(map[string]any); ok {
			attempts = append(attempts, m)
		}
	}
	return taskState{phase, attempts}, nil
}

func (e *env) waitTask(ctx context.Context, ns, name, phase string, timeout time.Duration) taskState {
	var st taskState
	poll(ctx, 500*time.Millisecond, timeout, func() bool {
		s, err := e.task(ctx, ns, name)
		st = s
		return err == nil && (s.phase == phase || s.phase == "Failed" || s.phase == "Succeeded")
	})
	return st
}

// checkAttemptPod: the attempt pod went through carma — our scheduler profile, the node and GPUs the
// extender chose (GPUs of that node's GpuNode), and the device manager's admission agrees.
func (e *env) checkAttemptPod(ctx context.Context, p *v1.Pod, gn map[string]map[string]gpu, adm map[string]admissionRecord) {
	e.check(p.Spec.SchedulerName == e.schedulerName, "pod %s: schedulerName %q", p.Name, p.Spec.SchedulerName)
	e.check(p.Spec.NodeName != "" && p.Annotations[annAssignedNode] == p.Spec.NodeName,
		"pod %s: bound to %s, the node the extender chose (%s)", p.Name, p.Spec.NodeName, p.Annotations[annAssignedNode])
	gpus := assignedGPUs(p)
	known := len(gpus) > 0
	for _, u := range gpus {
		_, ok := gn[p.Spec.NodeName][u]
		known = known && ok
	}
	e.check(known, "pod %s: assigned GPUs %v are GPUs of GpuNode %s; estimate %s", p.Name, gpus, p.Spec.NodeName, p.Annotations[annEstimate])
	rec, ok := adm[string(p.UID)]
	e.check(ok && e.checkAdmission(p, rec, false), "pod %s: the device manager gave it exactly the assigned GPUs", p.Name)
}

// scenarioTasks: the three example TrainingTasks, applied as a user would.
func (e *env) scenarioTasks(ctx context.Context, s *summary) {
	files, _ := filepath.Glob(filepath.Join(e.examples, "trainingtask-*.yaml"))
	e.check(len(files) == 3, "three example TrainingTasks (%d found)", len(files))
	for _, f := range files {
		out, err := e.kubectlOut("", "apply", "-f", f)
		e.check(err == nil, "kubectl apply -f %s: %s", filepath.Base(f), strings.TrimSpace(out))
	}
	list, err := e.dyn.Resource(ttGVR).Namespace("default").List(ctx, metav1.ListOptions{})
	if !e.check(err == nil && len(list.Items) == 3, "three TrainingTasks exist") {
		return
	}
	t0 := time.Now()
	for _, item := range list.Items {
		st := e.waitTask(ctx, "default", item.GetName(), "Succeeded", 3*time.Minute)
		e.check(st.phase == "Succeeded" && len(st.attempts) == 1, "TrainingTask %s: %s after %d attempt(s), %.0f s",
			item.GetName(), st.phase, len(st.attempts), time.Since(t0).Seconds())
	}
	gn, _ := e.gpuNodes(ctx)
	adm := e.admissions()
	pods, _ := e.kube.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "carma.io/task"})
	for i := range pods.Items {
		e.checkAttemptPod(ctx, &pods.Items[i], gn, adm)
	}
	e.checkQueueClasses(ctx, pods.Items)
	out, _ := e.kubectlOut("", "get", "tt,gpunodes", "-A")
	fmt.Print(indent(out))
	e.check(strings.Contains(out, "Succeeded") && strings.Contains(out, "RESERVED-MIB") && strings.Contains(out, "SUMMARY"),
		"kubectl get tt,gpunodes shows phase, reservation and GPU summary columns")
}

// checkQueueClasses: the examples that declare expectedDurationSeconds (the CNN 5 min, the Transformer
// 2 h) got a carma-queue-* class from the operator, which the chart created and from which the API
// server's priority admission set the pod's priority: the short task above the long one, both above the
// MLP, which declares nothing and keeps priority 0.
func (e *env) checkQueueClasses(ctx context.Context, pods []v1.Pod) {
	prio := map[string]int32{}
	for i := range pods {
		p := &pods[i]
		task := p.Labels["carma.io/task"]
		var got int32
		if p.Spec.Priority != nil {
			got = *p.Spec.Priority
		}
		prio[task] = got
		class := p.Spec.PriorityClassName
		if class == "" {
			fmt.Printf("    queue order: %s has no priority class, priority %d\n", task, got)
			continue
		}
		pc, err := e.kube.SchedulingV1().PriorityClasses().Get(ctx, class, metav1.GetOptions{})
		if e.check(err == nil, "pod %s: its priority class %s exists (%v)", p.Name, class, err) {
			e.check(pc.Value == got && pc.PreemptionPolicy != nil && *pc.PreemptionPolicy == v1.PreemptNever,
				"pod %s: priority %d from class %s (value %d, preemption %v)", p.Name, got, class, pc.Value, pc.PreemptionPolicy)
		}
		fmt.Printf("    queue order: %s has priority class %s, priority %d\n", task, class, got)
	}
	cnn, tr, mlp := prio["resnet18-cifar100"], prio["encoder-12l"], prio["mlp-synthetic"]
	e.check(cnn > tr && tr > mlp && mlp == 0,
		"queue order: the 5-min CNN (%d) before the 2-h Transformer (%d) before the undeclared MLP (%d)", cnn, tr, mlp)
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ") + "\n"
}

// fakeTask is a one-GPU TrainingTask of `profile` whose attempts run runSeconds on the fake kubelet and
// end as outcomes says (see node-harness); recovery is left to the defaults when nil.
func fakeTask(ns, name string, profile, recovery map[string]any, outcomes, runSeconds string) *unstructured.Unstructured {
	spec := map[string]any{
		"gpus":         int64(1),
		"modelProfile": profile,
		"template": map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{annOutcome: outcomes, annRunSeconds: runSeconds}},
			"spec": map[string]any{"restartPolicy": "Never", "containers": []any{map[string]any{
				"name": "train", "image": "example.com/train:1", "command": []any{"python", "train.py"},
			}}},
		},
	}
	if recovery != nil {
		spec["recovery"] = recovery
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "carma.io/v1alpha1", "kind": "TrainingTask",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
}

// oomTask is an MLP task whose attempts end as outcomes says.
func oomTask(name, outcomes string, exclusiveAfter int) *unstructured.Unstructured {
	profile := map[string]any{
		"family": "mlp", "batchSize": int64(64), "parameters": int64(2_500_000), "activations": int64(6_000),
		"depth": int64(6), "activation": "ReLU", "layers": map[string]any{"linear": int64(5), "batchNorm": int64(0), "dropout": int64(1)},
	}
	recovery := map[string]any{"maxAttempts": int64(5), "backoffSeconds": int64(1), "exclusiveAfterOoms": int64(exclusiveAfter),
		"headroomMiB": int64(1024), "retriesOnFailure": int64(1)}
	return fakeTask("recovery", name, profile, recovery, outcomes, "2")
}

// scenarioOOM: CUDA out-of-memory crashes are recovered with a larger reservation at recovery priority,
// repeated ones end on an exclusive GPU, and a host-memory kill (OOMKilled) is not a GPU OOM.
func (e *env) scenarioOOM(ctx context.Context, s *summary) {
	e.ensureNamespace(ctx, "recovery")
	tasks := []struct {
		name, outcomes string
		exclusiveAfter int
	}{
		{"cuda-oom-once", "cuda-oom,succeed", 2},
		{"cuda-oom-twice", "cuda-oom,cuda-oom,succeed", 2},
		{"host-oomkilled", "oomkilled,succeed", 2},
	}
	for _, t := range tasks {
		_, err := e.dyn.Resource(ttGVR).Namespace("recovery").Create(ctx, oomTask(t.name, t.outcomes, t.exclusiveAfter), metav1.CreateOptions{})
		e.check(err == nil, "create TrainingTask recovery/%s (%v)", t.name, err)
	}
	gn, _ := e.gpuNodes(ctx)
	for _, t := range tasks {
		st := e.waitTask(ctx, "recovery", t.name, "Succeeded", 3*time.Minute)
		e.check(st.phase == "Succeeded", "TrainingTask %s: %s after %d attempts", t.name, st.phase, len(st.attempts))
		pods, _ := e.kube.CoreV1().Pods("recovery").List(ctx, metav1.ListOptions{LabelSelector: "carma.io/task=" + t.name})
		byAttempt := map[string]*v1.Pod{}
		for i := range pods.Items {
			byAttempt[pods.Items[i].Labels["carma.io/attempt"]] = &pods.Items[i]
		}
		adm := e.admissions()
		for _, p := range byAttempt {
			e.checkAttemptPod(ctx, p, gn, adm)
		}
		outcomes := []string{}
		for _, a := range st.attempts {
			outcomes = append(outcomes, fmt.Sprint(a["outcome"]))
		}
		fmt.Printf("    %s: outcomes %v\n", t.name, outcomes)
		for i := 2; i <= len(byAttempt); i++ {
			prev, cur := byAttempt[fmt.Sprint(i-1)], byAttempt[fmt.Sprint(i)]
			if prev == nil || cur == nil {
				e.check(false, "%s: attempt pods 1..%d all exist", t.name, len(byAttempt))
				continue
			}
			prevMiB, prevErr := reservationMiB(prev, 0)
			curMiB, curErr := reservationMiB(cur, 0)
			if !e.check(prevErr == nil && curErr == nil, "%s attempts %d and %d: readable reservations (%v, %v)", t.name, i-1, i, prevErr, curErr) {
				continue
			}
			gpuOOM := strings.HasPrefix(t.outcomes, "cuda-oom") && i-1 <= strings.Count(t.outcomes, "cuda-oom")
			if gpuOOM {
				e.check(cur.Spec.PriorityClassName == "carma-recovery", "%s attempt %d: priority class %q", t.name, i, cur.Spec.PriorityClassName)
				if cur.Annotations[annExclusive] == "true" {
					e.check(i > t.exclusiveAfter, "%s attempt %d: exclusive only after %d OOMs", t.name, i, t.exclusiveAfter)
				} else {
					e.check(curMiB > prevMiB, "%s attempt %d: reservation grew %d → %d MiB (%s)", t.name, i, prevMiB, curMiB, cur.Annotations[annGPUMemory])
				}
			} else {
				e.check(cur.Spec.PriorityClassName != "carma-recovery" && cur.Annotations[annExclusive] != "true" && curMiB == prevMiB,
					"%s attempt %d: a host-memory kill is retried as an ordinary failure (priority %q, exclusive %q, reservation %d → %d MiB)",
					t.name, i, cur.Spec.PriorityClassName, cur.Annotations[annExclusive], prevMiB, curMiB)
			}
		}
		switch t.name {
		case "cuda-oom-twice":
			last := byAttempt[fmt.Sprint(len(byAttempt))]
			e.check(len(byAttempt) == 3 && last != nil && last.Annotations[annExclusive] == "true",
				"%s: the third attempt runs on an exclusive GPU", t.name)
		case "host-oomkilled":
			first := strings.Join(append(outcomes, "none")[:1], "")
			e.check(first != "GpuOutOfMemory" && first != "none", "%s: OOMKilled is recorded as %s, not GpuOutOfMemory", t.name, first)
		}
	}
}
