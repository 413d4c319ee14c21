package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

// publishCost (--publish-cost N): before any phase and before the hollow device plugins start,
// writes N GpuNode status publications with each way a device plugin can write them and prints what
// each write cost kube-apiserver and etcd in CPU (from /proc) and how long it took. The device
// plugin's publication after a pod's memory shows is the largest API server cost per carma pod
// (docs/scale.md, "What a carma pod costs the API server"), so this is its benchmark.
//
// Every write changes the status (GPU 0's free memory steps by one MiB), as a publication that lists
// a new pod does; an unchanged object would not reach etcd. 16 writers, each with nodes of its own,
// so that no two write one GpuNode at once.
func (b *bench) publishCost(ctx context.Context, n int) {
	procs := b.cpuProcs(0, 0)
	names := make([]string, 0, len(b.h.nodes))
	for name := range b.h.nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	const writers = 16
	fmt.Printf("GpuNode status publications, %d by each verb over %d GpuNodes (%d writers, one per node at a time):\n",
		n, len(names), writers)
	for _, verb := range []string{"merge-patch", "update"} {
		rv := map[string]string{} // node → resourceVersion of its last write (update only)
		var mu sync.Mutex
		var lat []float64
		c0, t0 := procs.now(), time.Now()
		g := new(errgroup.Group)
		for w := 0; w < writers; w++ {
			g.Go(func() error {
				for i := w; i < n; i += writers {
					node := names[(i/writers*writers+w)%len(names)]
					b.h.mu.Lock()
					st := b.h.status(b.h.nodes[node])
					b.h.mu.Unlock()
					gpu0 := st["gpus"].([]any)[0].(map[string]any)
					gpu0["memoryFreeMiB"] = gpu0["memoryFreeMiB"].(int64) - int64(i%1024) - 1
					t := time.Now()
					var err error
					switch verb {
					case "merge-patch":
						raw, _ := json.Marshal(map[string]any{"status": st})
						_, err = b.pubDyn.Resource(gnGVR).Patch(ctx, node, types.MergePatchType, raw, metav1.PatchOptions{}, "status")
					case "update":
						mu.Lock()
						v := rv[node]
						mu.Unlock()
						if v == "" {
							cur, gerr := b.pubDyn.Resource(gnGVR).Get(ctx, node, metav1.GetOptions{})
							if gerr != nil {
								return gerr
							}
							v = cur.GetResourceVersion()
						}
						obj := &unstructured.Unstructured{Object: map[string]any{
							"apiVersion": "carma.io/v1alpha1", "kind": "GpuNode",
							"metadata": map[string]any{"name": node, "resourceVersion": v},
							"status":   st,
						}}
						var out *unstructured.Unstructured
						out, err = b.pubDyn.Resource(gnGVR).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
						if err == nil {
							mu.Lock()
							rv[node] = out.GetResourceVersion()
							mu.Unlock()
						}
					}
					if err != nil {
						return fmt.Errorf("%s %s: %w", verb, node, err)
					}
					mu.Lock()
					lat = append(lat, float64(time.Since(t).Microseconds())/1000)
					mu.Unlock()
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			fmt.Printf("  %s: %v\n", verb, err)
			continue
		}
		c1, span := procs.now(), time.Since(t0)
		sort.Float64s(lat)
		per := func(p string) float64 { return (c1[p] - c0[p]) / float64(n) * 1000 }
		fmt.Printf("  %s: kube-apiserver %.2f ms CPU per write, etcd %.2f, this program %.2f; %d writes in %.1f s (%.0f/s), each p50 %.1f ms, p99 %.1f ms\n",
			verb, per("kube-apiserver"), per("etcd"), per("benchmark"), n, span.Seconds(), float64(n)/span.Seconds(),
			percentile(lat, 0.5), percentile(lat, 0.99))
	}
}
