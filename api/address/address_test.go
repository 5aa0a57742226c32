package address

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in       string
		want     Address
		loopback bool
		err      bool
	}{
		{in: "unix:///run/kpng.sock", want: Address{"unix", "/run/kpng.sock"}, loopback: true},
		{in: "unix:kpng.sock", want: Address{"unix", "kpng.sock"}, loopback: true},
		{in: "tcp://127.0.0.1:9000", want: Address{"tcp", "127.0.0.1:9000"}, loopback: true},
		{in: "[::1]:9000", want: Address{"tcp", "[::1]:9000"}, loopback: true},
		{in: "localhost:9000", want: Address{"tcp", "localhost:9000"}, loopback: true},
		{in: "10.1.2.3:9000", want: Address{"tcp", "10.1.2.3:9000"}},
		{in: ":9000", want: Address{"tcp", ":9000"}},
		{in: "0.0.0.0:9000", want: Address{"tcp", "0.0.0.0:9000"}},
		{in: "", err: true},
		{in: "unix://", err: true},
		{in: "http://x:1", err: true},
		{in: "nohost", err: true},
		{in: "host:", err: true},
	} {
		got, err := Parse(tc.in)
		if (err != nil) != tc.err {
			t.Errorf("Parse(%q) error = %v, want error %v", tc.in, err, tc.err)
			continue
		}
		if tc.err {
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Parse(%q) (-want +got):\n%s", tc.in, diff)
		}
		if got.IsLoopback() != tc.loopback {
			t.Errorf("Parse(%q).IsLoopback() = %v, want %v", tc.in, got.IsLoopback(), tc.loopback)
		}
		if again, err := Parse(got.String()); err != nil || again != got {
			t.Errorf("Parse(%q.String()) = %v, %v; want %v", tc.in, again, err, got)
		}
	}
}
