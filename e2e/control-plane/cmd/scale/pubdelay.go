package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

// publicationWatch measures how long a change of a hollow node's pods takes to reach a watcher of
// GpuNodes, as the extender's own watch receives it: from the change (the pod seen bound or gone,
// where a device plugin would see its memory come or go) to this program's GpuNode watch delivering
// the publication that carries it. That is the wait for the node's next sample (up to 1 s), the write,
// and the watch.
//
// The watch can deliver a write before the writer has its answer, so either side may come first:
// an event no write awaits yet is kept (the node's latest) until the write's answer names it.
type publicationWatch struct {
	mu      sync.Mutex
	pending map[string]pendingPublication // node → its last write that carried a change, not yet seen
	early   map[string]seenEvent          // node → its latest event no write awaited yet
	delays  delayLog
}

type seenEvent struct {
	resourceVersion string
	at              time.Time
}

// delayLog collects delays (ms) from several goroutines.
type delayLog struct {
	mu sync.Mutex
	ms []float64
}

func (d *delayLog) add(ms float64) {
	d.mu.Lock()
	d.ms = append(d.ms, ms)
	d.mu.Unlock()
}

// take returns the delays so far, sorted, and resets them.
func (d *delayLog) take() []float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.ms
	d.ms = nil
	sort.Float64s(out)
	return out
}

type pendingPublication struct {
	resourceVersion string
	change          time.Time
}

// expect: node's publication with this resourceVersion carries a change made at change.
func (w *publicationWatch) expect(node, resourceVersion string, change time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if e, ok := w.early[node]; ok && e.resourceVersion == resourceVersion {
		delete(w.early, node)
		w.delays.add(float64(e.at.Sub(change).Microseconds()) / 1000)
		return
	}
	if w.pending == nil {
		w.pending = map[string]pendingPublication{}
	}
	w.pending[node] = pendingPublication{resourceVersion, change}
}

// saw: the watch delivered node's GpuNode at resourceVersion, at now.
func (w *publicationWatch) saw(node, resourceVersion string, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.pending[node]
	if !ok || p.resourceVersion != resourceVersion {
		if w.early == nil {
			w.early = map[string]seenEvent{}
		}
		w.early[node] = seenEvent{resourceVersion, now}
		return
	}
	delete(w.pending, node)
	w.delays.add(float64(now.Sub(p.change).Microseconds()) / 1000)
}

// take returns the delays so far (ms), sorted, and resets them.
func (w *publicationWatch) take() []float64 { return w.delays.take() }

// watchPublications starts the GpuNode watch (a connection of its own, like the pod watch).
func (b *bench) watchPublications(ctx context.Context) {
	factory := dynamicinformer.NewDynamicSharedInformerFactory(b.gnWatchDyn, 0)
	inf := factory.ForResource(gnGVR).Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, o any) {
			if u, ok := o.(*unstructured.Unstructured); ok {
				b.h.seen.saw(u.GetName(), u.GetResourceVersion(), time.Now())
			}
		},
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		fatal("GpuNode informer did not sync")
	}
}

// delaySummary: p50, p99, max and the share within 1 s of the delays (ms, sorted), or "not measured".
func delaySummary(ms []float64) string {
	if len(ms) == 0 {
		return "not measured"
	}
	within := sort.SearchFloat64s(ms, 1000.0000001)
	return fmt.Sprintf("p50 %.0f ms, p99 %.0f ms, max %.0f ms; %d of %d within 1 s (%.1f %%)",
		percentile(ms, 0.5), percentile(ms, 0.99), ms[len(ms)-1], within, len(ms), 100*float64(within)/float64(len(ms)))
}
