package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// pubWriters write the publications of --publish-cost, each on nodes of its own.
const pubWriters = 16

// leanDropped are the per-GPU fields the "lean" experiment leaves out. Placement reads several of
// them (occupancy, DRAM activity, gate rule, healthy, processes), so no real status could drop them
// all: the experiment bounds what a smaller status could save.
var leanDropped = []string{"model", "smOccupancy", "dramActivity", "activitySource", "gateRule",
	"sharingAllowed", "powerWatts", "healthy", "processes"}

// publishCost (--publish-cost N): before any phase and before the hollow device plugins start,
// writes N GpuNode status publications in each of three ways and prints what a write cost
// kube-apiserver and etcd in CPU (from /proc) and how long it took. The device plugin's publication
// is the largest API server cost per carma pod (docs/scale.md, "What a carma pod costs
// kube-apiserver"), so this is its benchmark:
//
//   - merge-patch: the status as the device plugin writes it (a JSON merge patch of the status
//     subresource);
//   - update: the same status by update (PUT) with the resourceVersion of the node's last write;
//   - lean: an experiment, not a way the device plugin writes: the merge patch with the fields of
//     leanDropped left out of every GPU (after one untimed write per node that drops them from the
//     stored object): a bound on what a smaller status could save.
//
// Every write changes the status (GPU 0's free memory steps by one MiB), as a publication that lists
// a new pod does; an unchanged object would not reach etcd.
func (b *bench) publishCost(ctx context.Context, n int) {
	procs := b.cpuProcs(0, 0)
	names := make([]string, 0, len(b.h.nodes))
	for name := range b.h.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Printf("GpuNode status publications, %d of each kind over %d GpuNodes (%d writers, each with nodes of its own):\n",
		n, len(names), pubWriters)
	for _, kind := range []string{"merge-patch", "update", "lean"} {
		if kind == "lean" {
			if _, err := b.publishAll(ctx, kind, names, len(names)); err != nil {
				fmt.Printf("  %s: %v\n", kind, err)
				continue
			}
		}
		c0, t0 := procs.now(), time.Now()
		lat, err := b.publishAll(ctx, kind, names, n)
		if err != nil {
			fmt.Printf("  %s: %v\n", kind, err)
			continue
		}
		c1, span := procs.now(), time.Since(t0)
		per := func(p string) float64 { return (c1[p] - c0[p]) / float64(n) * 1000 }
		fmt.Printf("  %s: kube-apiserver %.2f ms CPU per write, etcd %.2f, this program %.2f; %d writes in %.1f s (%.0f/s), each p50 %.1f ms, p99 %.1f ms\n",
			kind, per("kube-apiserver"), per("etcd"), per("benchmark"), n, span.Seconds(), float64(n)/span.Seconds(),
			percentile(lat, 0.5), percentile(lat, 0.99))
	}
}

// publishAll writes n publications of the given kind, the nodes in turn, and returns each write's
// time (ms, sorted).
func (b *bench) publishAll(ctx context.Context, kind string, names []string, n int) ([]float64, error) {
	var mu sync.Mutex
	var lat []float64
	g := new(errgroup.Group)
	for w := 0; w < pubWriters && w < len(names); w++ {
		g.Go(func() error {
			var mine []string
			for j := w; j < len(names); j += pubWriters {
				mine = append(mine, names[j])
			}
			rv := map[string]string{} // node → resourceVersion of its last write (update only)
			for k, i := 0, w; i < n; k, i = k+1, i+pubWriters {
				node := mine[k%len(mine)]
				t := time.Now()
				if err := b.publishOnce(ctx, kind, node, i, rv); err != nil {
					return fmt.Errorf("%s %s: %w", kind, node, err)
				}
				mu.Lock()
				lat = append(lat, float64(time.Since(t).Microseconds())/1000)
				mu.Unlock()
			}
			return nil
		})
	}
	err := g.Wait()
	sort.Float64s(lat)
	return lat, err
}

// publishOnce writes node's status once; i makes it differ from the last one.
func (b *bench) publishOnce(ctx context.Context, kind, node string, i int, rv map[string]string) error {
	b.h.mu.Lock()
	st := b.h.status(b.h.nodes[node])
	b.h.mu.Unlock()
	gpus := st["gpus"].([]any)
	gpu0 := gpus[0].(map[string]any)
	gpu0["memoryFreeMiB"] = gpu0["memoryFreeMiB"].(int64) - int64(i%1024) - 1
	if kind == "lean" {
		for _, g := range gpus {
			for _, k := range leanDropped {
				delete(g.(map[string]any), k)
			}
		}
	}
	if kind != "update" {
		_, err := b.patchStatus(ctx, node, st)
		return err
	}
	res := b.pubDyn.Resource(gnGVR)
	if rv[node] == "" {
		cur, err := res.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		rv[node] = cur.GetResourceVersion()
	}
	out, err := res.UpdateStatus(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "carma.io/v1alpha1", "kind": "GpuNode",
		"metadata": map[string]any{"name": node, "resourceVersion": rv[node]},
		"status":   st,
	}}, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	rv[node] = out.GetResourceVersion()
	return nil
}
