package watcher

import (
	"strings"
	"testing"
	"time"

	networking "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// TestServiceCIDRsUnavailable: an API server that does not serve
// ServiceCIDRs, or a proxier that may not list them, still gets its
// services, without cluster facts (nothing is dropped); one that serves
// them gives them to the default proxier only.
func TestServiceCIDRsUnavailable(t *testing.T) {
	resource := schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}
	kubernetes := &networking.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
		Spec:       networking.ServiceCIDRSpec{CIDRs: []string{"10.96.0.0/16", "fd00:10:96::/108"}},
	}
	for _, tc := range []struct {
		name      string
		proxyName string
		err       error
		want      string
	}{
		{"served", "", nil, "10.96.0.0/16,fd00:10:96::/108"},
		{"not served", "", apierrors.NewNotFound(resource, ""), ""},
		{"forbidden", "", apierrors.NewForbidden(resource, "", nil), ""},
		{"specialized proxier", "mine", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewSimpleClientset(kubernetes)
			if tc.err != nil {
				client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tc.err
				})
			}
			w, err := New(Config{Client: client, ServiceProxyName: tc.proxyName})
			if err != nil {
				t.Fatal(err)
			}
			c := sinktest.NewChecker(nil)
			sinktest.RunSource(t, "watcher.Run", c, w.Run)
			c.WaitSyncs(t, 1, 10*time.Second)
			if tc.want != "" {
				deadline := time.Now().Add(10 * time.Second)
				for cidrText(c.Cluster()) != tc.want && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
			}
			if got := cidrText(c.Cluster()); got != tc.want {
				t.Errorf("service CIDRs %q, want %q", got, tc.want)
			}
		})
	}
}

func cidrText(c *model.Cluster) string {
	if c == nil {
		return ""
	}
	var out []string
	for _, p := range c.ServiceCIDRs {
		out = append(out, p.String())
	}
	return strings.Join(out, ",")
}
