// Package overcommit is the pure over-commit checker the control-plane harness programs share
// (cmd/scenarios runs it during the scenarios, cmd/scale after each benchmark batch): the bound, live
// carma GPU pods of one scheduler judged against the GPUs their nodes' GpuNodes list — memory and
// replicas per GPU — and every pod must say which GPUs it holds and how much of each. A pod that
// cannot be judged is a finding, never a skip.
package overcommit

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Names the checker reads (api/src/names.rs).
const (
	GPUResource     = "carma.io/gpu"
	AnnAssignedGPUs = "carma.io/assigned-gpus"
	AnnEstimate     = "carma.io/estimate"
	AnnExclusive    = "carma.io/exclusive"
)

// Kinds of findings.
const (
	OverMemory     = "over-memory"         // a GPU's live reservations exceed its memory
	OverReplicas   = "over-replicas"       // a GPU holds more pods than it advertises replicas
	UnknownGPU     = "unknown-gpu"         // a pod is assigned a GPU its node's GpuNode does not list
	NoAssignedGPUs = "no-assigned-gpus"    // a bound carma pod has no carma.io/assigned-gpus
	BadEstimate    = "unparsable-estimate" // a bound, shared carma pod has no readable carma.io/estimate
)

// GPU is one GPU of a GpuNode's status.
type GPU struct {
	UUID     string `json:"uuid"`
	TotalMiB int64  `json:"memoryTotalMiB"`
}

// Finding is one thing the checker reports. Key names the GPU (node/uuid) or the pod
// (namespace/name) it is about; Pods lists every pod involved as namespace/name.
type Finding struct {
	Kind   string
	Key    string
	Detail string
	Pods   []string
}

// ID is the finding's kind and key.
func (f Finding) ID() string { return f.Kind + " " + f.Key }

func (f Finding) String() string { return fmt.Sprintf("%s %s: %s", f.Kind, f.Key, f.Detail) }

// RequestsGPU: some container or init container asks for carma.io/gpu.
func RequestsGPU(p *v1.Pod) bool {
	has := func(cs []v1.Container) bool {
		for _, c := range cs {
			if _, ok := c.Resources.Limits[GPUResource]; ok {
				return true
			}
			if _, ok := c.Resources.Requests[GPUResource]; ok {
				return true
			}
		}
		return false
	}
	return has(p.Spec.Containers) || has(p.Spec.InitContainers)
}

// EstimateMiB reads the per-GPU reservation the extender wrote at bind.
func EstimateMiB(p *v1.Pod) (int64, error) {
	raw, ok := p.Annotations[AnnEstimate]
	if !ok {
		return 0, fmt.Errorf("no %s annotation", AnnEstimate)
	}
	var est struct {
		MiB *int64 `json:"mib"`
	}
	if err := json.Unmarshal([]byte(raw), &est); err != nil {
		return 0, fmt.Errorf("%s %q: %v", AnnEstimate, raw, err)
	}
	if est.MiB == nil || *est.MiB <= 0 {
		return 0, fmt.Errorf("%s %q has no positive mib", AnnEstimate, raw)
	}
	return *est.MiB, nil
}

// AssignedGPUs reads carma.io/assigned-gpus, sorted.
func AssignedGPUs(p *v1.Pod) []string {
	s := strings.TrimSpace(p.Annotations[AnnAssignedGPUs])
	if s == "" {
		return nil
	}
	out := strings.Split(s, ",")
	sort.Strings(out)
	return out
}

// Terminated: the pod has Succeeded or Failed.
func Terminated(p *v1.Pod) bool {
	return p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed
}

// Findings judges the bound, live carma GPU pods (scheduled by scheduler) against gpus (node → GPU
// UUID → GPU, from the GpuNodes), with at most replicas pods per GPU. Sorted by ID.
func Findings(pods []v1.Pod, gpus map[string]map[string]GPU, scheduler string, replicas int) []Finding {
	type use struct {
		mib  int64
		pods []string
	}
	per := map[string]*use{}
	var out []Finding
	for i := range pods {
		p := &pods[i]
		if p.Spec.SchedulerName != scheduler || p.Spec.NodeName == "" || Terminated(p) || !RequestsGPU(p) {
			continue
		}
		ref := p.Namespace + "/" + p.Name
		assigned := AssignedGPUs(p)
		if len(assigned) == 0 {
			out = append(out, Finding{NoAssignedGPUs, ref, "bound to " + p.Spec.NodeName + " without " + AnnAssignedGPUs, []string{ref}})
			continue
		}
		exclusive := p.Annotations[AnnExclusive] == "true"
		mib, err := int64(0), error(nil)
		if !exclusive {
			if mib, err = EstimateMiB(p); err != nil {
				out = append(out, Finding{BadEstimate, ref, err.Error(), []string{ref}})
			}
		}
		for _, u := range assigned {
			key := p.Spec.NodeName + "/" + u
			if per[key] == nil {
				per[key] = &use{}
			}
			g, known := gpus[p.Spec.NodeName][u]
			switch {
			case exclusive && known:
				per[key].mib += g.TotalMiB
			case !exclusive && err == nil:
				per[key].mib += mib
			}
			per[key].pods = append(per[key].pods, ref)
		}
	}
	for key, u := range per {
		node, uuid, _ := strings.Cut(key, "/")
		sort.Strings(u.pods)
		g, ok := gpus[node][uuid]
		switch {
		case !ok:
			out = append(out, Finding{UnknownGPU, key, fmt.Sprintf("GpuNode %s lists no such GPU (pods %v)", node, u.pods), u.pods})
		case u.mib > g.TotalMiB:
			out = append(out, Finding{OverMemory, key, fmt.Sprintf("%d MiB reserved on %d MiB by %v", u.mib, g.TotalMiB, u.pods), u.pods})
		}
		if ok && len(u.pods) > replicas {
			out = append(out, Finding{OverReplicas, key, fmt.Sprintf("%d pods on a GPU advertised as %d replicas: %v", len(u.pods), replicas, u.pods), u.pods})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out
}

// GPUsOf reads the GPUs each GpuNode's status lists (node → GPU UUID → GPU) and the smallest
// spec.replicasPerGpu among them: the figures Findings judges pods against. A GpuNode whose status
// cannot be read lists no GPUs, so its pods are findings (unknown-gpu), never skipped; one without a
// positive replicasPerGpu does not count towards the minimum (0 when no GpuNode gives one).
func GPUsOf(gpuNodes []unstructured.Unstructured) (map[string]map[string]GPU, int) {
	gpus := map[string]map[string]GPU{}
	replicas := 0
	for _, item := range gpuNodes {
		raw, _, _ := unstructured.NestedSlice(item.Object, "status", "gpus")
		m := map[string]GPU{}
		for _, g := range raw {
			j, err := json.Marshal(g)
			if err != nil {
				continue
			}
			var x GPU
			if json.Unmarshal(j, &x) == nil && x.UUID != "" {
				m[x.UUID] = x
			}
		}
		gpus[item.GetName()] = m
		// A GpuNode that does not say (yet) leaves the minimum to those that do.
		r, found, _ := unstructured.NestedInt64(item.Object, "spec", "replicasPerGpu")
		if !found || r <= 0 {
			continue
		}
		if replicas == 0 || int(r) < replicas {
			replicas = int(r)
		}
	}
	return gpus, replicas
}
