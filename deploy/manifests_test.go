package deploy_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"sigs.k8s.io/kpng/client"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/manifests"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

// daemonSets are the manifests of this directory: the backend each runs
// and the capabilities it needs (capabilities_linux_test.go shows that it
// works with them and not with one fewer, with each of variants: backend
// flags, the first of which needs every capability).
// The default proxiers (defaultProxier) run instead of kube-proxy: no
// service-proxy-name, kube-proxy's ports, the API server's address from a
// ConfigMap.
var daemonSets = []struct {
	file     string
	backend  string
	caps     []v1.Capability
	variants [][]string
	// childMiB is the peak RSS of the program the backend runs beside
	// kpng in the container, measured at 10,000 services × 10 endpoints
	// (docs/benchmarks.md, "Memory limits of the DaemonSets").
	childMiB       int64
	defaultProxier bool
}{
	{"kpng-nft.yaml", "to-nft", []v1.Capability{"NET_ADMIN"}, [][]string{nil}, 0, false},
	{"kpng-iptables.yaml", "to-iptables", []v1.Capability{"NET_ADMIN", "NET_RAW"}, [][]string{{"--iptables=legacy"}, {"--iptables=nft"}}, 170, false},
	{"kpng-default-nft.yaml", "to-nft", []v1.Capability{"NET_ADMIN"}, [][]string{nil}, 0, true},
	{"kpng-default-iptables.yaml", "to-iptables", []v1.Capability{"NET_ADMIN", "NET_RAW"}, [][]string{{"--iptables=legacy"}, {"--iptables=nft"}}, 170, true},
	{"kpng-default-userspace.yaml", "to-userspace", []v1.Capability{"NET_ADMIN", "NET_BIND_SERVICE"}, [][]string{nil}, 0, true},
}

// imageStage is the Dockerfile stage whose image runs each backend: what
// the backend runs besides kpng, no more. to-userspace, like to-nft,
// speaks netlink and runs no program: kpng alone.
var imageStage = map[string]string{
	"to-nft":       "nft",
	"to-iptables":  "iptables",
	"to-userspace": "nft",
}

// apiServerConfigMap is the ConfigMap a default proxier reads the API
// server's address from (KUBERNETES_SERVICE_HOST and _PORT): the
// kubernetes Service's cluster IP works only once the proxier runs.
const apiServerConfigMap = "kpng-apiserver"

// peakMiB is kpng kube's peak RSS at 10,000 services × 10 endpoints (the
// highest of six processes, docs/benchmarks.md).
const peakMiB = 304

// heldMiB is what kpng kube holds at 10,000 services × 10 endpoints
// after its first state (173–181 MiB): the memory request.
const heldMiB = 181

// kpngMiB is kpng kube's memory with each backend at 10,000 services × 10
// endpoints: what it holds after its first state (the request's floor)
// and its peak (the limit's base, GOMEMLIMIT's floor). to-userspace holds
// more than to-nft (a listening socket and its goroutine per service
// port) and peaks lower (no transaction to build):
// BenchmarkKpngUserspaceRealAPIServer10k, 3 processes, held 194–195 MiB,
// peak 218–225 MiB (docs/benchmarks.md).
var kpngMiB = map[string]struct{ held, peak int64 }{
	"to-nft":       {heldMiB, peakMiB},
	"to-iptables":  {heldMiB, peakMiB},
	"to-userspace": {195, 225},
}

// goMemUnits are the units the Go runtime reads in GOMEMLIMIT.
var goMemUnits = map[string]int64{"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

// goMemLimit returns the bytes of a GOMEMLIMIT value as the Go runtime
// reads it (digits, then B, KiB, MiB, GiB or TiB), or an error for a value
// it refuses at start ("800Mi": "malformed GOMEMLIMIT") or "off".
func goMemLimit(v string) (int64, error) {
	i := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if i < 0 {
		i = len(v)
	}
	unit, ok := goMemUnits[v[i:]]
	n, err := strconv.ParseInt(v[:i], 10, 64)
	if !ok || err != nil || i == 0 {
		return 0, fmt.Errorf("GOMEMLIMIT=%q: want digits and B, KiB, MiB, GiB or TiB (as the Go runtime reads it)", v)
	}
	return n * unit, nil
}

// watcherRules are the permissions of the watcher (client/watcher): it
// lists, then watches, Services and EndpointSlices (by label) and its Node
// (by name); it gets, creates, updates or deletes nothing.
var watcherRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"services", "nodes"}, Verbs: []string{"list", "watch"}},
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list", "watch"}},
}

// serviceCIDRRule is what the watcher of a default proxier needs besides:
// the ServiceCIDR objects, whose ranges are the cluster IPs (addresses no
// service holds are then refused, as kube-proxy does).
var serviceCIDRRule = rbacv1.PolicyRule{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"servicecidrs"}, Verbs: []string{"list", "watch"}}

// proxier is one manifest, decoded.
type proxier struct {
	objs    []runtime.Object
	sa      *v1.ServiceAccount
	role    *rbacv1.ClusterRole
	binding *rbacv1.ClusterRoleBinding
	ds      *appsv1.DaemonSet
}

// container returns the DaemonSet's only container.
func (p *proxier) container(t *testing.T) *v1.Container {
	t.Helper()
	cs := p.ds.Spec.Template.Spec.Containers
	if len(cs) != 1 {
		t.Fatalf("DaemonSet %s: %d containers, want 1", p.ds.Name, len(cs))
	}
	return &cs[0]
}

// decode reads a manifest of this directory, strictly.
func decode(t *testing.T, file string) *proxier {
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
	p := &proxier{objs: objs}
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.ServiceAccount:
			p.sa = o
		case *rbacv1.ClusterRole:
			p.role = o
		case *rbacv1.ClusterRoleBinding:
			p.binding = o
		case *appsv1.DaemonSet:
			p.ds = o
		default:
			t.Fatalf("%s: unexpected %T", file, o)
		}
	}
	if len(objs) != 4 || p.sa == nil || p.role == nil || p.binding == nil || p.ds == nil {
		t.Fatalf("%s: %d objects, want a ServiceAccount, a ClusterRole, a ClusterRoleBinding and a DaemonSet", file, len(objs))
	}
	return p
}

// command is a DaemonSet's command line, split as kpng reads it.
type command struct {
	kube    map[string]string // the kube input's flags
	backend string            // after to-local
	args    []string          // the whole command, $(VAR) expanded
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// parseCommand splits c's command and expands its $(VAR) references with
// values for the variables of its env (the kubelet expands them from the
// env): an undeclared variable is an error, as the kubelet would leave it
// unexpanded.
func parseCommand(t *testing.T, c *v1.Container, values map[string]string) command {
	t.Helper()
	declared := map[string]bool{}
	for _, e := range c.Env {
		declared[e.Name] = true
	}
	cmd := command{kube: map[string]string{}}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		a = envRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := envRef.FindStringSubmatch(ref)[1]
			if !declared[name] {
				t.Errorf("%s refers to $(%s), which the container's env does not declare", a, name)
			}
			return values[name]
		})
		cmd.args = append(cmd.args, a)
	}
	if len(cmd.args) < 4 || cmd.args[0] != "kpng" || cmd.args[1] != "kube" {
		t.Fatalf("command %q: want kpng kube … to-local <backend>", cmd.args)
	}
	i := slices.Index(cmd.args, "to-local")
	if i < 0 || i+1 >= len(cmd.args) {
		t.Fatalf("command %q: no to-local <backend>", cmd.args)
	}
	cmd.backend = cmd.args[i+1]
	for _, a := range cmd.args[2:i] {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		cmd.kube[k] = v
	}
	return cmd
}

// nodeIP is the value the tests give $(POD_IP): with hostNetwork, the
// node's address.
const nodeIP = "192.0.2.10"

// loopbackOnly says whether the bind address addr (host:port) listens on
// loopback only: an IP literal of 127.0.0.0/8 or ::1 (not a name, not an
// empty host, which is every address).
func loopbackOnly(t *testing.T, addr string) bool {
	t.Helper()
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("%s: %v", addr, err)
		return false
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// port returns the port of a bind address flag.
func port(t *testing.T, cmd command, flag string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(cmd.kube[flag])
	if err != nil {
		t.Fatalf("--%s=%s: %v", flag, cmd.kube[flag], err)
	}
	n, err := net.LookupPort("tcp", p)
	if err != nil {
		t.Fatalf("--%s=%s: %v", flag, cmd.kube[flag], err)
	}
	return int32(n)
}

// TestDaemonSetsAreConsistent checks each manifest against itself, the
// image and kpng's command line, without an API server.
func TestDaemonSetsAreConsistent(t *testing.T) {
	// The image's programs, for the command's binary and flags.
	b := buildImage(t)
	df, err := parseDockerfile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// inImage tells the programs of the image a container runs.
	inImage := func(t *testing.T, image string) map[string]bool {
		name, _, _ := strings.Cut(image, ":")
		progs := map[string]bool{}
		for _, cp := range stageOf(t, df, name).all("COPY") {
			for _, src := range cp.args[:len(cp.args)-1] {
				progs[filepath.Base(src)] = true
			}
		}
		return progs
	}
	ports := map[int32]string{}
	for _, d := range daemonSets {
		t.Run(d.file, func(t *testing.T) {
			p := decode(t, d.file)
			// The RBAC objects name each other and the DaemonSet runs as
			// the ServiceAccount, in its namespace.
			if p.ds.Namespace != p.sa.Namespace || p.ds.Spec.Template.Spec.ServiceAccountName != p.sa.Name {
				t.Errorf("DaemonSet %s/%s runs as %q, want the ServiceAccount %s/%s", p.ds.Namespace, p.ds.Name, p.ds.Spec.Template.Spec.ServiceAccountName, p.sa.Namespace, p.sa.Name)
			}
			if r := p.binding.RoleRef; r.Kind != "ClusterRole" || r.Name != p.role.Name || r.APIGroup != rbacv1.GroupName {
				t.Errorf("ClusterRoleBinding refers to %+v, want the ClusterRole %s", r, p.role.Name)
			}
			if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: p.sa.Name, Namespace: p.sa.Namespace}}; !cmp.Equal(p.binding.Subjects, want) {
				t.Errorf("ClusterRoleBinding subjects %+v, want %+v", p.binding.Subjects, want)
			}
			// Least privilege: the watcher's permissions, no more.
			want := watcherRules
			if d.defaultProxier {
				want = append(slices.Clone(watcherRules), serviceCIDRRule)
			}
			if diff := cmp.Diff(want, p.role.Rules); diff != "" {
				t.Errorf("ClusterRole rules, not the watcher's (-want +got):\n%s", diff)
			}

			spec := p.ds.Spec.Template.Spec
			if !spec.HostNetwork {
				t.Error("hostNetwork is false: the rules would go into the pod's own network namespace")
			}
			c := p.container(t)
			// Each proxier's own image: what its backend runs, no more.
			if name, _, _ := strings.Cut(c.Image, ":"); stageOf(t, df, name).name != imageStage[d.backend] {
				t.Errorf("image %s: not the %s proxier's image (stage %q)", c.Image, d.backend, imageStage[d.backend])
			}
			if progs := inImage(t, c.Image); !progs[c.Command[0]] {
				t.Errorf("command %s: not a program of the image %s (%v)", c.Command[0], c.Image, progs)
			}
			cmd := parseCommand(t, c, map[string]string{"POD_IP": nodeIP, "NODE_NAME": "node-a"})
			if cmd.backend != d.backend {
				t.Errorf("backend %s, want %s", cmd.backend, d.backend)
			}
			if d.defaultProxier {
				if cmd.kube["service-proxy-name"] != "" {
					t.Errorf("--service-proxy-name=%s: a default proxier handles the services without one", cmd.kube["service-proxy-name"])
				}
				fromConfigMap := false
				for _, e := range c.EnvFrom {
					if e.ConfigMapRef != nil && e.ConfigMapRef.Name == apiServerConfigMap && e.Prefix == "" && (e.ConfigMapRef.Optional == nil || !*e.ConfigMapRef.Optional) {
						fromConfigMap = true
					}
				}
				if !fromConfigMap {
					t.Errorf("no env from the ConfigMap %s (required): kpng would look for the API server at the cluster IP it has not programmed yet", apiServerConfigMap)
				}
			} else if cmd.kube["service-proxy-name"] == "" {
				t.Error("no --service-proxy-name: it would proxy the services kube-proxy handles")
			}
			// NODE_NAME is the node's name (Local endpoints, topology).
			nodeName := false
			for _, e := range c.Env {
				if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
					nodeName = true
				}
			}
			if !nodeName && cmd.kube["node-name"] == "" {
				t.Error("neither NODE_NAME from spec.nodeName nor --node-name")
			}

			// What is served where: the metrics (and the debug endpoint,
			// if on) on loopback only, as kube-proxy's; health on the
			// node's address (the pod's, with hostNetwork), which the
			// kubelet probes.
			for _, flag := range []string{"metrics-bind-address", "debug-bind-address"} {
				if a, ok := cmd.kube[flag]; ok && !loopbackOnly(t, a) {
					t.Errorf("--%s=%s: want a loopback address (127.0.0.1), not one the node's network reaches", flag, a)
				}
			}
			if _, ok := cmd.kube["metrics-bind-address"]; !ok {
				t.Error("no --metrics-bind-address")
			}
			// A default proxier's health is where kube-proxy's is by default,
			// on every address: the kubelet probes the node's, load balancers
			// too, and tools and Kubernetes' e2e tests ask the node's own
			// 127.0.0.1:10256. A specialized proxier's is on the node's only.
			wantHealth := nodeIP
			if d.defaultProxier {
				wantHealth = "0.0.0.0"
			}
			if h, _, err := net.SplitHostPort(cmd.kube["healthz-bind-address"]); err != nil || h != wantHealth {
				t.Errorf("--healthz-bind-address=%s: want %s", cmd.kube["healthz-bind-address"], wantHealth)
			}

			// Ports: named, those of the flags; a specialized proxier's are
			// not kube-proxy's nor the other DaemonSets', a default
			// proxier's are kube-proxy's.
			metrics, healthz := port(t, cmd, "metrics-bind-address"), port(t, cmd, "healthz-bind-address")
			named := map[string]int32{}
			for _, cp := range c.Ports {
				named[cp.Name] = cp.ContainerPort
			}
			if named["metrics"] != metrics || named["healthz"] != healthz {
				t.Errorf("container ports %v, want metrics %d and healthz %d (the bind addresses)", named, metrics, healthz)
			}
			if d.defaultProxier {
				if metrics != 10249 || healthz != 10256 {
					t.Errorf("metrics on %d and healthz on %d, want kube-proxy's 10249 and 10256", metrics, healthz)
				}
			}
			for _, n := range []int32{metrics, healthz} {
				if d.defaultProxier {
					continue
				}
				if n == 10249 || n == 10256 {
					t.Errorf("port %d is kube-proxy's", n)
				}
				if other, ok := ports[n]; ok {
					t.Errorf("port %d is also %s's", n, other)
				}
				ports[n] = d.file
			}
			for _, pr := range []struct {
				name, path string
				probe      *v1.Probe
			}{{"liveness", "/livez", c.LivenessProbe}, {"readiness", "/healthz", c.ReadinessProbe}} {
				if pr.probe == nil || pr.probe.HTTPGet == nil {
					t.Errorf("no HTTP %s probe", pr.name)
					continue
				}
				if g := pr.probe.HTTPGet; g.Path != pr.path || (g.Port.StrVal != "healthz" && g.Port.IntVal != healthz) {
					t.Errorf("%s probe GET %s on %s, want %s on the healthz port", pr.name, g.Path, g.Port.String(), pr.path)
				}
			}

			// Capabilities, not privileges.
			sc := c.SecurityContext
			if sc == nil || sc.Capabilities == nil {
				t.Fatal("no securityContext with capabilities")
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Error("privileged")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("allowPrivilegeEscalation not false")
			}
			if !cmp.Equal(sc.Capabilities.Drop, []v1.Capability{"ALL"}) {
				t.Errorf("drops %v, want ALL", sc.Capabilities.Drop)
			}
			if !cmp.Equal(sc.Capabilities.Add, d.caps) {
				t.Errorf("adds %v, want %v", sc.Capabilities.Add, d.caps)
			}

			// Memory: requested what kpng holds at 10,000 services,
			// limited with room over the peak measured there, and Go's
			// soft limit, if set, under the container's.
			req, lim := c.Resources.Requests.Memory(), c.Resources.Limits.Memory()
			mem, ok := kpngMiB[d.backend]
			if !ok {
				t.Fatalf("no memory measured for backend %s (kpngMiB)", d.backend)
			}
			if req.IsZero() || lim.IsZero() {
				t.Errorf("memory request %v, limit %v: want both", req, lim)
			} else {
				if req.Value() < mem.held<<20 || req.Cmp(*lim) > 0 {
					t.Errorf("memory request %v: want at least %d MiB (held at 10,000 services) and at most the limit %v", req, mem.held, lim)
				}
				if peak := mem.peak + d.childMiB; lim.Value() < peak<<20*3/2 {
					t.Errorf("memory limit %v: want at least 1.5 times the peak of %d MiB measured at 10,000 services", lim, peak)
				}
			}
			for _, e := range c.Env {
				if e.Name != "GOMEMLIMIT" {
					continue
				}
				v, err := goMemLimit(e.Value)
				if err != nil || lim.IsZero() || v < mem.peak<<20 || v > lim.Value()-d.childMiB<<20 {
					t.Errorf("GOMEMLIMIT=%s: want a size over kpng's peak (%d MiB) that leaves the limit %v room for what the backend runs (%d MiB) (%v)", e.Value, mem.peak, lim, d.childMiB, err)
				}
			}

			// kpng accepts the command line (a wrong flag name exits 2).
			run := exec.Command(filepath.Join(b.out, cmd.args[0]), append(cmd.args[1:], "--help")...)
			if out, err := run.CombinedOutput(); err != nil {
				t.Errorf("%s --help: %v\n%s", strings.Join(cmd.args, " "), err, out)
			}
		})
	}
}

// TestDaemonSetsDryRun creates every object of each manifest on a real API
// server with a server-side dry run and strict field validation, then
// checks that the ServiceAccount's permissions run the watcher and allow
// nothing else.
func TestDaemonSetsDryRun(t *testing.T) {
	cp.Require(t)
	ctx := context.Background()
	for _, d := range daemonSets {
		t.Run(d.file, func(t *testing.T) {
			p := decode(t, d.file)
			for _, o := range p.objs {
				opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}
				if err := manifests.CreateWith(ctx, cp.Client(), o, opts); err != nil {
					t.Errorf("dry run: %v", err)
				}
			}
			// A dry run leaves nothing behind.
			if _, err := cp.Client().AppsV1().DaemonSets(p.ds.Namespace).Get(ctx, p.ds.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("after the dry run, get DaemonSet %s: %v, want not found", p.ds.Name, err)
			}

			// The RBAC objects for real, then act as the ServiceAccount.
			for _, o := range []runtime.Object{p.sa, p.role, p.binding} {
				if err := manifests.Create(ctx, cp.Client(), o); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				c := cp.Client()
				_ = c.RbacV1().ClusterRoleBindings().Delete(ctx, p.binding.Name, metav1.DeleteOptions{})
				_ = c.RbacV1().ClusterRoles().Delete(ctx, p.role.Name, metav1.DeleteOptions{})
				_ = c.CoreV1().ServiceAccounts(p.sa.Namespace).Delete(ctx, p.sa.Name, metav1.DeleteOptions{})
			})
			user := "system:serviceaccount:" + p.sa.Namespace + ":" + p.sa.Name
			cmd := parseCommand(t, p.container(t), map[string]string{"POD_IP": "127.0.0.1"})
			checkWatcherRuns(t, user, cmd.kube["service-proxy-name"])
			checkNothingElse(t, user)
		})
	}
}

// checkWatcherRuns runs the watcher as `kpng kube` does (client.Flags)
// with the identity of user, and expects it to deliver a service of
// proxyName.
func checkWatcherRuns(t *testing.T, user, proxyName string) {
	t.Helper()
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	svc := kc.CreateService(kubetest.Service(ns, "a", proxyName))
	kc.CreateSlice(kubetest.Slice(svc, "a-1", kubetest.EP{IP: "10.9.0.1", Node: "node-a"}))

	// A kubeconfig that impersonates user.
	cfg, err := clientcmd.LoadFromFile(cp.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = user
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	f := client.Flags{Kubeconfig: path, ServiceProxyName: proxyName, NodeName: "node-a"}
	w, _, err := f.Watcher()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make(chan []*model.ServiceEndpoints, 1)
	done := make(chan error, 1)
	go func() {
		done <- w.Run(ctx, localsink.NewFullState(func(items []*model.ServiceEndpoints) {
			select {
			case got <- items:
			default:
			}
		}))
	}()
	select {
	case items := <-got:
		// A default proxier gets every unlabelled service of the API
		// server (kubernetes, other tests'): ns/a must be among them.
		var a *model.ServiceEndpoints
		for _, it := range items {
			if it.Service.Namespace == ns && it.Service.Name == "a" {
				a = it
			}
		}
		if a == nil || len(a.Endpoints) != 1 || !a.Endpoints[0].Local || (proxyName != "" && len(items) != 1) {
			t.Errorf("as %s, the watcher got %d services, want %s/a with its local endpoint", user, len(items), ns)
		}
	case <-ctx.Done():
		t.Errorf("as %s, the watcher delivered nothing within 30s", user)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watcher: %v", err)
	}
	if proxyName == "" {
		cfg := cp.RESTConfig()
		cfg.Impersonate.UserName = user
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.NetworkingV1().ServiceCIDRs().List(context.Background(), metav1.ListOptions{}); err != nil {
			t.Errorf("as %s, the default proxier's watcher cannot list ServiceCIDRs: %v", user, err)
		}
	}
}

// checkNothingElse checks that user may not read or write what the
// watcher does not need.
func checkNothingElse(t *testing.T, user string) {
	t.Helper()
	ctx := context.Background()
	cfg := cp.RESTConfig()
	cfg.Impersonate.UserName = user
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for what, call := range map[string]func() error{
		"get a service": func() error {
			_, err := c.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
			return err
		},
		"get a node": func() error {
			_, err := c.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{})
			return err
		},
		"list secrets": func() error {
			_, err := c.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list pods": func() error {
			_, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list endpoints": func() error {
			_, err := c.CoreV1().Endpoints("").List(ctx, metav1.ListOptions{})
			return err
		},
		"create an event": func() error {
			_, err := c.CoreV1().Events("default").Create(ctx, &v1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
			return err
		},
		"delete a service": func() error {
			return c.CoreV1().Services("default").Delete(ctx, "kubernetes", metav1.DeleteOptions{})
		},
		"patch a node": func() error {
			_, err := c.CoreV1().Nodes().Patch(ctx, "node-a", "application/merge-patch+json", []byte(`{}`), metav1.PatchOptions{})
			return err
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("as %s, %s: %v, want forbidden", user, what, err)
		}
	}
}

// TestDefaultProxiersFollowTheSpecialized: each default-proxier manifest
// is its specialized proxier's with only the differences a default proxier
// needs (names, no service-proxy-name, kube-proxy's ports and health
// address, the API server's ConfigMap, the ServiceCIDRs): what is set for confinement, memory and scheduling in
// one is set in the other.
func TestDefaultProxiersFollowTheSpecialized(t *testing.T) {
	for _, pair := range [][2]string{{"kpng-nft.yaml", "kpng-default-nft.yaml"}, {"kpng-iptables.yaml", "kpng-default-iptables.yaml"}} {
		t.Run(pair[1], func(t *testing.T) {
			spec, def := decode(t, pair[0]), decode(t, pair[1])
			s, d := spec.ds.Spec.Template.Spec, def.ds.Spec.Template.Spec
			sc, dc := spec.container(t), def.container(t)
			for _, f := range []struct {
				what string
				s, d any
			}{
				{"image", sc.Image, dc.Image},
				{"securityContext", sc.SecurityContext, dc.SecurityContext},
				{"resources", sc.Resources, dc.Resources},
				{"volumeMounts", sc.VolumeMounts, dc.VolumeMounts},
				// POD_IP is only for the specialized proxier's health address.
				{"env", slices.DeleteFunc(slices.Clone(sc.Env), func(e v1.EnvVar) bool { return e.Name == "POD_IP" }), dc.Env},
				{"volumes", s.Volumes, d.Volumes},
				{"tolerations", s.Tolerations, d.Tolerations},
				{"nodeSelector", s.NodeSelector, d.NodeSelector},
				{"priorityClassName", s.PriorityClassName, d.PriorityClassName},
				{"hostNetwork", s.HostNetwork, d.HostNetwork},
				{"dnsPolicy", s.DNSPolicy, d.DNSPolicy},
				{"updateStrategy", spec.ds.Spec.UpdateStrategy, def.ds.Spec.UpdateStrategy},
				{"ClusterRole rules", append(slices.Clone(spec.role.Rules), serviceCIDRRule), def.role.Rules},
			} {
				if diff := cmp.Diff(f.s, f.d); diff != "" {
					t.Errorf("%s differs from %s's (-%s +%s):\n%s", f.what, pair[0], pair[0], pair[1], diff)
				}
			}
			// The command: the same but for --service-proxy-name and the
			// ports of the bind addresses.
			strip := func(c *v1.Container) []string {
				var out []string
				for _, a := range c.Command {
					if strings.HasPrefix(a, "--service-proxy-name=") {
						continue
					}
					if k, v, ok := strings.Cut(a, "="); ok && strings.HasSuffix(k, "-bind-address") {
						h, _, _ := net.SplitHostPort(v)
						a = k + "=" + h
						if k == "--healthz-bind-address" {
							a = k // every address, or the node's: TestDaemonSetsAreConsistent
						}
					}
					out = append(out, a)
				}
				return out
			}
			if diff := cmp.Diff(strip(sc), strip(dc)); diff != "" {
				t.Errorf("command differs from %s's beyond the name and ports (-%s +%s):\n%s", pair[0], pair[0], pair[1], diff)
			}
		})
	}
}

// TestDefaultUserspaceFollowsDefaultNFT: kpng-default-userspace.yaml,
// which has no specialized twin, is kpng-default-nft.yaml but for its
// names, its backend, the capabilities it adds and its memory (measured
// for it): what is set for confinement, ports, probes, the API server's
// address and scheduling in one is set in the other.
func TestDefaultUserspaceFollowsDefaultNFT(t *testing.T) {
	nft, us := decode(t, "kpng-default-nft.yaml"), decode(t, "kpng-default-userspace.yaml")
	n, u := nft.ds.Spec.Template.Spec, us.ds.Spec.Template.Spec
	nc, uc := nft.container(t), us.container(t)
	// What may differ, taken out of copies.
	nsc, usc := nc.SecurityContext.DeepCopy(), uc.SecurityContext.DeepCopy()
	nsc.Capabilities.Add, usc.Capabilities.Add = nil, nil
	for _, f := range []struct {
		what string
		n, u any
	}{
		{"image", nc.Image, uc.Image},
		{"securityContext but the added capabilities", nsc, usc},
		{"env", nc.Env, uc.Env},
		{"envFrom", nc.EnvFrom, uc.EnvFrom},
		{"ports", nc.Ports, uc.Ports},
		{"livenessProbe", nc.LivenessProbe, uc.LivenessProbe},
		{"readinessProbe", nc.ReadinessProbe, uc.ReadinessProbe},
		{"volumeMounts", nc.VolumeMounts, uc.VolumeMounts},
		{"volumes", n.Volumes, u.Volumes},
		{"tolerations", n.Tolerations, u.Tolerations},
		{"nodeSelector", n.NodeSelector, u.NodeSelector},
		{"priorityClassName", n.PriorityClassName, u.PriorityClassName},
		{"hostNetwork", n.HostNetwork, u.HostNetwork},
		{"dnsPolicy", n.DNSPolicy, u.DNSPolicy},
		{"updateStrategy", nft.ds.Spec.UpdateStrategy, us.ds.Spec.UpdateStrategy},
		{"ClusterRole rules", nft.role.Rules, us.role.Rules},
		{"cpu request", nc.Resources.Requests.Cpu().String(), uc.Resources.Requests.Cpu().String()},
	} {
		if diff := cmp.Diff(f.n, f.u); diff != "" {
			t.Errorf("%s differs from kpng-default-nft.yaml's (-nft +userspace):\n%s", f.what, diff)
		}
	}
	// The command: the same but for the backend.
	cmd := slices.Clone(nc.Command)
	if i := slices.Index(cmd, "to-nft"); i >= 0 {
		cmd[i] = "to-userspace"
	}
	if diff := cmp.Diff(cmd, uc.Command); diff != "" {
		t.Errorf("command differs from kpng-default-nft.yaml's beyond the backend (-nft +userspace):\n%s", diff)
	}
}

// TestGoMemLimit checks that goMemLimit reads GOMEMLIMIT as the Go runtime
// does: a Kubernetes quantity such as 800Mi makes the process fail.
func TestGoMemLimit(t *testing.T) {
	for v, want := range map[string]int64{"800MiB": 800 << 20, "838860800B": 800 << 20, "838860800": 800 << 20, "1GiB": 1 << 30, "64KiB": 64 << 10} {
		if got, err := goMemLimit(v); err != nil || got != want {
			t.Errorf("goMemLimit(%q) = %d, %v; want %d", v, got, err, want)
		}
	}
	for _, v := range []string{"800Mi", "800M", "1G", "off", "", "MiB", "-1MiB", "8 MiB"} {
		if got, err := goMemLimit(v); err == nil {
			t.Errorf("goMemLimit(%q) = %d, want an error", v, got)
		}
	}
}
