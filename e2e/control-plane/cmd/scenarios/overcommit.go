package main

import (
	"fmt"

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

// finding is one thing the over-commit checker reports. key names the GPU (node/uuid) or the pod
// (namespace/name) it is about; pods lists every pod involved as namespace/name.
type finding struct {
	kind   string
	key    string
	detail string
	pods   []string
}

func (f finding) id() string { return f.kind + " " + f.key }

func (f finding) String() string { return fmt.Sprintf("%s %s: %s", f.kind, f.key, f.detail) }

// planted: every pod of the finding is one the canary planted.
func (f finding) planted() bool {
	for _, p := range f.pods {
		if !inCanary(p) {
			return false
		}
	}
	return len(f.pods) > 0
}

// requestsGPU: some container or init container asks for carma.io/gpu.
func requestsGPU(p *v1.Pod) bool { return overcommit.RequestsGPU(p) }

// estimateMiB reads the per-GPU reservation the extender wrote at bind.
func estimateMiB(p *v1.Pod) (int64, error) { return overcommit.EstimateMiB(p) }

// overCommitFindings judges the bound, live carma GPU pods (scheduled by scheduler) against the GPUs
// their nodes' GpuNodes list (overcommit.Findings).
func overCommitFindings(pods []v1.Pod, gpus map[string]map[string]gpu, scheduler string, replicas int) []finding {
	var out []finding
	for _, f := range overcommit.Findings(pods, gpus, scheduler, replicas) {
		out = append(out, finding{kind: f.Kind, key: f.Key, detail: f.Detail, pods: f.Pods})
	}
	return out
}
