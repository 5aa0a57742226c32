package manifests_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"

	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/internal/manifests"
)

// exampleCaps are the capabilities each container of the example proxy
// needs: the controller none (it watches the API server and serves a unix
// socket), the callout NET_ADMIN for the all-IP script's iptables-nft
// (TestExampleCalloutConfinement shows that it works with it and not
// without).
var exampleCaps = map[string][]v1.Capability{
	"kpng":         nil,
	"kpng-callout": {"NET_ADMIN"},
}

// exampleProxy returns the DaemonSet of kpng-example-proxy.yaml.
func exampleProxy(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	f, err := os.Open("kpng-example-proxy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := manifests.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if ds, ok := o.(*appsv1.DaemonSet); ok {
			return ds
		}
	}
	t.Fatal("kpng-example-proxy.yaml: no DaemonSet")
	return nil
}

// container returns the container of ds named name.
func container(t *testing.T, ds *appsv1.DaemonSet, name string) *v1.Container {
	t.Helper()
	for i, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == name {
			return &ds.Spec.Template.Spec.Containers[i]
		}
	}
	t.Fatalf("DaemonSet %s: no container %s", ds.Name, name)
	return nil
}

// TestExampleProxyConfinement: each container of the example proxy is
// confined as deploy/'s DaemonSets are: not privileged, no privilege
// escalation, a read-only root file system, every capability dropped but
// those it needs, the runtime's seccomp profile.
func TestExampleProxyConfinement(t *testing.T) {
	ds := exampleProxy(t)
	if n := len(ds.Spec.Template.Spec.Containers); n != len(exampleCaps) {
		t.Errorf("%d containers, want %d", n, len(exampleCaps))
	}
	for name, caps := range exampleCaps {
		c := container(t, ds, name)
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no securityContext", name)
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation not false", name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: readOnlyRootFilesystem not true", name)
		}
		if sc.SeccompProfile == nil || sc.SeccompProfile.Type != v1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: seccompProfile %v, want RuntimeDefault", name, sc.SeccompProfile)
		}
		if sc.Capabilities == nil || !cmp.Equal(sc.Capabilities.Drop, []v1.Capability{"ALL"}) {
			t.Errorf("%s: capabilities %v, want ALL dropped", name, sc.Capabilities)
			continue
		}
		if !slices.Equal(sc.Capabilities.Add, caps) {
			t.Errorf("%s: adds %v, want %v", name, sc.Capabilities.Add, caps)
		}
	}
}

// TestExampleProxySocketDirectory makes the volume that holds the
// controller's socket as the kubelet makes it (an emptyDir: mode 0777, as
// k8s.io/kubernetes/pkg/volume/emptydir creates it; a hostPath
// DirectoryOrCreate: 0755) and listens there as `kpng … to-api
// --listen=…` does: the controller must accept the directory (it refuses
// one others can write to, and so refused the emptyDir the example had).
func TestExampleProxySocketDirectory(t *testing.T) {
	ds := exampleProxy(t)
	c := container(t, ds, "kpng")
	var listen string
	for _, a := range c.Command {
		if v, ok := strings.CutPrefix(a, "--listen=unix://"); ok {
			listen = v
		}
	}
	if listen == "" {
		t.Fatalf("command %q: no --listen=unix://…", c.Command)
	}
	var mount *v1.VolumeMount
	for i, m := range c.VolumeMounts {
		if m.MountPath == filepath.Dir(listen) {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("no volume mounted at %s, the socket's directory", filepath.Dir(listen))
	}
	var vol *v1.Volume
	for i, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == mount.Name {
			vol = &ds.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("no volume %s", mount.Name)
	}
	dir := filepath.Join(t.TempDir(), "volume")
	switch {
	case vol.EmptyDir != nil:
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o777); err != nil { // whatever the umask
			t.Fatal(err)
		}
	case vol.HostPath != nil && vol.HostPath.Type != nil && *vol.HostPath.Type == v1.HostPathDirectoryOrCreate:
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("volume %s: %+v, want an emptyDir or a hostPath DirectoryOrCreate", vol.Name, vol.VolumeSource)
	}
	l, _, err := server.ListenConfig{Address: "unix://" + filepath.Join(dir, filepath.Base(listen))}.Listen()
	if err != nil {
		t.Fatalf("the controller in the example's socket volume (%s): %v", vol.Name, err)
	}
	l.Close()
}
