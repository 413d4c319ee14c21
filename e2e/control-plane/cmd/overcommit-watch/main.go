// Command overcommit-watch runs the over-commit checker (internal/overcommit) against a live cluster
// every -interval until it receives SIGTERM or SIGINT, then writes what it saw to -out as JSON and one
// line to stdout (SIGUSR1 writes the same so far and keeps watching; -out is replaced whole, never
// half-written):
//
//	overcommit-watch: <f> findings in <c> checks (<e> checks failed: API unreachable)
//
// A check lists every GpuNode and every pod of -scheduler in all namespaces and judges the bound, live
// ones. A check whose list calls fail (the API server or etcd is down during a fault) is counted as
// failed, not as a check: the figure <c> is only of checks that judged the cluster. Each distinct
// finding is kept once with the time it was first seen. Exit status 0 unless the flags are wrong.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/carma/e2e/control-plane/internal/overcommit"
)

var gpuNodes = schema.GroupVersionResource{Group: "carma.io", Version: "v1alpha1", Resource: "gpunodes"}

// Report is what -out receives.
type Report struct {
	Checks       int           `json:"checks"`
	FailedChecks int           `json:"failedChecks"`
	LastError    string        `json:"lastError,omitempty"`
	PodsJudged   int           `json:"podsJudgedMax"`
	Findings     []SeenFinding `json:"findings"`
	seen         map[string]bool
}

// SeenFinding is a finding and when it was first seen.
type SeenFinding struct {
	ID     string    `json:"id"`
	Detail string    `json:"detail"`
	First  time.Time `json:"first"`
}

func (r *Report) add(fs []overcommit.Finding, now time.Time) {
	for _, f := range fs {
		if r.seen[f.ID()] {
			continue
		}
		r.seen[f.ID()] = true
		r.Findings = append(r.Findings, SeenFinding{ID: f.ID(), Detail: f.Detail, First: now})
	}
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster to watch")
	scheduler := flag.String("scheduler", "", "schedulerName of the carma pods to judge")
	interval := flag.Duration("interval", 2*time.Second, "time between checks")
	out := flag.String("out", "", "file the JSON report is written to at the end")
	flag.Parse()
	if *kubeconfig == "" || *scheduler == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "overcommit-watch: -kubeconfig, -scheduler and -out are required")
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overcommit-watch: kubeconfig %s: %v\n", *kubeconfig, err)
		os.Exit(2)
	}
	cfg.Timeout = 5 * time.Second
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	interim := make(chan os.Signal, 1)
	signal.Notify(interim, syscall.SIGUSR1)
	r := &Report{seen: map[string]bool{}, Findings: []SeenFinding{}}
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		check(ctx, kube, dyn, *scheduler, r)
		select {
		case <-ctx.Done():
			write(*out, r)
			return
		case <-interim:
			write(*out, r)
		case <-tick.C:
		}
	}
}

// check runs one check with a fresh context, so a stop signal never cuts a check in half.
func check(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, scheduler string, r *Report) {
	if ctx.Err() != nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := dyn.Resource(gpuNodes).List(cctx, metav1.ListOptions{})
	if err != nil {
		r.FailedChecks++
		r.LastError = err.Error()
		return
	}
	pods, err := kube.CoreV1().Pods("").List(cctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.schedulerName", scheduler).String()})
	if err != nil {
		r.FailedChecks++
		r.LastError = err.Error()
		return
	}
	gpus, replicas := overcommit.GPUsOf(list.Items)
	live := 0
	for i := range pods.Items {
		if pods.Items[i].Spec.NodeName != "" && !overcommit.Terminated(&pods.Items[i]) && overcommit.RequestsGPU(&pods.Items[i]) {
			live++
		}
	}
	if live > r.PodsJudged {
		r.PodsJudged = live
	}
	r.add(overcommit.Findings(pods.Items, gpus, scheduler, replicas), time.Now())
	r.Checks++
}

func write(path string, r *Report) {
	b, _ := json.MarshalIndent(r, "", "  ")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "overcommit-watch: %s: %v\n", tmp, err)
		os.Exit(1)
	}
	if err := os.Rename(tmp, path); err != nil {
		fmt.Fprintf(os.Stderr, "overcommit-watch: %s: %v\n", path, err)
		os.Exit(1)
	}
	fmt.Printf("overcommit-watch: %d findings in %d checks (%d checks failed: API unreachable)\n",
		len(r.Findings), r.Checks, r.FailedChecks)
}
