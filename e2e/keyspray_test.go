package e2e

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// serveKey runs one request carrying x-api-key: key straight through the
// local host's proxy (no TCP) and returns its status.
func serveKey(h *wasmhost.Host, key string) int {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "192.0.2.10:4242"
	req.Header.Set("x-api-key", key)
	rec := httptest.NewRecorder()
	proxy.New(h, proxy.Options{}).ServeHTTP(rec, req)
	return rec.Code
}

// TestKeySprayNewcomers (issue 22, item 3), through the built module: a
// slow rule (0.02/s, burst 2) keyed by header:x-api-key at the default
// 65,536 slots, while never-seen keys are sprayed at 10,000 a second of
// fake time (the clock advances 100 µs a request), one request each, for
// 4 s: by then most slots hold a live bucket (a spent token takes 50 s to
// come back). Once a second a never-seen key asks three times: it must get
// its burst, 2 of 3, every time. It used to share a drained bucket and get
// 429 on its first request. The store never holds more than the bound.
func TestKeySprayNewcomers(t *testing.T) {
	const (
		rate    = 10000 // sprayed keys a second, of fake time
		seconds = 4
	)
	cfg := `{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":0.02,"burst":2}}]}`
	clk := wasmhost.NewFakeClock(t0)
	ms := wasmhost.NewSharedData(false)
	h, _ := startHost(t, hostOpts(cfg, false, 1, clk, ms))
	short := 0
	for i := 1; i <= rate*seconds; i++ {
		if code := serveKey(h, "spray-"+strconv.Itoa(i)); code != http.StatusOK {
			t.Fatalf("sprayed key %d: got %d, want 200 (a new key starts full)", i, code)
		}
		clk.Advance(time.Second / rate)
		if i%rate != 0 {
			continue
		}
		got := 0
		for range 3 {
			if serveKey(h, "newcomer-"+strconv.Itoa(i/rate)) == http.StatusOK {
				got++
			}
		}
		if got != 2 {
			short++
			t.Errorf("t=%ds: a never-seen key got %d of 3 through, want its burst of 2", i/rate, got)
		}
	}
	if n := ms.Len(); n > 65536+1 { // the slots and the seed
		t.Errorf("shared data holds %d keys, want at most 65,537", n)
	}
	if got := metric(t, h, "per-key", "slot_collisions"); got == 0 {
		t.Error("slot_collisions: 0, want the spray's evictions counted")
	}
}
