//go:build linux

package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"sigs.k8s.io/kpng/backends/nft"
	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/internal/promtest"
	"sigs.k8s.io/kpng/model"
)

// TestKubeToLocalNFTProblems: two Services of the real API server claim
// the same external IP and port; the nftables backend programs the first
// in key order and refuses the other. The refusal is logged once at error
// level naming the service and the field (not again when the loser
// changes), counted by reason in the metrics (scraped with Prometheus'
// text parser), and listed on the debug endpoint beside what the backend
// holds; it is gone when the winner goes.
func TestKubeToLocalNFTProblems(t *testing.T) {
	cp.Require(t)
	netns.RequirePrivileged(t)
	node := netns.New(t, "problems")
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("problems")
	withIP := func(s *v1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.80"} }
	kc.CreateService(kubetest.Service(ns, "a", name, withIP))
	b := kc.CreateService(kubetest.Service(ns, "b", name, withIP))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	kpng := e2e.Start(t, e2e.Build(t, "cmd/kpng"), "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name="+name,
		"--node-name=node-a", "--metrics-bind-address="+addr, "--debug-bind-address="+addr, "to-local", "to-nft", "--check-period=0", "--monitor=false", "--netns="+node.Path())

	scrape := func() map[string]float64 {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		families, err := promtest.Parse(resp.Body)
		if err != nil {
			t.Fatalf("scrape: %v", err)
		}
		out := map[string]float64{}
		for fname, f := range families {
			for _, m := range f.GetMetric() {
				key := fname
				for _, l := range m.GetLabel() {
					if l.GetName() == "reason" {
						key += "/" + l.GetValue()
					}
				}
				out[key] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return out
	}
	waitMetric := func(what, metric string, want float64) {
		t.Helper()
		var m map[string]float64
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if m = scrape(); m != nil && m[metric] == want && m["kpng_services"] == 2 {
				return
			}
		}
		t.Fatalf("%s: %s = %v, want %v (services held %v)", what, metric, m[metric], want, m["kpng_services"])
	}
	waitMetric("the conflict", "kpng_service_problems/AddressConflict", 1)

	// kube-proxy's /proxyMode, on the metrics address: the mechanism.
	resp, err := http.Get("http://" + addr + "/proxyMode")
	if err != nil {
		t.Fatal(err)
	}
	mode, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || string(mode) != "nftables" {
		t.Errorf("/proxyMode: %s %q (%v), want 200 \"nftables\"", resp.Status, mode, err)
	}

	resp, err = http.Get("http://" + addr + metrics.DebugPath)
	if err != nil {
		t.Fatal(err)
	}
	var d metrics.Debug
	err = json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	bKey := model.ServiceKey{Namespace: ns, Name: "b"}
	if len(d.Services) != 2 || len(d.Problems) != 1 || d.Problems[0].Service != bKey || d.Problems[0].Field != "spec.externalIPs" ||
		d.Problems[0].Reason != model.ReasonAddressConflict || !strings.Contains(d.Problems[0].Message, "192.0.2.80") {
		t.Errorf("debug endpoint: %d services, problems %+v; want 2, and b's external IP refused", len(d.Services), d.Problems)
	}

	// b changes, still in conflict: nothing new is logged or counted.
	b.Labels["changed"] = "yes"
	kc.UpdateService(b)
	waitMetric("b changed", "kpng_sync_proxy_rules_service_changes_total", 3)
	if m := scrape(); m["kpng_service_problems_total/AddressConflict"] != 1 {
		t.Errorf("problems counted: %v, want the conflict once", m["kpng_service_problems_total/AddressConflict"])
	}
	lines := 0
	for _, l := range strings.Split(kpng.Output.String(), "\n") {
		if strings.HasPrefix(l, "E") && strings.Contains(l, "Part of a service cannot be programmed") {
			lines++
			if !strings.Contains(l, `service="`+ns+`/b"`) || !strings.Contains(l, `field="spec.externalIPs"`) || !strings.Contains(l, `reason="AddressConflict"`) {
				t.Errorf("the error line does not name the service, field and reason: %s", l)
			}
		}
	}
	if lines != 1 {
		t.Errorf("%d error lines for the conflict, want 1:\n%s", lines, kpng.Output.String())
	}

	if m := scrape(); m["kpng_sync_proxy_rules_nftables_sync_failures_total"] != 0 {
		t.Errorf("nftables sync failures before any: %v", m["kpng_sync_proxy_rules_nftables_sync_failures_total"])
	}
	// Someone deletes the table of IPv4, b's family (the check and the monitor
	// are off): the next round's transaction fails, is counted, and the retry
	// writes the tables whole.
	table := nft.TableName(name)
	node.MustExec("nft", "delete", "table", "ip", table)

	// a goes: b has the address, the problem is gone.
	kc.DeleteService(ns, "a")
	var m map[string]float64
	done := func() bool {
		return m["kpng_services"] == 1 && m["kpng_service_problems/AddressConflict"] == 0 &&
			m["kpng_sync_proxy_rules_nftables_sync_failures_total"] == 1 && m["kpng_sync_proxy_rules_failures_total"] == 1 &&
			m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"] == 0
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !done(); time.Sleep(50 * time.Millisecond) {
		m = scrape()
	}
	if !done() {
		t.Errorf("after a went (and the table): %v services, %v conflicts, %v nftables sync failures, %v failed rounds, last queued %v; want 1, 0, 1, 1, 0",
			m["kpng_services"], m["kpng_service_problems/AddressConflict"], m["kpng_sync_proxy_rules_nftables_sync_failures_total"],
			m["kpng_sync_proxy_rules_failures_total"], m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"])
	}
	if out := node.MustExec("nft", "list", "table", "ip", table); !strings.Contains(out, "192.0.2.80") {
		t.Errorf("the table ip after the retry lacks b's external IP:\n%s", out)
	}
	kpng.Stop(t)
}
