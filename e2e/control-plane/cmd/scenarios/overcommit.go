package main

import (
	v1 "k8s.io/api/core/v1"

	"github.com/carma/e2e/control-plane/internal/overcommit"
)

// Kinds of over-commit findings (internal/overcommit, shared with cmd/scale).
const (
	findOverMemory     = overcommit.OverMemory     // a GPU's live reservations exceed its memory
	findOverReplicas   = overcommit.OverReplicas   // a GPU holds more pods than it advertises replicas
	findUnknownGPU     = overcommit.UnknownGPU     // a pod is assigned a GPU its node's GpuNode does not list
	findNoAssignedGPUs = overcommit.NoAssignedGPUs // a bound carma pod has no carma.io/assigned-gpus
	findBadEstimate    = overcommit.BadEstimate    // a bound, shared carma pod has no readable carma.io/estimate
	canaryNamespace    = "canary"                  // planted faults live here and nowhere else
	labelExpect        = "e2e.carma.io/expect"
	expectPending      = "pending" // a pod a scenario means to stay unbound (bad input)
)

// gpu is one GPU of a GpuNode's status.
type gpu = overcommit.GPU

// finding is one thing the over-commit checker reports (overcommit.Finding).
type finding = overcommit.Finding

// planted: every pod of the finding is one the canary planted.
func planted(f finding) bool {
	for _, p := range f.Pods {
		if !inCanary(p) {
			return false
		}
	}
	return len(f.Pods) > 0
}

// requestsGPU: some container or init container asks for carma.io/gpu.
func requestsGPU(p *v1.Pod) bool { return overcommit.RequestsGPU(p) }

// estimateMiB reads the per-GPU reservation the extender wrote at bind.
func estimateMiB(p *v1.Pod) (int64, error) { return overcommit.EstimateMiB(p) }

// overCommitFindings judges the bound, live carma GPU pods (scheduled by scheduler) against the GPUs
// their nodes' GpuNodes list (overcommit.Findings).
func overCommitFindings(pods []v1.Pod, gpus map[string]map[string]gpu, scheduler string, replicas int) []finding {
	return overcommit.Findings(pods, gpus, scheduler, replicas)
}
