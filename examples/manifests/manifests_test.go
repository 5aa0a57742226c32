// Package manifests_test checks the example manifests against a real API
// server: they are valid, and the proxier's RBAC is enough to run kpng and
// no more.
package manifests_test

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/manifests"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

func TestManifestsAndLeastPrivilegeRBAC(t *testing.T) {
	cp.Require(t)
	ctx := context.Background()
	for _, f := range []string{"kpng-example.yaml", "kpng-example-app.yaml", "kpng-example-endpointslices.yaml", "kpng-example-proxy.yaml"} {
		if err := manifests.ApplyFile(ctx, cp.Client(), f); err != nil {
			t.Fatalf("apply %s: %v", f, err)
		}
	}

	// Act as the proxier's service account.
	cfg := cp.RESTConfig()
	cfg.Impersonate.UserName = "system:serviceaccount:kube-system:kpng-example"
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// Its permissions are enough to run the watcher (and the node zone
	// watcher a controller runs for its backends)...
	w, err := watcher.New(watcher.Config{Client: sa, ServiceProxyName: "kpng-example", NodeName: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []*model.ServiceEndpoints, 1)
	runCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- w.Run(runCtx, localsink.NewFullState(func(items []*model.ServiceEndpoints) {
			select {
			case got <- items:
			default:
			}
		}))
	}()
	select {
	case items := <-got:
		if len(items) != 1 || len(items[0].Endpoints) != 4 {
			t.Errorf("as the service account, the watcher got %d services, want kpng-example with 4 endpoints", len(items))
		}
	case <-runCtx.Done():
		t.Fatal("as the service account, the watcher delivered nothing within 30s")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("watcher: %v", err)
	}
	if _, err := sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("list nodes as the service account: %v", err)
	}

	// ...and nothing more.
	for what, call := range map[string]func() error{
		"get a service": func() error {
			_, err := sa.CoreV1().Services("default").Get(ctx, "kpng-example", metav1.GetOptions{})
			return err
		},
		"list secrets": func() error {
			_, err := sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
			return err
		},
		"list pods": func() error {
			_, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		},
		"delete a service": func() error {
			return sa.CoreV1().Services("default").Delete(ctx, "kpng-example", metav1.DeleteOptions{})
		},
		"update an endpointslice": func() error {
			s, err := cp.Client().DiscoveryV1().EndpointSlices("default").Get(ctx, "kpng-example-ipv4", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			_, err = sa.DiscoveryV1().EndpointSlices("default").Update(ctx, s, metav1.UpdateOptions{})
			return err
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("as the service account, %s: %v, want forbidden", what, err)
		} else if !strings.Contains(err.Error(), "kpng-example") {
			t.Errorf("forbidden error does not name the service account: %v", err)
		}
	}
}
