package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carma/e2e/control-plane/internal/overcommit"
)

const (
	gpuResource     = "carma.io/gpu"
	annAssignedGPUs = "carma.io/assigned-gpus"
	annAssignedNode = "carma.io/assigned-node"
	annEstimate     = "carma.io/estimate"
	annExclusive    = "carma.io/exclusive"
	annGPUMemory    = "carma.io/gpu-memory"
	annProfile      = "carma.io/model-profile"
	annPolicy       = "carma.io/policy"
	annSMActivity   = "carma.io/sm-activity"
	annOutcome      = "e2e.carma.io/outcome"
	annRunSeconds   = "e2e.carma.io/run-seconds"
	annSteeredFrom  = "carma.io/steered-from-scheduler"
	replicasPerGPU  = 8
	gpusPerNode     = 8
)

// gpuNodes maps node → GPU UUID → GPU, read from the GpuNodes the device plugins publish.
func (e *env) gpuNodes(ctx context.Context) (map[string]map[string]gpu, error) {
	gpus, _, err := e.gpuNodesAndReplicas(ctx)
	return gpus, err
}

// gpuNodesAndReplicas: the GpuNodes' GPUs and the smallest replicasPerGpu they publish, read by the
// same rule as every other over-commit checker (overcommit.GPUsOf).
func (e *env) gpuNodesAndReplicas(ctx context.Context) (map[string]map[string]gpu, int, error) {
	list, err := e.dyn.Resource(gnGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, 0, err
	}
	gpus, replicas := overcommit.GPUsOf(list.Items)
	return gpus, replicas, nil
}

func (e *env) waitReady(ctx context.Context, _ *summary) {
	want := int64(gpusPerNode * replicasPerGPU)
	ok := poll(ctx, time.Second, 90*time.Second, func() bool {
		nodes, err := e.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil || len(nodes.Items) < e.nodes {
			return false
		}
		for _, n := range nodes.Items {
			q := n.Status.Allocatable[gpuResource]
			if q.Value() != want {
				return false
			}
		}
		g, err := e.gpuNodes(ctx)
		if err != nil || len(g) < e.nodes {
			return false
		}
		for _, m := range g {
			if len(m) != gpusPerNode {
				return false
			}
		}
		resp, err := http.Get(e.extender + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	e.check(ok, "%d nodes advertise %d %s through the kubelet device manager, GpuNodes list %d GPUs each, the extender is ready",
		e.nodes, want, gpuResource, gpusPerNode)
}

// reservationMiB is what a bound pod holds on each of its GPUs: the whole GPU (gpuTotal) when
// exclusive, else the estimate the extender wrote at bind; an unreadable estimate is an error.
func reservationMiB(p *v1.Pod, gpuTotal int64) (int64, error) {
	if p.Annotations[annExclusive] == "true" {
		return gpuTotal, nil
	}
	return estimateMiB(p)
}

func assignedGPUs(p *v1.Pod) []string { return overcommit.AssignedGPUs(p) }

func terminated(p *v1.Pod) bool { return overcommit.Terminated(p) }

// admissionRecord is one line the node harness wrote for an admitted pod.
type admissionRecord struct {
	Node       string `json:"node"`
	Namespace  string `json:"namespace"`
	Pod        string `json:"pod"`
	UID        string `json:"uid"`
	Containers map[string]struct {
		Devices []string          `json:"devices"`
		Env     map[string]string `json:"env"`
		CDI     []string          `json:"cdi"`
	} `json:"containers"`
}

// admissions reads every node's records, keyed by pod UID.
func (e *env) admissions() map[string]admissionRecord {
	out := map[string]admissionRecord{}
	files, _ := filepath.Glob(filepath.Join(e.work, "nodes", "*.admitted.jsonl"))
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var r admissionRecord
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				out[r.UID] = r
			}
		}
		fh.Close()
	}
	return out
}

// cdiGPUs turns CDI names nvidia.com/gpu=<UUID> into their sorted GPU UUIDs.
func cdiGPUs(names []string) []string {
	var out []string
	for _, n := range names {
		if u, ok := strings.CutPrefix(n, "nvidia.com/gpu="); ok {
			out = append(out, u)
		}
	}
	sort.Strings(out)
	return out
}

// deviceGPUs turns replica IDs <UUID>::<k> into their sorted, distinct GPU UUIDs.
func deviceGPUs(ids []string) []string {
	set := map[string]bool{}
	for _, id := range ids {
		u, _, _ := strings.Cut(id, "::")
		set[u] = true
	}
	var out []string
	for u := range set {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// checkAdmission: what the device manager gave each GPU container of a bound pod agrees with the
// extender's assignment (admissionMatches). Returns false for a swapped or missing assignment; the
// check is counted in the summary.
func (e *env) checkAdmission(p *v1.Pod, rec admissionRecord, quiet bool) bool {
	ok := admissionMatches(p, rec, func(container string, assigned, got, visible, cdi []string) {
		if !quiet {
			e.check(false, "pod %s container %s: assigned %v, kubelet's devices on %v, NVIDIA_VISIBLE_DEVICES %v, CDI %v",
				p.Name, container, assigned, got, visible, cdi)
		}
	})
	e.recordAdmission(p.Namespace, ok)
	return ok
}

// admissionMatches is the one rule both the load and the device-manager scenarios judge an admission
// by: per GPU container, the devices kubelet's device manager chose, NVIDIA_VISIBLE_DEVICES and the
// CDI names name the same GPUs, every one of them assigned to the pod (a container may hold a subset:
// a pod's GPUs are split over its containers); together the app containers use every assigned GPU.
// mismatch is called for each container that breaks the rule, and once with container "" when the
// app containers leave an assigned GPU unused.
func admissionMatches(p *v1.Pod, rec admissionRecord, mismatch func(container string, assigned, got, visible, cdi []string)) bool {
	assigned := assignedGPUs(p)
	in := map[string]bool{}
	for _, u := range assigned {
		in[u] = true
	}
	app := map[string]bool{}
	for _, c := range p.Spec.Containers {
		app[c.Name] = true
	}
	used := map[string]bool{}
	ok := len(rec.Containers) > 0
	names := make([]string, 0, len(rec.Containers))
	for name := range rec.Containers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c := rec.Containers[name]
		dev := deviceGPUs(c.Devices)
		vis := strings.Split(c.Env["NVIDIA_VISIBLE_DEVICES"], ",")
		sort.Strings(vis)
		cdi := cdiGPUs(c.CDI)
		same := len(dev) > 0 && strings.Join(dev, ",") == strings.Join(vis, ",") && strings.Join(dev, ",") == strings.Join(cdi, ",")
		for _, u := range dev {
			same = same && in[u]
			if app[name] && in[u] {
				used[u] = true
			}
		}
		if !same {
			ok = false
			mismatch(name, assigned, dev, vis, cdi)
		}
	}
	if len(used) != len(assigned) {
		ok = false
		mismatch("", assigned, nil, nil, nil)
	}
	return ok
}

// ensureNamespace creates ns and its default ServiceAccount (no kube-controller-manager runs here to
// create the latter).
func (e *env) ensureNamespace(ctx context.Context, ns string) {
	_, _ = e.kube.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	_, _ = e.kube.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
}

// waitTerminated polls until want pods of ns have ended (Succeeded or Failed).
func (e *env) waitTerminated(ctx context.Context, ns string, want int, interval, timeout time.Duration) bool {
	return poll(ctx, interval, timeout, func() bool {
		list, err := e.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		n := 0
		for i := range list.Items {
			if terminated(&list.Items[i]) {
				n++
			}
		}
		return n == want
	})
}
