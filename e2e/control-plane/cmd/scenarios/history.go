package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var mhGVR = schema.GroupVersionResource{Group: "carma.io", Version: "v1alpha1", Resource: "memoryhistories"}

// The learnedReservations values of e2e/control-plane/values.yaml: the figure the extender must reserve.
const (
	historyHeadroomPercent = 5
	historyHeadroomMinMiB  = 512
)

// learnTask is a TrainingTask of a ResNet-50-sized CNN profile whose one attempt runs long enough for
// the operator to read its memory from the GpuNode while it runs.
func learnTask(name string) *unstructured.Unstructured {
	profile := map[string]any{
		"family": "cnn", "batchSize": int64(256), "parameters": int64(25_557_032), "activations": int64(11_000_000),
		"layers": map[string]any{"conv2d": int64(53), "batchNorm": int64(53), "linear": int64(1), "adaptiveAvgPool": int64(1)},
	}
	return fakeTask("history", name, profile, nil, "succeed", "20")
}

type estimateAnnotation struct {
	MiB     int64  `json:"mib"`
	Source  string `json:"source"`
	Samples *int64 `json:"samples"`
}

func (e *env) attemptPod(ctx context.Context, task string) *v1.Pod {
	pods, err := e.kube.CoreV1().Pods("history").List(ctx, metav1.ListOptions{LabelSelector: "carma.io/task=" + task})
	if err != nil || len(pods.Items) != 1 {
		return nil
	}
	return &pods.Items[0]
}

// historyOf finds the MemoryHistory that records an attempt of history/<task>.
func (e *env) historyOf(ctx context.Context, task string) (*unstructured.Unstructured, error) {
	list, err := e.dyn.Resource(mhGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		samples, _, _ := unstructured.NestedSlice(list.Items[i].Object, "status", "samples")
		for _, s := range samples {
			if m, ok := s.(map[string]any); ok && m["task"] == "history/"+task {
				return &list.Items[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no MemoryHistory records history/%s (%d records)", task, len(list.Items))
}

// scenarioHistory: a finished attempt's observed peak is recorded cluster-wide under its profile's
// fingerprint, and the next task with that profile is reserved from it — lower than its estimate,
// above the peak — and its estimate annotation says so.
func (e *env) scenarioHistory(ctx context.Context, s *summary) {
	e.ensureNamespace(ctx, "history")
	_, err := e.dyn.Resource(ttGVR).Namespace("history").Create(ctx, learnTask("learn-first"), metav1.CreateOptions{})
	e.check(err == nil, "create TrainingTask history/learn-first (%v)", err)
	st := e.waitTask(ctx, "history", "learn-first", "Succeeded", 3*time.Minute)
	if !e.check(st.phase == "Succeeded" && len(st.attempts) == 1, "learn-first: %s after %d attempt(s)", st.phase, len(st.attempts)) {
		return
	}
	first := e.attemptPod(ctx, "learn-first")
	if !e.check(first != nil, "learn-first: its attempt pod exists") {
		return
	}
	var firstEst estimateAnnotation
	_ = json.Unmarshal([]byte(first.Annotations[annEstimate]), &firstEst)
	peak, _ := st.attempts[0]["observedPeakMiB"].(int64)
	if f, ok := st.attempts[0]["observedPeakMiB"].(float64); ok {
		peak = int64(f)
	}
	e.check(firstEst.Source != "history" && firstEst.MiB > 0, "learn-first is reserved by its estimate: %s", first.Annotations[annEstimate])
	if !e.check(peak > 0, "learn-first: the operator recorded an observed peak (attempts: %v)", st.attempts) {
		return
	}

	var rec *unstructured.Unstructured
	poll(ctx, 500*time.Millisecond, 30*time.Second, func() bool {
		rec, err = e.historyOf(ctx, "learn-first")
		return err == nil
	})
	if !e.check(rec != nil, "a MemoryHistory records learn-first (%v)", err) {
		return
	}
	completed, _, _ := unstructured.NestedInt64(rec.Object, "status", "completed")
	maxPeak, _, _ := unstructured.NestedInt64(rec.Object, "status", "maxPeakMiB")
	family, _, _ := unstructured.NestedString(rec.Object, "spec", "family")
	e.check(completed == 1 && maxPeak == peak && family == "cnn",
		"MemoryHistory %s: completed %d, maxPeakMiB %d (attempt's observed peak %d), family %q", rec.GetName(), completed, maxPeak, peak, family)

	_, err = e.dyn.Resource(ttGVR).Namespace("history").Create(ctx, learnTask("learn-second"), metav1.CreateOptions{})
	e.check(err == nil, "create TrainingTask history/learn-second (%v)", err)
	var second *v1.Pod
	poll(ctx, 250*time.Millisecond, 2*time.Minute, func() bool {
		second = e.attemptPod(ctx, "learn-second")
		return second != nil && second.Annotations[annEstimate] != ""
	})
	if !e.check(second != nil && second.Annotations[annEstimate] != "", "learn-second is bound") {
		return
	}
	var est estimateAnnotation
	_ = json.Unmarshal([]byte(second.Annotations[annEstimate]), &est)
	headroom := max((peak*historyHeadroomPercent+99)/100, historyHeadroomMinMiB)
	e.check(est.Source == "history" && est.Samples != nil && *est.Samples == 1,
		"learn-second is reserved from history with 1 sample: %s", second.Annotations[annEstimate])
	e.check(est.MiB == peak+headroom && est.MiB < firstEst.MiB && est.MiB > peak,
		"learn-second reserves peak %d + headroom %d = %d MiB, below the estimate %d MiB (got %d)",
		peak, headroom, peak+headroom, firstEst.MiB, est.MiB)
	st2 := e.waitTask(ctx, "history", "learn-second", "Succeeded", 3*time.Minute)
	e.check(st2.phase == "Succeeded", "learn-second: %s", st2.phase)
	poll(ctx, 500*time.Millisecond, 30*time.Second, func() bool {
		rec, err = e.historyOf(ctx, "learn-second")
		return err == nil
	})
	if rec != nil {
		completed, _, _ = unstructured.NestedInt64(rec.Object, "status", "completed")
	}
	e.check(rec != nil && completed == 2, "the record now rests on 2 completed runs (%d)", completed)
	out, _ := e.kubectlOut("", "get", "memoryhistories")
	fmt.Print(indent(out))
	e.check(strings.Contains(out, "MAX-PEAK-MIB") && strings.Contains(out, "COMPLETED"), "kubectl get memoryhistories shows the learned figures")
	fmt.Printf("    learned: estimate %d MiB → observed peak %d MiB → next run reserved %d MiB (source %s)\n",
		firstEst.MiB, peak, est.MiB, est.Source)
}
