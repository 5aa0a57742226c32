package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestProxyModeHandler(t *testing.T) {
	r := New(Options{})
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		r.ProxyModeHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/proxyMode", nil))
		b, _ := io.ReadAll(rec.Result().Body)
		return rec.Code, string(b)
	}
	if code, _ := get(); code != http.StatusNotFound {
		t.Errorf("no mode set: %d, want 404", code)
	}
	r.SetProxyMode("nftables")
	if code, body := get(); code != http.StatusOK || body != "nftables" {
		t.Errorf("mode nftables: %d %q, want 200 \"nftables\" (kube-proxy's plain answer)", code, body)
	}
}
