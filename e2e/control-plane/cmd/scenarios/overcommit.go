package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Kinds of over-commit findings.
const (
	findOverMemory     = "over-memory"         // a GPU's live reservations exceed its memory
	findOverReplicas   = "over-replicas"       // a GPU holds more pods than it advertises replicas
	findUnknownGPU     = "unknown-gpu"         // a pod is assigned a GPU its node's GpuNode does not list
	findNoAssignedGPUs = "no-assigned-gpus"    // a bound carma pod has no carma.io/assigned-gpus
	findBadEstimate    = "unparsable-estimate" // a bound, shared carma pod has no readable carma.io/estimate
	canaryNamespace    = "canary"              // planted faults live here and nowhere else
	labelExpect        = "e2e.carma.io/expect"
	expectPending      = "pending" // a pod a scenario means to stay unbound (bad input)
)

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
func requestsGPU(p *v1.Pod) bool {
	has := func(cs []v1.Container) bool {
		for _, c := range cs {
			if _, ok := c.Resources.Limits[gpuResource]; ok {
				return true
			}
			if _, ok := c.Resources.Requests[gpuResource]; ok {
				return true
			}
		}
		return false
	}
	return has(p.Spec.Containers) || has(p.Spec.InitContainers)
}

// estimateMiB reads the per-GPU reservation the extender wrote at bind.
func estimateMiB(p *v1.Pod) (int64, error) {
	raw, ok := p.Annotations[annEstimate]
	if !ok {
		return 0, fmt.Errorf("no %s annotation", annEstimate)
	}
	var est struct {
		MiB *int64 `json:"mib"`
	}
	if err := json.Unmarshal([]byte(raw), &est); err != nil {
		return 0, fmt.Errorf("%s %q: %v", annEstimate, raw, err)
	}
	if est.MiB == nil || *est.MiB <= 0 {
		return 0, fmt.Errorf("%s %q has no positive mib", annEstimate, raw)
	}
	return *est.MiB, nil
}

// overCommitFindings judges the bound, live carma GPU pods (scheduled by scheduler) against the GPUs
// their nodes' GpuNodes list: memory and replicas per GPU, and every pod must say which GPUs it holds
// and how much of each. A pod that cannot be judged is a finding, never a skip.
func overCommitFindings(pods []v1.Pod, gpus map[string]map[string]gpu, scheduler string, replicas int) []finding {
	type use struct {
		mib  int64
		pods []string
	}
	per := map[string]*use{}
	var out []finding
	for i := range pods {
		p := &pods[i]
		if p.Spec.SchedulerName != scheduler || p.Spec.NodeName == "" || terminated(p) || !requestsGPU(p) {
			continue
		}
		ref := p.Namespace + "/" + p.Name
		assigned := assignedGPUs(p)
		if len(assigned) == 0 {
			out = append(out, finding{findNoAssignedGPUs, ref, "bound to " + p.Spec.NodeName + " without " + annAssignedGPUs, []string{ref}})
			continue
		}
		exclusive := p.Annotations[annExclusive] == "true"
		mib, err := int64(0), error(nil)
		if !exclusive {
			if mib, err = estimateMiB(p); err != nil {
				out = append(out, finding{findBadEstimate, ref, err.Error(), []string{ref}})
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
			out = append(out, finding{findUnknownGPU, key, fmt.Sprintf("GpuNode %s lists no such GPU (pods %v)", node, u.pods), u.pods})
		case u.mib > g.TotalMiB:
			out = append(out, finding{findOverMemory, key, fmt.Sprintf("%d MiB reserved on %d MiB by %v", u.mib, g.TotalMiB, u.pods), u.pods})
		}
		if ok && len(u.pods) > replicas {
			out = append(out, finding{findOverReplicas, key, fmt.Sprintf("%d pods on a GPU advertised as %d replicas: %v", len(u.pods), replicas, u.pods), u.pods})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id() < out[j].id() })
	return out
}
