package release

import (
	"runtime/debug"
	"testing"
)

// A test binary's build information lists no dependencies, so fromDeps is tested on the build
// information a harness program carries (go version -m bin/node-harness).
func TestFromDeps(t *testing.T) {
	for _, c := range []struct {
		deps []*debug.Module
		want string
	}{
		{[]*debug.Module{{Path: "k8s.io/client-go", Version: "v0.0.0", Replace: &debug.Module{Path: "k8s.io/client-go", Version: "v0.36.5"}},
			{Path: "k8s.io/kubernetes", Version: "v1.36.5"}}, "v1.36.5"},
		{[]*debug.Module{{Path: "k8s.io/client-go", Version: "v0.36.5", Replace: &debug.Module{Path: "k8s.io/client-go", Version: "v0.36.5"}}}, "v1.36.5"},
		{[]*debug.Module{{Path: "k8s.io/client-go", Version: "v0.35.4"}}, "v1.35.4"},
	} {
		got, err := fromDeps(c.deps)
		if err != nil || got != c.want {
			t.Errorf("fromDeps(%v) = %q, %v; want %q", c.deps, got, err, c.want)
		}
	}
	if _, err := fromDeps([]*debug.Module{{Path: "k8s.io/api", Version: "v0.36.5"}}); err == nil {
		t.Error("fromDeps without client-go or kubernetes: want an error")
	}
}
