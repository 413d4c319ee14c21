package overcommit

import (
	"fmt"
	"sort"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Kinds of findings on the DRA path (ClaimFindings).
const (
	UnknownDevice   = "unknown-device"   // an allocation names a device no ResourceSlice lists
	OverCapacity    = "over-capacity"    // the claims booked on a device exceed one of its capacities
	SharedExclusive = "shared-exclusive" // a device without allowMultipleAllocations is in several claims
	TaintedDevice   = "tainted-device"   // a device tainted NoSchedule was allocated without a toleration
)

// ClaimFindings judges the allocations of claims against the devices of slices, as kube-scheduler's
// allocator must keep them: every allocated device exists; a device that does not allow multiple
// allocations is in one claim at most; on one that does, the capacity the claims consumed stays
// within each of the device's capacities (a result without consumedCapacity counts as the whole
// device: every capacity's value); and no device tainted NoSchedule or NoExecute is allocated to a
// claim whose result does not tolerate the taint. A claim being deleted still holds its devices
// until it is deallocated, so it counts. Sorted by ID; a key is driver/pool/device.
func ClaimFindings(slices []resourcev1.ResourceSlice, claims []resourcev1.ResourceClaim) []Finding {
	devices := map[string]*resourcev1.Device{}
	for i := range slices {
		s := &slices[i]
		for j := range s.Spec.Devices {
			d := &s.Spec.Devices[j]
			devices[s.Spec.Driver+"/"+s.Spec.Pool.Name+"/"+d.Name] = d
		}
	}
	type use struct {
		claims   []string
		consumed map[resourcev1.QualifiedName]*resource.Quantity
	}
	per := map[string]*use{}
	var out []Finding
	for i := range claims {
		c := &claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		ref := c.Namespace + "/" + c.Name
		for _, r := range c.Status.Allocation.Devices.Results {
			key := r.Driver + "/" + r.Pool + "/" + r.Device
			d, known := devices[key]
			if per[key] == nil {
				per[key] = &use{consumed: map[resourcev1.QualifiedName]*resource.Quantity{}}
			}
			u := per[key]
			u.claims = append(u.claims, ref)
			if !known {
				continue
			}
			add := func(name resourcev1.QualifiedName, q resource.Quantity) {
				if u.consumed[name] == nil {
					u.consumed[name] = resource.NewQuantity(0, q.Format)
				}
				u.consumed[name].Add(q)
			}
			if len(r.ConsumedCapacity) == 0 {
				for name, c := range d.Capacity {
					add(name, c.Value)
				}
			} else {
				for name, q := range r.ConsumedCapacity {
					add(name, q)
				}
			}
			for _, t := range d.Taints {
				if (t.Effect == resourcev1.DeviceTaintEffectNoSchedule || t.Effect == resourcev1.DeviceTaintEffectNoExecute) &&
					!tolerates(r.Tolerations, t) {
					out = append(out, Finding{TaintedDevice, key, fmt.Sprintf("taint %s=%s:%s not tolerated by %s", t.Key, t.Value, t.Effect, ref), []string{ref}})
				}
			}
		}
	}
	for key, u := range per {
		sort.Strings(u.claims)
		d, ok := devices[key]
		if !ok {
			out = append(out, Finding{UnknownDevice, key, fmt.Sprintf("no ResourceSlice lists it (claims %v)", u.claims), u.claims})
			continue
		}
		multi := d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations
		if !multi && len(u.claims) > 1 {
			out = append(out, Finding{SharedExclusive, key, fmt.Sprintf("%d claims on a device that allows one: %v", len(u.claims), u.claims), u.claims})
		}
		if !multi {
			continue
		}
		names := make([]string, 0, len(u.consumed))
		for name := range u.consumed {
			names = append(names, string(name))
		}
		sort.Strings(names)
		var over []string
		for _, name := range names {
			used := u.consumed[resourcev1.QualifiedName(name)]
			if c, has := d.Capacity[resourcev1.QualifiedName(name)]; !has {
				over = append(over, fmt.Sprintf("%s %s of a capacity the device lacks", used.String(), name))
			} else if used.Cmp(c.Value) > 0 {
				over = append(over, fmt.Sprintf("%s of %s %s", used.String(), c.Value.String(), name))
			}
		}
		if len(over) > 0 {
			out = append(out, Finding{OverCapacity, key, fmt.Sprintf("%s consumed by %v", strings.Join(over, ", "), u.claims), u.claims})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out
}

// tolerates: one of ts tolerates taint t (the rules of DeviceToleration: an empty key with Exists
// tolerates everything; Equal compares the value; an empty effect matches every effect).
func tolerates(ts []resourcev1.DeviceToleration, t resourcev1.DeviceTaint) bool {
	for _, x := range ts {
		if x.Effect != "" && x.Effect != t.Effect {
			continue
		}
		switch x.Operator {
		case resourcev1.DeviceTolerationOpExists:
			if x.Key == "" || x.Key == t.Key {
				return true
			}
		case resourcev1.DeviceTolerationOpEqual, "":
			if x.Key == t.Key && x.Value == t.Value {
				return true
			}
		}
	}
	return false
}
