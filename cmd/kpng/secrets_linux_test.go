//go:build linux

package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
)

// TestNoSecretInLogs runs `kpng kube -v=10 … to-api` (client-go logs its
// requests, headers included, at that level) and serves a backend a
// change: the admin's bearer token must not appear in the output.
func TestNoSecretInLogs(t *testing.T) {
	cp.Require(t)
	cfg, err := clientcmd.LoadFromFile(cp.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	var token string
	for _, a := range cfg.AuthInfos {
		token = a.Token
	}
	if len(token) < 16 {
		t.Fatalf("no bearer token in the kubeconfig")
	}
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("secret")
	svc := kc.CreateService(kubetest.Service(ns, "web", name))
	kc.CreateSlice(kubetest.Slice(svc, "web-1", kubetest.EP{IP: "10.71.0.1"}))

	bin := e2e.Build(t, "cmd/kpng")
	sock := "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
	p := e2e.Start(t, bin, "-v=10", "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name="+name, "to-api", "--listen="+sock)
	c := sinktest.NewChecker(nil)
	sinktest.RunSource(t, "remote.Run", c, func(ctx context.Context, sink localsink.Sink) error {
		return remote.Run(ctx, remote.Config{Address: sock, NodeName: "n", MinBackoff: 100 * time.Millisecond}, sink)
	})
	c.WaitSyncs(t, 1, time.Minute)
	kc.CreateSlice(kubetest.Slice(svc, "web-2", kubetest.EP{IP: "10.71.0.2"}))
	c.WaitSyncs(t, 2, time.Minute)
	p.Stop(t)
	out := p.Output.String()
	if !strings.Contains(out, "Authorization") {
		t.Errorf("kpng -v=10 logged no request headers: the check below proves nothing")
	}
	if strings.Contains(out, token) {
		t.Errorf("kpng's log holds the bearer token")
	}
}
