package controlplane_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"sigs.k8s.io/kpng/internal/controlplane"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, &cp)
}

const namespace = "controlplane-test"

func TestObjectsSurviveAPIServerRestart(t *testing.T) {
	cp.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	client := cp.Client()

	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: namespace},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}

	requireDualStack := corev1.IPFamilyPolicyRequireDualStack
	dual, err := client.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "dual"},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: &requireDualStack,
			Selector:       map[string]string{"app": "dual"},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating dual-stack service: %v", err)
	}
	if len(dual.Spec.ClusterIPs) != 2 || !slices.Equal(dual.Spec.IPFamilies, []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}) {
		t.Fatalf("dual-stack service got clusterIPs %v, families %v; want one IPv4 and one IPv6", dual.Spec.ClusterIPs, dual.Spec.IPFamilies)
	}
	t.Logf("dual-stack service clusterIPs: %v", dual.Spec.ClusterIPs)

	headless, err := client.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "headless"},
		Spec: corev1.ServiceSpec{
			ClusterIP:      corev1.ClusterIPNone,
			IPFamilyPolicy: &requireDualStack,
			ExternalIPs:    []string{"10.0.0.55", "1000::55"},
			Selector:       map[string]string{"app": "headless"},
			Ports: []corev1.ServicePort{{
				Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating headless service: %v", err)
	}
	if !slices.Equal(headless.Spec.ClusterIPs, []string{corev1.ClusterIPNone}) {
		t.Fatalf("headless service got clusterIPs %v, want [None]", headless.Spec.ClusterIPs)
	}

	ready := true
	port := int32(8080)
	protocol := corev1.ProtocolTCP
	portName := "http"
	if _, err := client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "dual-ipv6",
			Labels: map[string]string{discoveryv1.LabelServiceName: "dual"},
		},
		AddressType: discoveryv1.AddressTypeIPv6,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"fd00:10:244::5"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Protocol: &protocol, Port: &port}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating endpoint slice: %v", err)
	}

	checkObjects(ctx, t, client, dual)

	// The kubeconfig must work for clientcmd, too.
	kubeconfig, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath())
	if err != nil {
		t.Fatalf("loading kubeconfig: %v", err)
	}
	kcClient, err := kubernetes.NewForConfig(kubeconfig)
	if err != nil {
		t.Fatalf("creating client from kubeconfig: %v", err)
	}
	if _, err := kcClient.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err != nil {
		t.Fatalf("getting namespace with the kubeconfig client: %v", err)
	}

	for _, restart := range []struct {
		name string
		stop func() error
	}{
		{"StopAPIServer", cp.StopAPIServer},
		{"KillAPIServer", cp.KillAPIServer},
	} {
		pid := cp.APIServerPID()
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err != nil || !strings.Contains(string(cmdline), "kube-apiserver") {
			t.Fatalf("before %s: APIServerPID %d is not kube-apiserver's (%q, %v)", restart.name, pid, cmdline, err)
		}
		begin := time.Now()
		if err := restart.stop(); err != nil {
			t.Fatalf("%s: %v", restart.name, err)
		}
		stopped := time.Since(begin)
		if got := cp.APIServerPID(); got != 0 {
			t.Errorf("after %s: APIServerPID %d, want 0", restart.name, got)
		}
		if _, err := client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err == nil {
			t.Fatalf("after %s the API server still answers", restart.name)
		}
		startBegin := time.Now()
		if err := cp.StartAPIServer(); err != nil {
			t.Fatalf("StartAPIServer after %s: %v", restart.name, err)
		}
		t.Logf("%s took %v, StartAPIServer took %v", restart.name, stopped.Round(time.Millisecond), time.Since(startBegin).Round(time.Millisecond))
		checkObjects(ctx, t, client, dual)
	}

	// The client still writes after the restarts.
	if _, err := client.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "after-restart"},
		Spec: corev1.ServiceSpec{
			Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 53}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating a service after the restarts: %v", err)
	}
}

// checkObjects reads back the objects created by the test.
func checkObjects(ctx context.Context, t *testing.T, client kubernetes.Interface, dual *corev1.Service) {
	t.Helper()
	if _, err := client.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err != nil {
		t.Fatalf("getting namespace: %v", err)
	}
	got, err := client.CoreV1().Services(namespace).Get(ctx, "dual", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting dual-stack service: %v", err)
	}
	if !slices.Equal(got.Spec.ClusterIPs, dual.Spec.ClusterIPs) {
		t.Fatalf("dual-stack service clusterIPs are %v, want %v", got.Spec.ClusterIPs, dual.Spec.ClusterIPs)
	}
	headless, err := client.CoreV1().Services(namespace).Get(ctx, "headless", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("getting headless service: %v", err)
	}
	if !slices.Equal(headless.Spec.ExternalIPs, []string{"10.0.0.55", "1000::55"}) {
		t.Fatalf("headless service externalIPs are %v", headless.Spec.ExternalIPs)
	}
	slices, err := client.DiscoveryV1().EndpointSlices(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=dual",
	})
	if err != nil {
		t.Fatalf("listing endpoint slices: %v", err)
	}
	if len(slices.Items) != 1 || len(slices.Items[0].Endpoints) != 1 || slices.Items[0].Endpoints[0].Addresses[0] != "fd00:10:244::5" {
		t.Fatalf("unexpected endpoint slices: %+v", slices.Items)
	}
}

func TestRESTConfigVerifiesTLS(t *testing.T) {
	cp.Require(t)
	config := cp.RESTConfig()
	if config.Insecure || len(config.CAData) == 0 {
		t.Errorf("RESTConfig does not verify the serving certificate (insecure=%v, %d bytes of CA)", config.Insecure, len(config.CAData))
	}
	version, err := cp.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("getting server version: %v", err)
	}
	t.Logf("server version %s", version.GitVersion)
}

func TestStartFailureIncludesLog(t *testing.T) {
	controlplane.SkipIfShort(t)
	second, err := controlplane.Start(controlplane.WithLogf(t.Logf), controlplane.WithAPIServerArgs("--no-such-flag"))
	if err == nil {
		second.Stop()
		t.Fatal("Start with a bad kube-apiserver flag succeeded")
	}
	if !strings.Contains(err.Error(), "unknown flag: --no-such-flag") {
		t.Fatalf("Start error does not include the kube-apiserver log: %v", err)
	}
	t.Logf("Start failed as expected: %.300s...", err)
}

// TestObjectsSurviveEtcdRestart kills etcd under a running kube-apiserver
// and starts it again: the objects written before are read back, and the
// API server takes writes again.
func TestObjectsSurviveEtcdRestart(t *testing.T) {
	cp.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	client := cp.Client()
	const ns = "etcd-restart"
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	if err := cp.KillEtcd(); err != nil {
		t.Fatalf("KillEtcd: %v", err)
	}
	t.Cleanup(func() { _ = cp.StartEtcd() }) // for the next tests, if this one fails early
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err := client.CoreV1().Namespaces().Create(short, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns + "-down"}}, metav1.CreateOptions{})
	cancelShort()
	if err == nil {
		t.Fatalf("a write succeeded with etcd down")
	}
	begin := time.Now()
	if err := cp.StartEtcd(); err != nil {
		t.Fatalf("StartEtcd: %v", err)
	}
	for {
		_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns + "-up"}}, metav1.CreateOptions{})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no write accepted after etcd came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("writes accepted again %v after StartEtcd began", time.Since(begin).Round(time.Millisecond))
	if _, err := client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err != nil {
		t.Fatalf("the namespace written before the restart: %v", err)
	}
}

// TestStartUnderShortFails: under -short (make unit), Start builds and
// starts nothing and says so, so that a test that forgot SkipIfShort fails
// instead of building a control plane.
func TestStartUnderShortFails(t *testing.T) {
	if !testing.Short() {
		t.Skip("checks -short's behaviour: run with -short (make unit)")
	}
	t.Setenv(controlplane.EnvBinaryDir, "")
	cp, err := controlplane.Start()
	if err == nil {
		cp.Stop()
		t.Fatal("Start under -short started a control plane")
	}
	if !strings.Contains(err.Error(), "-short") {
		t.Errorf("Start under -short: %v, want an error naming -short", err)
	}
}
