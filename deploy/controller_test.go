package deploy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/manifests"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// The controller's manifest and the node backends that connect to it.
const (
	controllerFile = "kpng-controller.yaml"
	nodeFile       = "kpng-nft-node.yaml"
	certsScript    = "kpng-controller-certs.sh"
)

// The controller's memory at 10,000 services × 10 endpoints
// (docs/benchmarks.md, "The controller as deployed: TLS and node
// certificates at 5,000 nodes"): what it holds with no backend (148–152
// MiB; the request's floor), and its peak RSS with 5,000 node backends on
// TLS, each with its own certificate and its Watch and Peers streams
// (588–668 MiB over eight runs, "The backends' second stream" and
// "The first states' target"; the limit's base and GOMEMLIMIT's floor).
// 1.5 times 668 MiB leaves 22 MiB under the manifest's 1 GiB limit: a
// higher peak measured means raising the limit with it.
const (
	controllerHeldMiB = 152
	controllerPeakMiB = 668
)

// controllerObjs is kpng-controller.yaml, decoded.
type controllerObjs struct {
	objs    []runtime.Object
	sa      *v1.ServiceAccount
	role    *rbacv1.ClusterRole
	binding *rbacv1.ClusterRoleBinding
	svc     *v1.Service
	deploy  *appsv1.Deployment
}

// nodeObjs is kpng-nft-node.yaml, decoded.
type nodeObjs struct {
	objs []runtime.Object
	sa   *v1.ServiceAccount
	ds   *appsv1.DaemonSet
}

func decodeFile(t *testing.T, file string) []runtime.Object {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := manifests.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return objs
}

func decodeController(t *testing.T) *controllerObjs {
	t.Helper()
	c := &controllerObjs{objs: decodeFile(t, controllerFile)}
	for _, o := range c.objs {
		switch o := o.(type) {
		case *v1.ServiceAccount:
			c.sa = o
		case *rbacv1.ClusterRole:
			c.role = o
		case *rbacv1.ClusterRoleBinding:
			c.binding = o
		case *v1.Service:
			c.svc = o
		case *appsv1.Deployment:
			c.deploy = o
		default:
			t.Fatalf("%s: unexpected %T", controllerFile, o)
		}
	}
	if len(c.objs) != 5 || c.sa == nil || c.role == nil || c.binding == nil || c.svc == nil || c.deploy == nil {
		t.Fatalf("%s: %d objects, want a ServiceAccount, a ClusterRole, a ClusterRoleBinding, a Service and a Deployment", controllerFile, len(c.objs))
	}
	return c
}

func decodeNode(t *testing.T) *nodeObjs {
	t.Helper()
	n := &nodeObjs{objs: decodeFile(t, nodeFile)}
	for _, o := range n.objs {
		switch o := o.(type) {
		case *v1.ServiceAccount:
			n.sa = o
		case *appsv1.DaemonSet:
			n.ds = o
		default:
			t.Fatalf("%s: unexpected %T", nodeFile, o)
		}
	}
	if len(n.objs) != 2 || n.sa == nil || n.ds == nil {
		t.Fatalf("%s: %d objects, want a ServiceAccount and a DaemonSet", nodeFile, len(n.objs))
	}
	return n
}

func onlyContainer(t *testing.T, spec v1.PodSpec) *v1.Container {
	t.Helper()
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(spec.Containers))
	}
	return &spec.Containers[0]
}

// cmdLine is a container's command with $(VAR) expanded from values (an
// undeclared variable is an error) and its --flag=value arguments.
type cmdLine struct {
	args  []string
	flags map[string]string
}

func commandLine(t *testing.T, c *v1.Container, values map[string]string) cmdLine {
	t.Helper()
	declared := map[string]bool{}
	for _, e := range c.Env {
		declared[e.Name] = true
	}
	cl := cmdLine{flags: map[string]string{}}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		a = envRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := envRef.FindStringSubmatch(ref)[1]
			if !declared[name] {
				t.Errorf("%s refers to $(%s), which the container's env does not declare", a, name)
			}
			return values[name]
		})
		cl.args = append(cl.args, a)
		if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") {
			if _, dup := cl.flags[k[2:]]; dup {
				t.Errorf("%s given twice", k)
			}
			cl.flags[k[2:]] = v
		}
	}
	return cl
}

// mountedFrom returns the volume holding path in c (by its mount), or
// fails.
func mountedFrom(t *testing.T, spec v1.PodSpec, c *v1.Container, path string) *v1.Volume {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			if !m.ReadOnly {
				t.Errorf("volume %s mounted read-write", m.Name)
			}
			for i, v := range spec.Volumes {
				if v.Name == m.Name {
					return &spec.Volumes[i]
				}
			}
			t.Fatalf("mount %s: no volume %s", m.MountPath, m.Name)
		}
	}
	t.Fatalf("%s: on no volume mount", path)
	return nil
}

// TestControllerManifestsAreConsistent checks kpng-controller.yaml and
// kpng-nft-node.yaml against themselves, each other, the image and kpng's
// command line, without an API server: the RBAC objects name each other
// and hold the watcher's rules; the Deployment runs two replicas of
// `kpng kube … to-api` on TCP with TLS and client certificates from its
// Secret, on different nodes, on the port the headless Service names; the
// DaemonSet runs `kpng api` given that Service's name and port, with its
// node's certificate from the host, NODE_NAME from the downward API, the
// table named for the controller's service-proxy-name, no API server
// credentials; kpng accepts both command lines.
func TestControllerManifestsAreConsistent(t *testing.T) {
	b := buildImage(t)
	df, err := parseDockerfile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	ctl, node := decodeController(t), decodeNode(t)
	spec := ctl.deploy.Spec.Template.Spec
	c := onlyContainer(t, spec)

	// RBAC: the watcher's, as the DaemonSets'.
	if ctl.deploy.Namespace != ctl.sa.Namespace || spec.ServiceAccountName != ctl.sa.Name {
		t.Errorf("Deployment runs as %q, want the ServiceAccount %s/%s", spec.ServiceAccountName, ctl.sa.Namespace, ctl.sa.Name)
	}
	if r := ctl.binding.RoleRef; r.Kind != "ClusterRole" || r.Name != ctl.role.Name || r.APIGroup != rbacv1.GroupName {
		t.Errorf("ClusterRoleBinding refers to %+v, want the ClusterRole %s", r, ctl.role.Name)
	}
	if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: ctl.sa.Name, Namespace: ctl.sa.Namespace}}; !cmp.Equal(ctl.binding.Subjects, want) {
		t.Errorf("ClusterRoleBinding subjects %+v, want %+v", ctl.binding.Subjects, want)
	}
	if diff := cmp.Diff(watcherRules, ctl.role.Rules); diff != "" {
		t.Errorf("ClusterRole rules, not the watcher's (-want +got):\n%s", diff)
	}

	// Two replicas, not on one node, one serving during a rollout.
	if r := ctl.deploy.Spec.Replicas; r == nil || *r < 2 {
		t.Errorf("replicas %v, want at least 2", r)
	}
	// One replica replaced at a time, without a surge replica: with the
	// required anti-affinity below, a surge replica has no node on a
	// cluster of as many nodes as replicas, and the rollout stalls (as
	// hack/cluster/test.sh's rolling update found with maxSurge: 1).
	if ru := ctl.deploy.Spec.Strategy.RollingUpdate; ru == nil || ru.MaxUnavailable == nil || ru.MaxSurge == nil ||
		ru.MaxUnavailable.IntValue() != 1 || ru.MaxSurge.IntValue() != 0 {
		t.Errorf("rolling update %+v, want maxUnavailable: 1 and maxSurge: 0", ru)
	}
	antiAffinity := false
	if a := spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil && cmp.Equal(term.LabelSelector.MatchLabels, ctl.deploy.Spec.Selector.MatchLabels) {
				antiAffinity = true
			}
		}
	}
	if !antiAffinity {
		t.Error("no required pod anti-affinity on kubernetes.io/hostname: both replicas could be on one node")
	}
	if !cmp.Equal(ctl.deploy.Spec.Selector.MatchLabels, ctl.svc.Spec.Selector) {
		t.Errorf("Service selects %v, the Deployment's pods are %v", ctl.svc.Spec.Selector, ctl.deploy.Spec.Selector.MatchLabels)
	}
	for k, v := range ctl.deploy.Spec.Selector.MatchLabels {
		if ctl.deploy.Spec.Template.Labels[k] != v {
			t.Errorf("pod template lacks the selector's label %s=%s", k, v)
		}
	}
	if spec.HostNetwork {
		t.Error("the controller has hostNetwork: it programs nothing on its node")
	}

	// The command: kpng kube … to-api on TCP with TLS and client
	// certificates, files from the Secret.
	if name, _, _ := strings.Cut(c.Image, ":"); stageOf(t, df, name).name != "nft" {
		t.Errorf("image %s: not kpng alone (the nft stage)", c.Image)
	}
	cmd := commandLine(t, c, map[string]string{"POD_IP": "10.244.1.5"})
	toAPI := slices.Index(cmd.args, "to-api")
	if len(cmd.args) < 3 || cmd.args[0] != "kpng" || cmd.args[1] != "kube" || toAPI < 0 {
		t.Fatalf("command %q: want kpng kube … to-api …", cmd.args)
	}
	proxyName := cmd.flags["service-proxy-name"]
	if proxyName == "" {
		t.Error("no --service-proxy-name: the controller would serve the services kube-proxy handles")
	}
	if want := ctl.svc.Namespace + "/" + ctl.svc.Name; cmd.flags["peers-service"] != want {
		t.Errorf("--peers-service=%s, want the controller's Service %s: its backends would learn a new replica only from the DNS", cmd.flags["peers-service"], want)
	}
	_, listenPort, err := net.SplitHostPort(cmd.flags["listen"])
	if err != nil || !strings.HasPrefix(cmd.flags["listen"], ":") {
		t.Errorf("--listen=%s: want :PORT (every address of the pod)", cmd.flags["listen"])
	}
	for _, f := range []string{"tls-cert", "tls-key", "tls-client-ca"} {
		if cmd.flags[f] == "" {
			t.Errorf("no --%s", f)
			continue
		}
		v := mountedFrom(t, spec, c, cmd.flags[f])
		if v.Secret == nil {
			t.Errorf("--%s=%s: not from a Secret", f, cmd.flags[f])
		} else if m := v.Secret.DefaultMode; m == nil || *m&0o007 != 0 {
			t.Errorf("Secret %s mounted with mode %v: want none for others", v.Secret.SecretName, m)
		}
	}
	if _, ok := cmd.flags["insecure-no-client-auth"]; ok {
		t.Error("--insecure-no-client-auth: any client could watch any node's view")
	}
	if !loopbackOnly(t, cmd.flags["metrics-bind-address"]) {
		t.Errorf("--metrics-bind-address=%s: want loopback", cmd.flags["metrics-bind-address"])
	}
	named := map[string]int32{}
	for _, p := range c.Ports {
		named[p.Name] = p.ContainerPort
	}
	if fmt.Sprint(named["api"]) != listenPort {
		t.Errorf("container port api %d, --listen port %s", named["api"], listenPort)
	}
	if _, hp, _ := net.SplitHostPort(cmd.flags["healthz-bind-address"]); fmt.Sprint(named["healthz"]) != hp {
		t.Errorf("container port healthz %d, --healthz-bind-address %s", named["healthz"], cmd.flags["healthz-bind-address"])
	}
	if pr := c.ReadinessProbe; pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != "/healthz" || pr.HTTPGet.Port.StrVal != "healthz" {
		t.Error("no readiness probe on /healthz: a replica would be in the Service's DNS answer before it holds a state")
	}
	if pr := c.LivenessProbe; pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != "/livez" || pr.HTTPGet.Port.StrVal != "healthz" {
		t.Error("no liveness probe on /livez")
	}
	if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || !cmp.Equal(sc.Capabilities.Drop, []v1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the controller's container is not non-root with every capability dropped")
	}
	// Memory: requested what the controller holds at 10,000 services
	// with no backend, limited with room over its peak with 5,000 node
	// backends on TLS, and Go's soft limit, if set, between the two.
	req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
	if req.IsZero() || lim.IsZero() {
		t.Error("no memory request or limit")
	} else {
		if req.Value() < controllerHeldMiB<<20 || req.Cmp(*lim) > 0 {
			t.Errorf("memory request %v: want at least %d MiB (held at 10,000 services) and at most the limit %v", req, controllerHeldMiB, lim)
		}
		if lim.Value() < controllerPeakMiB<<20*3/2 {
			t.Errorf("memory limit %v: want at least 1.5 times the peak of %d MiB measured with 5,000 backends", lim, controllerPeakMiB)
		}
	}
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		v, err := goMemLimit(e.Value)
		if err != nil || lim.IsZero() || v < controllerPeakMiB<<20 || v > lim.Value() {
			t.Errorf("GOMEMLIMIT=%s: want a size between the controller's peak with 5,000 backends (%d MiB) and the limit %v (%v)", e.Value, controllerPeakMiB, lim, err)
		}
	}

	// The headless Service on the API port.
	if ctl.svc.Spec.ClusterIP != v1.ClusterIPNone {
		t.Errorf("Service clusterIP %q, want None (headless: the name resolves to the replicas, no proxier needed)", ctl.svc.Spec.ClusterIP)
	}
	if len(ctl.svc.Spec.Ports) != 1 || fmt.Sprint(ctl.svc.Spec.Ports[0].Port) != listenPort ||
		(ctl.svc.Spec.Ports[0].TargetPort.StrVal != "api" && fmt.Sprint(ctl.svc.Spec.Ports[0].TargetPort.IntVal) != listenPort) {
		t.Errorf("Service ports %+v, want %s to the api port", ctl.svc.Spec.Ports, listenPort)
	}

	// The node backends.
	nspec := node.ds.Spec.Template.Spec
	nc := onlyContainer(t, nspec)
	if nspec.ServiceAccountName != node.sa.Name || node.ds.Namespace != node.sa.Namespace {
		t.Errorf("DaemonSet runs as %q, want %s", nspec.ServiceAccountName, node.sa.Name)
	}
	if a := nspec.AutomountServiceAccountToken; a == nil || *a {
		t.Error("the node backend's pod mounts a service account token: it does not talk to the API server")
	}
	if !nspec.HostNetwork {
		t.Error("hostNetwork is false: the rules would go into the pod's own network namespace")
	}
	ncmd := commandLine(t, nc, map[string]string{"POD_IP": nodeIP, "NODE_NAME": "node-a"})
	if len(ncmd.args) < 3 || ncmd.args[0] != "kpng" || ncmd.args[1] != "api" {
		t.Fatalf("command %q: want kpng api …", ncmd.args)
	}
	wantAPI := fmt.Sprintf("%s.%s.svc:%s", ctl.svc.Name, ctl.svc.Namespace, listenPort)
	if ncmd.flags["api"] != wantAPI {
		t.Errorf("--api=%s, want the controller's Service %s", ncmd.flags["api"], wantAPI)
	}
	rc := remote.Config{Address: ncmd.flags["api"], TLSCA: ncmd.flags["api-tls-ca"], TLSCert: ncmd.flags["api-tls-cert"], TLSKey: ncmd.flags["api-tls-key"]}
	if targets, err := rc.Targets(); err == nil || !strings.Contains(err.Error(), "no such file") {
		// The files do not exist here: the error names them, after the
		// address parsed.
		t.Errorf("the node's --api and TLS flags: %v (targets %v), want the missing files refused", err, targets)
	}
	for _, f := range []string{"api-tls-ca", "api-tls-cert", "api-tls-key"} {
		if ncmd.flags[f] == "" {
			t.Errorf("no --%s", f)
			continue
		}
		if v := mountedFrom(t, nspec, nc, ncmd.flags[f]); v.HostPath == nil && v.Secret == nil {
			t.Errorf("--%s=%s: from neither the host nor a Secret", f, ncmd.flags[f])
		}
	}
	if i := slices.Index(ncmd.args, "to-local"); i < 0 || i+1 >= len(ncmd.args) || ncmd.args[i+1] != "to-nft" {
		t.Errorf("command %q: want to-local to-nft", ncmd.args)
	}
	if ncmd.flags["name"] != proxyName {
		t.Errorf("to-nft --name=%s, want the controller's service-proxy-name %s (the table's name)", ncmd.flags["name"], proxyName)
	}
	nodeName := false
	for _, e := range nc.Env {
		if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
			nodeName = true
		}
	}
	if !nodeName {
		t.Error("no NODE_NAME from spec.nodeName")
	}
	// Its ports: not kube-proxy's nor the other DaemonSets'.
	nodePorts := map[int32]bool{}
	for _, p := range nc.Ports {
		nodePorts[p.ContainerPort] = true
	}
	for _, d := range daemonSets {
		for _, p := range onlyContainer(t, decode(t, d.file).ds.Spec.Template.Spec).Ports {
			if nodePorts[p.ContainerPort] && !d.defaultProxier {
				t.Errorf("port %d is also %s's", p.ContainerPort, d.file)
			}
		}
	}
	if sc := nc.SecurityContext; sc == nil || sc.Capabilities == nil || !cmp.Equal(sc.Capabilities.Add, []v1.Capability{"NET_ADMIN"}) || !cmp.Equal(sc.Capabilities.Drop, []v1.Capability{"ALL"}) {
		t.Error("the node backend's capabilities are not NET_ADMIN alone")
	}

	// kpng accepts both command lines (a wrong flag name exits 2).
	for _, args := range [][]string{cmd.args, ncmd.args} {
		run := exec.Command(filepath.Join(b.out, args[0]), append(args[1:], "--help")...)
		if out, err := run.CombinedOutput(); err != nil {
			t.Errorf("%s --help: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestControllerManifestsDryRun creates every object of both manifests
// on a real API server with a server-side dry run and strict field
// validation, then checks that the controller's ServiceAccount runs the
// watcher and may do nothing else, and that the node backends' may do
// nothing at all.
func TestControllerManifestsDryRun(t *testing.T) {
	cp.Require(t)
	ctx := context.Background()
	ctl, node := decodeController(t), decodeNode(t)
	for _, o := range append(slices.Clone(ctl.objs), node.objs...) {
		opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
		if err := manifests.CreateWith(ctx, cp.Client(), o, opts); err != nil {
			t.Errorf("dry run: %v", err)
		}
	}
	for _, o := range []runtime.Object{ctl.sa, ctl.role, ctl.binding, node.sa} {
		if err := manifests.Create(ctx, cp.Client(), o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		c := cp.Client()
		_ = c.RbacV1().ClusterRoleBindings().Delete(ctx, ctl.binding.Name, metav1.DeleteOptions{})
		_ = c.RbacV1().ClusterRoles().Delete(ctx, ctl.role.Name, metav1.DeleteOptions{})
		_ = c.CoreV1().ServiceAccounts(ctl.sa.Namespace).Delete(ctx, ctl.sa.Name, metav1.DeleteOptions{})
		_ = c.CoreV1().ServiceAccounts(node.sa.Namespace).Delete(ctx, node.sa.Name, metav1.DeleteOptions{})
	})
	cmd := commandLine(t, onlyContainer(t, ctl.deploy.Spec.Template.Spec), map[string]string{"POD_IP": "127.0.0.1"})
	user := "system:serviceaccount:" + ctl.sa.Namespace + ":" + ctl.sa.Name
	checkWatcherRuns(t, user, cmd.flags["service-proxy-name"])
	checkNothingElse(t, user)
	checkNothingElse(t, "system:serviceaccount:"+node.sa.Namespace+":"+node.sa.Name)
}

// TestControllerCertificates makes the certificates with
// kpng-controller-certs.sh as docs/controller.md says, runs the
// Deployment's command (its files replaced by the script's, on a loopback
// port) against the real API server, as the Deployment's user and group
// (the files readable by the group, with the Secret volume's mode), and connects as the DaemonSet's
// backend of node-a would (its CA, certificate and key, the Service's
// name checked in the server's certificate): node-a receives its view
// with its endpoint Local; node-a's certificate asking for node-b's view
// is refused; and the DaemonSet's own command (its files and port the
// test's, its rules in a network namespace of the test's, the Service's
// name resolved by an /etc/hosts of the test's in a mount namespace)
// programs node-a's endpoint.
func TestControllerCertificates(t *testing.T) {
	cp.Require(t)
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl")
	}
	b := buildImage(t)
	dir := t.TempDir()
	script, err := filepath.Abs(certsScript)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(script, dir, "node-a").CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", certsScript, err, out)
	}
	ctl := decodeController(t)
	c := onlyContainer(t, ctl.deploy.Spec.Template.Spec)
	cmd := commandLine(t, c, map[string]string{"POD_IP": "127.0.0.1"})
	proxyName := kubetest.UniqueName("ctl")
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	svc := kc.CreateService(kubetest.Service(ns, "a", proxyName))
	kc.CreateSlice(kubetest.Slice(svc, "a-1", kubetest.EP{IP: "10.9.0.1", Node: "node-a"}))

	// The controller runs as the Deployment's user and group (the pod's
	// fsGroup, which may read the Secret's files), given its own copies of
	// the files and the API server's kubeconfig.
	podSC, sc := ctl.deploy.Spec.Template.Spec.SecurityContext, c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || podSC == nil || podSC.FSGroup == nil {
		t.Fatal("the Deployment sets no runAsUser or fsGroup")
	}
	uid, gid := int(*sc.RunAsUser), int(*podSC.FSGroup)
	runDir, err := os.MkdirTemp("", "kpng-controller-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(runDir) })
	mode := os.FileMode(0o440)
	for _, v := range ctl.deploy.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.DefaultMode != nil {
			mode = os.FileMode(*v.Secret.DefaultMode)
		}
	}
	copyAs := func(src, dst string, mode os.FileMode) {
		data, err := os.ReadFile(src)
		if err == nil {
			err = os.WriteFile(dst, data, mode)
		}
		if err == nil {
			err = os.Chown(dst, 0, gid)
		}
		if err == nil {
			err = os.Chmod(dst, mode)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(runDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(runDir, 0, gid); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(runDir, "kubeconfig")
	copyAs(cp.KubeconfigPath(), kubeconfig, 0o440)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	var args []string
	for _, a := range cmd.args[1:] {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "--tls-cert", "--tls-key", "--tls-client-ca":
			copyAs(filepath.Join(dir, filepath.Base(v)), filepath.Join(runDir, filepath.Base(v)), mode)
			a = k + "=" + filepath.Join(runDir, filepath.Base(v))
		case "--listen":
			a = k + "=" + addr
		case "--service-proxy-name":
			a = k + "=" + proxyName
		case "--metrics-bind-address", "--healthz-bind-address":
			a = k + "=127.0.0.1:0"
		}
		args = append(args, a)
	}
	args = slices.Insert(args, 1, "--kubeconfig="+kubeconfig)
	// The binary, where that user may run it.
	bin := filepath.Join(runDir, "kpng")
	copyAs(filepath.Join(b.out, "kpng"), bin, 0o550)
	proc := exec.Command(bin, args...)
	proc.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	var out strings.Builder
	proc.Stdout, proc.Stderr = &out, &out
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proc.Process.Kill()
		_ = proc.Wait()
		if t.Failed() {
			t.Logf("kpng %s:\n%s", strings.Join(args, " "), out.String())
		}
	})

	// The DaemonSet's flags, with the node's files from the script.
	ncmd := commandLine(t, onlyContainer(t, decodeNode(t).ds.Spec.Template.Spec), map[string]string{"POD_IP": nodeIP, "NODE_NAME": "node-a"})
	host, _, _ := net.SplitHostPort(ncmd.flags["api"])
	nodeDir := filepath.Join(dir, "node-a")
	cfg := remote.Config{Address: addr, TLSServerName: host, NodeName: "node-a",
		TLSCA: filepath.Join(nodeDir, filepath.Base(ncmd.flags["api-tls-ca"])), TLSCert: filepath.Join(nodeDir, filepath.Base(ncmd.flags["api-tls-cert"])), TLSKey: filepath.Join(nodeDir, filepath.Base(ncmd.flags["api-tls-key"])),
		MinBackoff: 100 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
	checker := sinktest.NewChecker(nil)
	sinktest.RunSource(t, "node-a", checker, func(ctx context.Context, sink localsink.Sink) error {
		return remote.Run(ctx, cfg, sink)
	})
	checker.WaitSyncs(t, 1, time.Minute)
	st := checker.State()
	if len(st) != 1 || st[0].Service.Name != "a" || len(st[0].Endpoints) != 1 || !st[0].Endpoints[0].Local {
		t.Errorf("node-a's view: %v, want %s/a with its endpoint Local", describeState(st), ns)
	}

	// node-a's certificate may not watch node-b.
	cfg.NodeName = "node-b"
	target, opts, err := cfg.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := kpngv1.NewControllerClient(conn).Watch(ctx, &kpngv1.WatchRequest{NodeName: "node-b"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.PermissionDenied || errors.Is(err, io.EOF) {
		t.Errorf("node-a's certificate watching node-b: %v, want PermissionDenied", err)
	}

	// The DaemonSet's command as written, but for the files (the
	// script's), the port (the test's) and the rules' network namespace
	// (the test's), in a mount namespace whose /etc/hosts resolves the
	// Service's name to the controller's loopback address: it programs
	// node-a's view.
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "unshare", "nft")
	nodeNS := netns.New(t, "ctl-node")
	hosts := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost "+host+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	var nargs []string
	for _, a := range ncmd.args {
		k, v, _ := strings.Cut(a, "=")
		switch k {
		case "--api":
			a = k + "=" + host + ":" + port
		case "--api-tls-ca", "--api-tls-cert", "--api-tls-key":
			a = k + "=" + filepath.Join(nodeDir, filepath.Base(v))
		case "--metrics-bind-address", "--healthz-bind-address":
			a = k + "=127.0.0.1:0"
		}
		nargs = append(nargs, a)
	}
	nargs[0] = filepath.Join(b.out, "kpng")
	nargs = append(nargs, "--netns="+nodeNS.Path())
	nodeProc := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" /etc/hosts && shift && exec "$@"`, "sh", hosts}, nargs...)...)
	nodeProc.Env = append(os.Environ(), "NODE_NAME=node-a")
	var nodeOut strings.Builder
	nodeProc.Stdout, nodeProc.Stderr = &nodeOut, &nodeOut
	if err := nodeProc.Start(); err != nil {
		t.Fatal(err)
	}
	nodeDone := make(chan error, 1)
	go func() { nodeDone <- nodeProc.Wait() }()
	t.Cleanup(func() {
		_ = nodeProc.Process.Kill()
		<-nodeDone
		if t.Failed() {
			t.Logf("kpng %s:\n%s", strings.Join(nargs[1:], " "), nodeOut.String())
		}
	})
	table := "kpng-" + ncmd.flags["name"]
	var rules string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		rules, _, _ = nodeNS.Exec(nil, "nft", "list", "table", "ip", table)
		if strings.Contains(rules, "10.9.0.1") {
			break
		}
	}
	if !strings.Contains(rules, "10.9.0.1") {
		t.Errorf("the node backend did not program %s/a's endpoint 10.9.0.1 in table ip %s within a minute:\n%s", ns, table, rules)
	}
}

func describeState(st []*model.ServiceEndpoints) string {
	var out []string
	for _, se := range st {
		out = append(out, fmt.Sprintf("%s (%d endpoints)", se.Service.Key(), len(se.Endpoints)))
	}
	return strings.Join(out, ", ")
}
