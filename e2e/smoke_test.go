package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestModuleStarts is the first end-to-end check: the built module passes
// the host's import check, starts on every worker, and limits a burst.
func TestModuleStarts(t *testing.T) {
	clk := wasmhost.NewFakeClock(time.Unix(1_700_000_000, 0))
	h, srv := startHost(t, wasmhost.Options{
		Workers:      2,
		PluginConfig: []byte(`{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm":"token_bucket","algorithm_config":{"rps":1,"burst":2}}]}`),
		Walltime:     clk.Walltime,
		Nanotime:     clk.Nanotime,
	})
	want := []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests}
	for i, code := range want {
		resp, body := get(t, srv, "/", nil)
		if resp.StatusCode != code {
			t.Fatalf("step %d: got %d, want %d (body %q)", i, resp.StatusCode, code, body)
		}
	}
	if h.Workers() != 2 {
		t.Errorf("workers: got %d, want 2", h.Workers())
	}
}

func BenchmarkServeHTTP(b *testing.B) {
	_, srv := startHost(b, wasmhost.Options{
		PluginConfig: []byte(`{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm":"token_bucket","algorithm_config":{"rps":1000000,"burst":1000000}}]}`),
	})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, _ := get(b, srv, "/", nil)
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
			}
		}
	})
}
