package main

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// notRun is what a summary figure reads when the part that measures it did not run.
const notRun = "not run"

// judgeRun reads the summary figures from the cluster and the monitor, asserts them, and returns the
// summary lines. Every figure is observed; none is the count a scenario meant to produce.
func (e *env) judgeRun(ctx context.Context, m *monitor, s *summary) []string {
	polls, failedPolls, lastErr, d := m.counts()
	need := int(d / minPollSpacing)
	if need < 1 {
		need = 1
	}
	e.check(polls >= need, "over-commit checker: %d successful polls in %.0f s (at least %d needed: one per %s), %d failed%s",
		polls, d.Seconds(), need, minPollSpacing, failedPolls, lastErrNote(lastErr))

	gpus := map[string]bool{}
	unjudged := 0
	for _, f := range m.real() {
		switch f.Kind {
		case findNoAssignedGPUs, findBadEstimate:
			unjudged++
		default:
			gpus[f.Key] = true
		}
		e.check(false, "over-commit checker: %s", f)
	}
	e.check(len(gpus) == 0 && unjudged == 0,
		"no GPU over its memory or replicas and every bound carma pod judged, in every namespace over the whole run (%d GPUs, %d pods)",
		len(gpus), unjudged)
	overCommit := fmt.Sprintf("%d over-committed GPUs in %d checks", len(gpus), polls)
	if unjudged > 0 {
		overCommit += fmt.Sprintf(" (%d bound pods could not be judged)", unjudged)
	}

	k, total, never := m.bound()
	e.check(total > 0 && k == total, "%d of %d submitted carma pods were bound (never bound: %v)", k, total, never)

	recoveries := notRun
	if s.ran["oom"] || s.ran["load"] {
		n, err := e.oomRecoveries(ctx)
		if e.check(err == nil, "TrainingTasks listed for OOM recoveries (%v)", err) {
			recoveries = fmt.Sprint(n)
		}
	}
	p99, failover := notRun, notRun
	if s.ran["load"] {
		p99 = fmt.Sprintf("%.0f ms", s.p99BindMs)
		failover = fmt.Sprintf("%.1f s", s.failoverS)
	}
	lines := []string{fmt.Sprintf("control-plane: %d of %d pods bound, %s OOM recoveries, %s, p99 bind %s, leader failover %s",
		k, total, recoveries, overCommit, p99, failover)}

	checked, swapped := e.admissionCounts()
	dm := "device-manager: " + notRun
	if s.ran["devicemanager"] {
		rereg := "not re-registered after restart"
		if s.dmReregistered {
			rereg = "re-registered after restart"
		}
		dm = fmt.Sprintf("device-manager: %d pods admitted (%d multi-container, %d with GPU init containers), %s",
			s.dmAdmitted, s.dmMulti, s.dmInit, rereg)
	}
	if checked > 0 {
		dm += fmt.Sprintf("; %d swapped in %d admissions checked", swapped, checked)
	}
	lines = append(lines, dm)

	hang := "operator-hang: " + notRun
	if s.hangRan {
		hang = fmt.Sprintf("operator-hang: the leader whose API server hung stepped down in %s (renew deadline %s), the other took over in %s, %d moments with two leaders in %d samples",
			seconds(s.hangDemoted), operatorRenewDeadline, seconds(s.hangTakeover), s.hangBothLeading, s.hangSamples)
	}
	lines = append(lines, hang)

	canary := "canary: " + notRun
	if s.ran["canary"] {
		canary = fmt.Sprintf("canary: %d of %d planted faults caught", s.caught, s.planted)
	}
	return append(lines, canary)
}

func lastErrNote(err string) string {
	if err == "" {
		return ""
	}
	return " (last: " + err + ")"
}

// oomRecoveries counts the TrainingTasks, in every namespace, whose status shows an attempt that ran
// out of GPU memory followed by one that succeeded.
func (e *env) oomRecoveries(ctx context.Context) (int, error) {
	list, err := e.dyn.Resource(ttGVR).Namespace("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, item := range list.Items {
		raw, _, _ := unstructured.NestedSlice(item.Object, "status", "attempts")
		var outcomes []string
		for _, a := range raw {
			if m, ok := a.(map[string]any); ok {
				outcomes = append(outcomes, fmt.Sprint(m["outcome"]))
			}
		}
		if recovered(outcomes) {
			n++
		}
	}
	return n, nil
}

// recovered: some attempt succeeded after one that ran out of GPU memory.
func recovered(outcomes []string) bool {
	oom := false
	for _, o := range outcomes {
		switch {
		case o == "GpuOutOfMemory":
			oom = true
		case oom && o == "Succeeded":
			return true
		}
	}
	return false
}

// admissionTally counts the admission checks (the devices and environment the device manager gave a
// pod against its assignment) that the scenarios made, outside the canary.
type admissionTally struct {
	checked, swapped int
}

func (e *env) admissionCounts() (checked, swapped int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.admTally.checked, e.admTally.swapped
}

// recordAdmission counts one admission check of a pod in ns; the canary's own are not counted.
func (e *env) recordAdmission(ns string, consistent bool) {
	if ns == canaryNamespace {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.admTally.checked++
	if !consistent {
		e.admTally.swapped++
	}
}
