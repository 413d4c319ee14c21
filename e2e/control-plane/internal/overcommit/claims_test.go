package overcommit

import (
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func sharedDevice(name string, taints ...resourcev1.DeviceTaint) resourcev1.Device {
	yes := true
	return resourcev1.Device{Name: name, AllowMultipleAllocations: &yes, Taints: taints,
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"memory": {Value: resource.MustParse("80Gi")},
			"slots":  {Value: resource.MustParse("8")},
		}}
}

func wholeDevice(name string) resourcev1.Device {
	return resourcev1.Device{Name: name, Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
		"memory": {Value: resource.MustParse("80Gi")}}}
}

func slice(driver, pool string, devs ...resourcev1.Device) resourcev1.ResourceSlice {
	return resourcev1.ResourceSlice{Spec: resourcev1.ResourceSliceSpec{Driver: driver,
		Pool: resourcev1.ResourcePool{Name: pool}, Devices: devs}}
}

type res = resourcev1.DeviceRequestAllocationResult

func booked(driver, pool, dev, mem string, tol ...resourcev1.DeviceToleration) res {
	r := res{Request: "gpu", Driver: driver, Pool: pool, Device: dev, Tolerations: tol}
	if mem != "" {
		r.ConsumedCapacity = map[resourcev1.QualifiedName]resource.Quantity{
			"memory": resource.MustParse(mem), "slots": resource.MustParse("1")}
	}
	return r
}

func claim(name string, results ...res) resourcev1.ResourceClaim {
	return resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: name},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{
			Devices: resourcev1.DeviceAllocationResult{Results: results}}}}
}

func kinds(fs []Finding) string {
	var ks []string
	for _, f := range fs {
		ks = append(ks, f.ID())
	}
	return strings.Join(ks, "; ")
}

func TestClaimsWithinTheirDevicesAreNoFinding(t *testing.T) {
	slices := []resourcev1.ResourceSlice{
		slice("gpu.carma.io", "n1", sharedDevice("gpu-0"), sharedDevice("gpu-1")),
		slice("gpu.whole", "n1", wholeDevice("gpu-0")),
	}
	claims := []resourcev1.ResourceClaim{
		claim("a", booked("gpu.carma.io", "n1", "gpu-0", "40Gi")),
		claim("b", booked("gpu.carma.io", "n1", "gpu-0", "40Gi")),
		claim("c", booked("gpu.carma.io", "n1", "gpu-1", "")), // the whole shared device, alone
		claim("d", booked("gpu.whole", "n1", "gpu-0", "")),
		{ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: "pending"}},
	}
	if f := ClaimFindings(slices, claims); len(f) != 0 {
		t.Fatalf("findings: %v", f)
	}
}

// Each planted fault is one the allocator must never make; the checker has to name it.
func TestEveryPlantedFaultIsFound(t *testing.T) {
	gate := resourcev1.DeviceTaint{Key: "gpu.carma.io/utilization-gate", Value: "busy", Effect: resourcev1.DeviceTaintEffectNoSchedule}
	slices := []resourcev1.ResourceSlice{
		slice("gpu.carma.io", "n1", sharedDevice("gpu-0"), sharedDevice("gpu-1"), sharedDevice("gpu-2", gate), sharedDevice("gpu-3", gate)),
		slice("gpu.whole", "n1", wholeDevice("gpu-0")),
	}
	tol := resourcev1.DeviceToleration{Key: gate.Key, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoSchedule}
	claims := []resourcev1.ResourceClaim{
		claim("a", booked("gpu.carma.io", "n1", "gpu-0", "50Gi")),
		claim("b", booked("gpu.carma.io", "n1", "gpu-0", "40Gi")),     // 90Gi on 80Gi
		claim("c", booked("gpu.carma.io", "n1", "gpu-1", "")),         // the whole device …
		claim("d", booked("gpu.carma.io", "n1", "gpu-1", "1Gi")),      // … and one more
		claim("e", booked("gpu.carma.io", "n1", "gpu-2", "1Gi")),      // tainted, no toleration
		claim("f", booked("gpu.carma.io", "n1", "gpu-3", "1Gi", tol)), // tainted, tolerated: fine
		claim("g", booked("gpu.whole", "n1", "gpu-0", "")),
		claim("h", booked("gpu.whole", "n1", "gpu-0", "")), // a second claim on an exclusive device
		claim("i", booked("gpu.carma.io", "n2", "gpu-0", "1Gi")),
	}
	got := kinds(ClaimFindings(slices, claims))
	want := "over-capacity gpu.carma.io/n1/gpu-0; over-capacity gpu.carma.io/n1/gpu-1; " +
		"shared-exclusive gpu.whole/n1/gpu-0; tainted-device gpu.carma.io/n1/gpu-2; unknown-device gpu.carma.io/n2/gpu-0"
	if got != want {
		t.Fatalf("findings:\n got %s\nwant %s", got, want)
	}
}

func TestATolerationMustMatchKeyValueAndEffect(t *testing.T) {
	taint := resourcev1.DeviceTaint{Key: "k", Value: "v", Effect: resourcev1.DeviceTaintEffectNoSchedule}
	for _, c := range []struct {
		tol  resourcev1.DeviceToleration
		want bool
	}{
		{resourcev1.DeviceToleration{Operator: resourcev1.DeviceTolerationOpExists}, true},
		{resourcev1.DeviceToleration{Key: "k", Operator: resourcev1.DeviceTolerationOpExists}, true},
		{resourcev1.DeviceToleration{Key: "k", Value: "v"}, true},
		{resourcev1.DeviceToleration{Key: "k", Value: "w", Operator: resourcev1.DeviceTolerationOpEqual}, false},
		{resourcev1.DeviceToleration{Key: "other", Operator: resourcev1.DeviceTolerationOpExists}, false},
		{resourcev1.DeviceToleration{Key: "k", Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoExecute}, false},
	} {
		if got := tolerates([]resourcev1.DeviceToleration{c.tol}, taint); got != c.want {
			t.Errorf("%+v tolerates %+v: %v, want %v", c.tol, taint, got, c.want)
		}
	}
}
