// Command scenarios drives carma on the real control plane that run.sh started and asserts what a
// cluster user would see: TrainingTasks end to end, OOM recovery, reservations learned from observed
// peaks, a 300-pod load with an extender crash, operator failover, a device-plugin and a kubelet
// restart, admission policies and bad input, the kubelet device manager's per-container admission,
// and a canary that plants the faults the checkers exist to catch. A monitor checks every carma pod
// for over-commit during the whole run. Each scenario prints its figures; the summary lines at the end
// are read from the cluster (a part that did not run says "not run") and are printed even when an
// assertion failed. Any failed assertion exits 1.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

var (
	ttGVR = schema.GroupVersionResource{Group: "carma.io", Version: "v1alpha1", Resource: "trainingtasks"}
	gnGVR = schema.GroupVersionResource{Group: "carma.io", Version: "v1alpha1", Resource: "gpunodes"}
)

type env struct {
	cfg           *rest.Config
	kube          kubernetes.Interface
	dyn           dynamic.Interface
	kubectl       string
	kubeconfig    string
	ctl           string
	work          string
	nodes         int
	examples      string
	namespace     string
	schedulerName string
	extender      string
	mon           *monitor   // set once the cluster is ready; the canary reads its findings
	mu            sync.Mutex // guards failures and admTally: scenarios check from goroutines
	failures      []string
	admTally      admissionTally
}

// summary collects the figures the scenarios observed for the final lines.
type summary struct {
	ran            map[string]bool
	p99BindMs      float64
	failoverS      float64
	dmAdmitted     int
	dmMulti        int
	dmInit         int
	dmReregistered bool
	// The admission check (devices and environment against the assignment), over every pod it read.
	admissionChecked int
	swapped          int
	// The operator hang: when the hung leader stepped down and the other took the Lease (seconds after
	// the hang began), and how many samples of both replicas' /metrics showed both leading.
	hangRan                      bool
	hangDemoted, hangTakeover    time.Duration
	hangBothLeading, hangSamples int
	// The canary: faults planted and faults the checker meant for each reported.
	planted int
	caught  int
}

func main() {
	e := &env{}
	flag.StringVar(&e.kubeconfig, "kubeconfig", "", "admin kubeconfig")
	flag.StringVar(&e.kubectl, "kubectl", "kubectl", "kubectl binary")
	flag.StringVar(&e.ctl, "ctl", "", "command that kills and restarts processes (run.sh ctl)")
	flag.StringVar(&e.work, "work", "", "run.sh's work directory")
	flag.IntVar(&e.nodes, "nodes", 4, "GPU nodes")
	flag.StringVar(&e.examples, "examples", "", "deploy/examples")
	flag.StringVar(&e.namespace, "namespace", "carma-system", "release namespace")
	flag.StringVar(&e.schedulerName, "scheduler-name", "", "the chart's scheduler profile name")
	flag.StringVar(&e.extender, "extender", "", "extender base URL")
	only := flag.String("only", "", "comma-separated scenarios to run (default: all)")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		fatal("kubeconfig: %v", err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	e.cfg = cfg
	e.kube = kubernetes.NewForConfigOrDie(cfg)
	e.dyn = dynamic.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	s := summary{ran: map[string]bool{}}
	steps := []struct {
		name string
		run  func(context.Context, *summary)
	}{
		{"ready", e.waitReady},
		{"tasks", e.scenarioTasks},
		{"oom", e.scenarioOOM},
		{"history", e.scenarioHistory},
		{"load", e.scenarioLoad},
		{"hang", e.scenarioOperatorHang},
		{"policies", e.scenarioPolicies},
		{"devicemanager", e.scenarioDeviceManager},
		{"canary", e.scenarioCanary},
	}
	want := map[string]bool{}
	for _, n := range strings.Split(*only, ",") {
		if n != "" {
			want[n] = true
		}
	}
	var m *monitor
	for _, st := range steps {
		if len(want) > 0 && !want[st.name] && st.name != "ready" {
			continue
		}
		t0 := time.Now()
		fmt.Printf("\n=== scenario %s\n", st.name)
		st.run(ctx, &s)
		s.ran[st.name] = true
		fmt.Printf("=== scenario %s: %.1f s\n", st.name, time.Since(t0).Seconds())
		if st.name == "ready" {
			if e.failed() {
				break
			}
			m = e.startMonitor(ctx)
			e.mon = m
		}
	}
	var lines []string
	if m != nil {
		m.finish()
		lines = e.judgeRun(ctx, m, &s)
	}
	e.checkProcessesAlive()
	for _, l := range lines {
		fmt.Println(l)
	}
	if e.failed() {
		fmt.Printf("\n%d assertion(s) failed:\n", len(e.failures))
		for _, f := range e.failures {
			fmt.Println("  - " + f)
		}
		os.Exit(1)
	}
}

func (e *env) failed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.failures) > 0
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "scenarios: "+format+"\n", args...)
	os.Exit(1)
}

// check records a failed assertion (the run goes on, so one report shows every failure).
func (e *env) check(ok bool, format string, args ...any) bool {
	msg := fmt.Sprintf(format, args...)
	e.mu.Lock()
	defer e.mu.Unlock()
	if ok {
		fmt.Println("  ok   " + msg)
	} else {
		fmt.Println("  FAIL " + msg)
		e.failures = append(e.failures, msg)
	}
	return ok
}

// ctlRun runs `run.sh ctl <args>`.
func (e *env) ctlRun(args ...string) {
	parts := append(strings.Fields(e.ctl), args...)
	cmd := exec.Command("bash", parts...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		e.check(false, "ctl %v: %v", args, err)
	}
}

// kubectlOut runs kubectl with the admin kubeconfig.
func (e *env) kubectlOut(stdin string, args ...string) (string, error) {
	cmd := exec.Command(e.kubectl, append([]string{"--kubeconfig", e.kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// poll calls f every interval until it returns true or the timeout passes.
func poll(ctx context.Context, interval, timeout time.Duration, f func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if f() {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(interval)
	}
}

// checkProcessesAlive: nothing crashed (every process run.sh started and did not stop on purpose).
func (e *env) checkProcessesAlive() {
	entries, err := os.ReadDir(e.work + "/pids")
	if err != nil {
		return
	}
	var dead []string
	for _, en := range entries {
		raw, err := os.ReadFile(e.work + "/pids/" + en.Name())
		if err != nil {
			continue
		}
		var pid int
		fmt.Sscan(string(raw), &pid)
		if pid <= 0 || exec.Command("kill", "-0", fmt.Sprint(pid)).Run() != nil {
			dead = append(dead, en.Name())
		}
	}
	e.check(len(dead) == 0, "every process is still running at the end (dead: %v)", dead)
}
