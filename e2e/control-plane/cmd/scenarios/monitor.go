package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// monitorInterval is how often the over-commit checker polls; the run fails below one successful
// poll per minPollSpacing of its duration.
const (
	monitorInterval = 500 * time.Millisecond
	minPollSpacing  = 2 * time.Second
)

// podSeen is what the monitor's pod informer learned about one carma GPU pod during the run.
type podSeen struct {
	ref           string
	bound         bool
	expectPending bool
}

// monitor watches every carma GPU pod in every namespace for the whole run: an informer records each
// pod submitted and whether the API ever showed it bound, and a poller runs the over-commit checker
// on a fresh List every monitorInterval.
type monitor struct {
	e *env

	mu        sync.Mutex
	start     time.Time
	end       time.Time
	polls     int
	failed    int
	lastErr   string
	findings  map[string]finding // by id, first sighting
	firstSeen map[string]time.Time
	pods      map[string]*podSeen // by UID
	lastPoll  time.Time

	stop chan struct{}
	done chan struct{}
}

func (e *env) startMonitor(ctx context.Context) *monitor {
	m := &monitor{e: e, start: time.Now(), findings: map[string]finding{}, firstSeen: map[string]time.Time{},
		pods: map[string]*podSeen{}, stop: make(chan struct{}), done: make(chan struct{})}
	selector := fields.OneTermEqualSelector("spec.schedulerName", e.schedulerName).String()
	factory := informers.NewSharedInformerFactoryWithOptions(e.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    m.sawPod,
		UpdateFunc: func(_, o any) { m.sawPod(o) },
	})
	stopInf := make(chan struct{})
	factory.Start(stopInf)
	synced := cache.WaitForCacheSync(stopInf, inf.HasSynced)
	e.check(synced, "monitor: pod informer over every namespace (spec.schedulerName=%s) synced", e.schedulerName)
	go func() {
		defer close(m.done)
		defer close(stopInf)
		for {
			m.poll(ctx)
			select {
			case <-m.stop:
				m.poll(ctx) // a last look after the final scenario
				return
			case <-ctx.Done():
				return
			case <-time.After(monitorInterval):
			}
		}
	}()
	return m
}

func (m *monitor) sawPod(obj any) {
	p, ok := obj.(*v1.Pod)
	if !ok || !requestsGPU(p) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.pods[string(p.UID)]
	if s == nil {
		s = &podSeen{ref: p.Namespace + "/" + p.Name, expectPending: p.Labels[labelExpect] == expectPending}
		m.pods[string(p.UID)] = s
	}
	s.bound = s.bound || p.Spec.NodeName != ""
}

// poll runs the checker once on what the API shows now.
func (m *monitor) poll(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	gn, replicas, err := m.e.gpuNodesAndReplicas(pctx)
	var list *v1.PodList
	if err == nil {
		list, err = m.e.kube.CoreV1().Pods("").List(pctx, metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.schedulerName", m.e.schedulerName).String()})
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.failed++
		m.lastErr = err.Error()
		return
	}
	now := time.Now()
	if replicas == 0 {
		// No GpuNode publishes its replicas yet: judge by what the chart gives every plugin here.
		replicas = replicasPerGPU
	}
	for _, f := range overCommitFindings(list.Items, gn, m.e.schedulerName, replicas) {
		if _, seen := m.findings[f.ID()]; !seen {
			m.findings[f.ID()] = f
			m.firstSeen[f.ID()] = now
			if !planted(f) {
				fmt.Printf("  FINDING %s\n", f)
			}
		}
	}
	m.polls++
	m.lastPoll = now
}

// finish stops the poller after one last poll.
func (m *monitor) finish() {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	m.end = time.Now()
	m.mu.Unlock()
}

// real returns the findings that involve a pod the canary did not plant.
func (m *monitor) real() []finding {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []finding
	for _, f := range m.findings {
		if !planted(f) {
			out = append(out, f)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out
}

// plantedSince returns the planted finding with this id if a poll saw it after t.
func (m *monitor) plantedSince(id string, t time.Time) (finding, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.findings[id]
	return f, ok && planted(f) && !m.firstSeen[id].Before(t)
}

// pollsAfter reports whether a successful poll completed after t.
func (m *monitor) pollsAfter(t time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastPoll.After(t)
}

// counts returns polls (successful, failed), the last error, and the run's length so far.
func (m *monitor) counts() (ok, failed int, lastErr string, d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	end := m.end
	if end.IsZero() {
		end = time.Now()
	}
	return m.polls, m.failed, m.lastErr, end.Sub(m.start)
}

// bound returns how many carma GPU pods were submitted outside the canary and not meant to stay
// pending (K), and how many of them the API showed bound (k), with the refs of those never bound.
func (m *monitor) bound() (k, total int, never []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.pods {
		if s.expectPending || inCanary(s.ref) {
			continue
		}
		total++
		if s.bound {
			k++
		} else {
			never = append(never, s.ref)
		}
	}
	sort.Strings(never)
	return k, total, never
}

// inCanary: ref (namespace/name) is in the canary's namespace.
func inCanary(ref string) bool { return strings.HasPrefix(ref, canaryNamespace+"/") }
