// The kubelet's own plugin watcher and DRA plugin manager (k8s.io/kubernetes, the release that
// e2e/control-plane pins) register carma's DRA driver and call NodePrepareResources and
// NodeUnprepareResources on it, for a ResourceClaim stored in a real API server. Built and run by
// ../real-control-plane.sh; not part of any build or test run.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL %s: %v\n", what, err)
		os.Exit(1)
	}
}

func show(what string, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Printf("== %s\n%s\n", what, b)
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "")
	registry := flag.String("registry", "", "")
	node := flag.String("node", "n1", "")
	endpoint := flag.String("endpoint", "", "the DRA socket, for registering directly when the watcher fails")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	must(err, "kubeconfig")
	client := kubernetes.NewForConfigOrDie(cfg)

	_, err = client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{})
	must(err, "namespace")
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-a"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: "carma-gpu",
				Capacity:        &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{"memory": resource.MustParse("12Gi")}},
			},
		}}}},
	}
	claim, err = client.ResourceV1().ResourceClaims("ml").Create(ctx, claim, metav1.CreateOptions{})
	must(err, "create claim")
	share := types.UID(uuid.NewUUID())
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: "gpu.carma.io", Pool: *node, Device: "gpu-1",
		ConsumedCapacity: map[resourcev1.QualifiedName]resource.Quantity{"memory": resource.MustParse("12Gi")},
		ShareID:          &share,
	}}}}
	claim, err = client.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	must(err, "allocate claim (status)")
	show("stored claim status", claim.Status)

	getNode := func(ctx context.Context) (*corev1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, *node, metav1.GetOptions{})
	}
	dra := plugin.NewDRAPluginManager(ctx, client, getNode, nil, 30*time.Second)
	pm := pluginmanager.NewPluginManager(*registry, &record.FakeRecorder{})
	pm.AddHandler("DRAPlugin", dra)
	stop := make(chan struct{})
	go pm.Run(ctx, config.NewSourcesReady(func(sets.Set[string]) bool { return true }), stop)

	var p *plugin.DRAPlugin
	for i := 0; i < 25; i++ {
		if p, err = dra.GetPlugin("gpu.carma.io"); err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err == nil {
		fmt.Println("== REGISTERED through the plugin watcher")
	} else {
		fmt.Printf("== NOT REGISTERED through the plugin watcher within 5 s: %v\n", err)
		fmt.Println("== registering directly with DRAPluginManager.RegisterPlugin (what the watcher calls after GetInfo)")
		must(dra.RegisterPlugin("gpu.carma.io", *endpoint, []string{"v1.DRAPlugin"}, nil), "RegisterPlugin")
		p, err = dra.GetPlugin("gpu.carma.io")
		must(err, "GetPlugin")
	}

	req := &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{{Namespace: "ml", Name: "train-a", Uid: string(claim.UID)}}}
	prep, err := p.NodePrepareResources(ctx, req)
	must(err, "NodePrepareResources")
	show("NodePrepareResources response", prep)
	if os.Getenv("PAUSE_FILE") != "" {
		os.WriteFile(os.Getenv("PAUSE_FILE"), []byte(claim.UID), 0o644)
		time.Sleep(2 * time.Second)
	}
	unprep, err := p.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: req.Claims})
	must(err, "NodeUnprepareResources")
	show("NodeUnprepareResources response", unprep)
	close(stop)
}
