package client

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/testio"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

func TestMainUsageErrors(t *testing.T) {
	cp.Require(t)
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	bad := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(bad, []byte("this: [is not a kubeconfig"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"bad value", []string{"--once=maybe"}, `invalid boolean value "maybe" for -once`},
		{"extra argument", []string{"extra"}, `unexpected argument "extra"`},
		{"missing kubeconfig", []string{"--kubeconfig=/nonexistent/kubeconfig"}, "kubeconfig /nonexistent/kubeconfig:"},
		{"unreadable kubeconfig", []string{"--kubeconfig=" + bad}, "kubeconfig " + bad + ":"},
		{"no kubeconfig at all", nil, "no kubeconfig: pass --kubeconfig or set $KUBECONFIG"},
		{"bad proxy name", []string{"--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=not valid!"}, `invalid service-proxy-name "not valid!"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := Main(tc.args, &stderr, localsink.NewFullState(func([]*model.ServiceEndpoints) {
				t.Error("handler called")
			}))
			if code != 2 {
				t.Errorf("exit status %d, want 2", code)
			}
			out := stderr.String()
			if strings.Count(out, "\n") != 1 || !strings.Contains(out, tc.want) || strings.Contains(out, "goroutine") {
				t.Errorf("stderr = %q, want one line containing %q", out, tc.want)
			}
		})
	}
}

func TestMainOnceDeliversFirstState(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("once")
	svc := kc.CreateService(kubetest.Service(ns, "a", name))
	kc.CreateSlice(kubetest.Slice(svc, "a-1", kubetest.EP{IP: "10.8.0.1", Node: "me"}, kubetest.EP{IP: "10.8.0.2", Node: "other"}))

	var calls [][]*model.ServiceEndpoints
	var stderr bytes.Buffer
	t.Setenv("NODE_NAME", "me")
	code := Main([]string{"--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + name, "--once"}, &stderr,
		localsink.NewFullState(func(items []*model.ServiceEndpoints) { calls = append(calls, items) }))
	if code != 0 {
		t.Fatalf("exit status %d, stderr %s", code, stderr.String())
	}
	if len(calls) != 1 || len(calls[0]) != 1 {
		t.Fatalf("handler calls = %v, want one call with one service", calls)
	}
	eps := calls[0][0].Endpoints
	if len(eps) != 2 || !eps[0].Local || eps[1].Local {
		t.Errorf("endpoints %+v %+v: want 10.8.0.1 local (NODE_NAME=me), 10.8.0.2 not", eps[0], eps[1])
	}
}

func TestUnreachableAPIServerRetries(t *testing.T) {
	// A kubeconfig pointing at a loopback port nobody listens on.
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n" +
		"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: x}\n"
	if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs testio.SyncBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer func() { klog.SetOutput(os.Stderr); klog.LogToStderr(true) }()

	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	f := Flags{Kubeconfig: kc, ServiceProxyName: "x", NodeName: "n"}
	start := time.Now()
	err := f.Run(ctx, localsink.NewFullState(func([]*model.ServiceEndpoints) { t.Error("handler called") }))
	if err != nil {
		t.Errorf("Run: %v, want nil once the context ends", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Run took %v to return after its context ended", took)
	}
	klog.Flush()
	if n := strings.Count(logs.String(), "Cannot list services from the Kubernetes API server, retrying"); n < 2 {
		t.Errorf("logged %d retry messages in 2.5s, want at least 2 (backoff from 500ms):\n%s", n, logs.String())
	}
}
