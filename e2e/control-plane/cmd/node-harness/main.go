// Command node-harness plays the kubelet of one fake GPU node for carma's control-plane tests.
//
// It is not a kubelet re-implementation where it matters to carma: device plugins are served by the
// kubelet's own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager), which carma's device
// plugin registers with over the real socket protocol, and every pod bound to the node is admitted the
// way kubelet admits it: one Allocate per container that asks for a device-plugin resource, init
// containers first. What it fakes is the container runtime: a pod runs for a while and then ends the
// way a real container would (exit code, reason, termination message), as its e2e.carma.io/outcome
// annotation says.
//
// The device manager listens on /var/lib/kubelet/device-plugins/kubelet.sock, a path fixed by the
// kubelet; run.sh starts one harness per node in its own mount namespace with a per-node directory
// bind-mounted there.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"

	"github.com/carma/e2e/control-plane/internal/release"
)

const (
	gpuResource = "carma.io/gpu"
	// Test-only pod annotations read by this harness.
	annOutcome    = "e2e.carma.io/outcome"     // comma list per attempt: succeed|cuda-oom|oomkilled|error
	annRunSeconds = "e2e.carma.io/run-seconds" // how long the fake container runs
	labelAttempt  = "carma.io/attempt"
)

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

type harness struct {
	client     kubernetes.Interface
	node       string
	runSeconds float64
	dm         *devicemanager.ManagerImpl
	dmMu       sync.Mutex // the device manager expects kubelet's single admission goroutine
	pods       cache.Indexer
	mu         sync.Mutex
	admitted   map[types.UID]bool
	record     *os.File // JSON lines: what the device manager gave each admitted pod's containers
	recordMu   sync.Mutex
}

// kubeletVersion is the version the node reports: the Kubernetes release go.mod pins (internal/release).
var kubeletVersion string

func main() {
	var kubeconfig, node string
	var runSeconds float64
	var cpu, mem, record string
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of this node's identity")
	flag.StringVar(&node, "node", "", "node name")
	flag.Float64Var(&runSeconds, "run-seconds", 3, "default run time of a fake container")
	flag.StringVar(&cpu, "cpu", "64", "node CPU capacity")
	flag.StringVar(&mem, "memory", "512Gi", "node memory capacity")
	flag.StringVar(&record, "record", "", "append one JSON line per admitted pod to this file")
	klog.InitFlags(nil)
	flag.Parse()
	if node == "" {
		fmt.Fprintln(os.Stderr, "node-harness: --node is required")
		os.Exit(2)
	}
	var err error
	if kubeletVersion, err = release.KubeletVersion(); err != nil {
		klog.Fatalf("kubelet version: %v", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	client := kubernetes.NewForConfigOrDie(cfg)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	h := &harness{client: client, node: node, runSeconds: runSeconds, admitted: map[types.UID]bool{}}
	if record != "" {
		if h.record, err = os.OpenFile(record, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); err != nil {
			klog.Fatalf("--record: %v", err)
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
		}))
	podInformer := factory.Core().V1().Pods().Informer()
	h.pods = podInformer.GetIndexer()

	dm, err := devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
	if err != nil {
		klog.Fatalf("device manager: %v", err)
	}
	h.dm = dm
	if err := dm.Start(klog.Background(), h.activePods, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		klog.Fatalf("device manager start: %v", err)
	}
	klog.Infof("node %s: device manager listening for device plugins", node)

	// Like kubelet's sync loop, admit one pod at a time in the order the pods arrive; only the fake
	// containers run concurrently.
	admitQueue := make(chan *v1.Pod, 4096)
	go func() {
		for p := range admitQueue {
			h.handle(ctx, p)
		}
	}()
	_, _ = podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { admitQueue <- obj.(*v1.Pod) },
		UpdateFunc: func(_, obj any) { admitQueue <- obj.(*v1.Pod) },
	})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	resources := v1.ResourceList{
		v1.ResourceCPU:    resource.MustParse(cpu),
		v1.ResourceMemory: resource.MustParse(mem),
		v1.ResourcePods:   resource.MustParse("250"),
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		if err := h.syncNode(ctx, resources); err != nil {
			klog.Errorf("node status: %v", err)
		}
		select {
		case <-ctx.Done():
			_ = dm.Stop(klog.Background())
			return
		case <-tick.C:
		}
	}
}

// activePods is kubelet's notion: pods on this node that have not terminated.
func (h *harness) activePods() []*v1.Pod {
	var out []*v1.Pod
	for _, o := range h.pods.List() {
		p := o.(*v1.Pod)
		if p.Status.Phase != v1.PodSucceeded && p.Status.Phase != v1.PodFailed && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

// syncNode registers the Node and keeps its capacity (from the device manager) and Ready condition
// current, as kubelet's node status loop does.
func (h *harness) syncNode(ctx context.Context, base v1.ResourceList) error {
	capacity, allocatable, _ := h.dm.GetCapacity()
	cap := base.DeepCopy()
	alloc := base.DeepCopy()
	for k, v := range capacity {
		cap[k] = v
	}
	for k, v := range allocatable {
		alloc[k] = v
	}
	now := metav1.Now()
	status := v1.NodeStatus{
		Capacity:    cap,
		Allocatable: alloc,
		Conditions: []v1.NodeCondition{{
			Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			Message: "node-harness is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		NodeInfo:  v1.NodeSystemInfo{KubeletVersion: kubeletVersion, OperatingSystem: "linux", Architecture: "amd64"},
		Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: h.node}},
	}
	n, err := h.client.CoreV1().Nodes().Get(ctx, h.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		n = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.node, Labels: map[string]string{
			"kubernetes.io/hostname": h.node, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			"nvidia.com/gpu.present": "true",
		}}}
		n, err = h.client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	}
	if err != nil {
		return err
	}
	n.Status = status
	_, err = h.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
	return err
}

// handle admits a newly bound pod once and then plays its containers.
func (h *harness) handle(ctx context.Context, pod *v1.Pod) {
	if pod.Status.Phase != v1.PodPending || pod.DeletionTimestamp != nil {
		return
	}
	h.mu.Lock()
	if h.admitted[pod.UID] {
		h.mu.Unlock()
		return
	}
	h.admitted[pod.UID] = true
	h.mu.Unlock()

	admitted, err := h.admit(ctx, pod)
	if err != nil {
		klog.Errorf("pod %s/%s: admission failed: %v", pod.Namespace, pod.Name, err)
		// kubelet rejects the pod at admission; for a bare pod this is terminal.
		h.finish(ctx, pod, v1.PodFailed, "UnexpectedAdmissionError",
			fmt.Sprintf("Allocate failed due to %v, which is unexpected", err), nil)
		return
	}
	h.writeRecord(pod, admitted)
	go h.run(ctx, pod)
}

// run plays the pod's containers: Running, then the outcome its annotation asks for.
func (h *harness) run(ctx context.Context, pod *v1.Pod) {
	if err := h.setRunning(ctx, pod); err != nil {
		klog.Errorf("pod %s/%s: running: %v", pod.Namespace, pod.Name, err)
		return
	}
	run := h.runSeconds
	if s, ok := pod.Annotations[annRunSeconds]; ok {
		if v, err := strconv.ParseFloat(s, 64); err == nil {
			run = v
		}
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(run * float64(time.Second))):
	}
	outcome := outcomeFor(pod)
	switch outcome {
	case "cuda-oom":
		h.finish(ctx, pod, v1.PodFailed, "Error", "", &v1.ContainerStateTerminated{ExitCode: 1, Reason: "Error",
			Message: "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.11 GiB of which 1.20 GiB is free."})
	case "oomkilled":
		h.finish(ctx, pod, v1.PodFailed, "", "", &v1.ContainerStateTerminated{ExitCode: 137, Reason: "OOMKilled"})
	case "error":
		h.finish(ctx, pod, v1.PodFailed, "Error", "", &v1.ContainerStateTerminated{ExitCode: 2, Reason: "Error",
			Message: "ValueError: expected input batch_size (64) to match target batch_size (32)"})
	default:
		h.finish(ctx, pod, v1.PodSucceeded, "", "", &v1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"})
	}
}

// containerAdmission is what reached one container: the device IDs and the environment.
type containerAdmission struct {
	Devices []string          `json:"devices"`
	Env     map[string]string `json:"env,omitempty"`
	Mounts  []string          `json:"mounts,omitempty"`
	CDI     []string          `json:"cdi,omitempty"`
}

// admit calls the device manager as kubelet's resource allocator does: every init container, then
// every app container, one Allocate each; then the run options each container would start with.
func (h *harness) admit(ctx context.Context, pod *v1.Pod) (map[string]containerAdmission, error) {
	h.dmMu.Lock()
	defer h.dmMu.Unlock()
	var all []v1.Container
	all = append(all, pod.Spec.InitContainers...)
	all = append(all, pod.Spec.Containers...)
	for i := range all {
		if err := h.dm.Allocate(pod, &all[i]); err != nil {
			return nil, err
		}
	}
	out := map[string]containerAdmission{}
	for i := range all {
		c := &all[i]
		if _, ok := c.Resources.Limits[gpuResource]; !ok {
			continue
		}
		opts, err := h.dm.GetDeviceRunContainerOptions(ctx, pod, c)
		if err != nil {
			return nil, err
		}
		a := containerAdmission{Env: map[string]string{}}
		for _, ids := range h.dm.GetDevices(string(pod.UID), c.Name) {
			for id := range ids {
				a.Devices = append(a.Devices, id)
			}
		}
		sort.Strings(a.Devices)
		if opts != nil {
			for _, e := range opts.Envs {
				a.Env[e.Name] = e.Value
			}
			for _, m := range opts.Mounts {
				a.Mounts = append(a.Mounts, m.ContainerPath)
			}
			for _, d := range opts.CDIDevices {
				a.CDI = append(a.CDI, d.Name)
			}
		}
		out[c.Name] = a
	}
	return out, nil
}

// admissionRecord is one line of --record.
type admissionRecord struct {
	Node       string                        `json:"node"`
	Namespace  string                        `json:"namespace"`
	Pod        string                        `json:"pod"`
	UID        string                        `json:"uid"`
	Containers map[string]containerAdmission `json:"containers"`
}

func (h *harness) writeRecord(pod *v1.Pod, containers map[string]containerAdmission) {
	if h.record == nil {
		return
	}
	line, _ := json.Marshal(admissionRecord{h.node, pod.Namespace, pod.Name, string(pod.UID), containers})
	h.recordMu.Lock()
	defer h.recordMu.Unlock()
	_, _ = h.record.Write(append(line, '\n'))
}

func outcomeFor(pod *v1.Pod) string {
	list := strings.Split(pod.Annotations[annOutcome], ",")
	i := 0
	if n, err := strconv.Atoi(pod.Labels[labelAttempt]); err == nil && n > 0 {
		i = n - 1
	}
	if i >= len(list) {
		i = len(list) - 1
	}
	return strings.TrimSpace(list[i])
}

func (h *harness) setRunning(ctx context.Context, pod *v1.Pod) error {
	// The device plugin annotates the pod at the same moment (conflict), and the Node authorizer
	// learns that the pod is bound to this node a moment after the bind (forbidden): retry both, as
	// kubelet's status manager does.
	return retry.OnError(statusBackoff, retriable, func() error { return h.trySetRunning(ctx, pod) })
}

// statusBackoff spans about 10 s.
var statusBackoff = wait.Backoff{Steps: 12, Duration: 50 * time.Millisecond, Factor: 1.5, Cap: 2 * time.Second}

func retriable(err error) bool { return apierrors.IsConflict(err) || apierrors.IsForbidden(err) }

func (h *harness) trySetRunning(ctx context.Context, pod *v1.Pod) error {
	now := metav1.Now()
	p, err := h.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	p.Status.Phase = v1.PodRunning
	p.Status.StartTime = &now
	p.Status.HostIP = "127.0.0.1"
	p.Status.PodIP = "10.88.0.1"
	p.Status.Conditions = []v1.PodCondition{
		{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
	}
	p.Status.ContainerStatuses = nil
	for _, c := range p.Spec.Containers {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptr(true),
			ContainerID: "fake://" + string(p.UID) + "/" + c.Name,
			State:       v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, err = h.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

// finish ends the pod: a pod-level reason (admission failure) or every container terminated as term.
func (h *harness) finish(ctx context.Context, pod *v1.Pod, phase v1.PodPhase, reason, message string, term *v1.ContainerStateTerminated) {
	err := retry.OnError(statusBackoff, retriable, func() error {
		p, err := h.client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		p.Status.Phase = phase
		if term == nil {
			p.Status.Reason, p.Status.Message = reason, message
		} else {
			p.Status.ContainerStatuses = nil
			for _, c := range p.Spec.Containers {
				t := *term
				t.StartedAt, t.FinishedAt = now, now
				p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, v1.ContainerStatus{
					Name: c.Name, Image: c.Image, ImageID: c.Image,
					ContainerID: "fake://" + string(p.UID) + "/" + c.Name,
					State:       v1.ContainerState{Terminated: &t},
				})
			}
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == v1.PodReady || p.Status.Conditions[i].Type == v1.ContainersReady {
				p.Status.Conditions[i].Status = v1.ConditionFalse
				p.Status.Conditions[i].LastTransitionTime = now
			}
		}
		_, err = h.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		klog.Errorf("pod %s/%s: finish: %v", pod.Namespace, pod.Name, err)
	}
}

func ptr[T any](v T) *T { return &v }
