// Package release names the Kubernetes release the harness programs were built against, read from the
// program's own build information, so that the nodes they post report the kubelet version of the
// release go.mod pins (the one build.sh builds the control plane from) without a second copy of it.
package release

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// KubeletVersion is the version a node built by this program reports ("v1.36.5"): k8s.io/kubernetes's
// version where the program links it, else k8s.io/client-go's staging version v0.X.Y as its release
// v1.X.Y (go.mod replaces every staging module by the published v0 version of the same release).
func KubeletVersion() (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build information in this binary")
	}
	return fromDeps(info.Deps)
}

func fromDeps(deps []*debug.Module) (string, error) {
	version := func(m *debug.Module) string {
		if m.Replace != nil && m.Replace.Version != "" {
			return m.Replace.Version
		}
		return m.Version
	}
	var staging string
	for _, m := range deps {
		switch m.Path {
		case "k8s.io/kubernetes":
			if v := version(m); strings.HasPrefix(v, "v1.") {
				return v, nil
			}
		case "k8s.io/client-go":
			staging = version(m)
		}
	}
	if rest, ok := strings.CutPrefix(staging, "v0."); ok {
		return "v1." + rest, nil
	}
	return "", fmt.Errorf("neither k8s.io/kubernetes v1.x nor k8s.io/client-go v0.x in the build information (client-go %q)", staging)
}
