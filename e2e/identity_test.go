package e2e

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestForwardedForLines sends x-forwarded-for as separate header lines, as a
// client line plus a line a trusted proxy adds, through the real module. The
// filter must read them as one list (RFC 9110): with one trusted hop the
// client is the proxy's entry, so varying the client's own line does not
// give it a fresh bucket. On Kong's host the lines reach the module as
// separate pairs; Envoy's connection manager merges them first; both
// must give the same answer. Entries with ports name their address.
func TestForwardedForLines(t *testing.T) {
	const cfg = `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}}],` +
		`"settings":{"xff_trusted_hops":1}}`
	for _, sem := range semantics {
		t.Run(sem.name, func(t *testing.T) {
			_, srv := startHost(t, hostOpts(cfg, sem.kong, 2, wasmhost.NewFakeClock(t0), nil))
			send := func(lines ...string) *http.Response {
				t.Helper()
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
				for _, l := range lines {
					req.Header.Add("X-Forwarded-For", l)
				}
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp
			}
			remaining := func(r *http.Response) int {
				n, err := strconv.Atoi(r.Header.Get("RateLimit-Remaining"))
				if err != nil {
					t.Fatalf("status %d, RateLimit-Remaining %q", r.StatusCode, r.Header.Get("RateLimit-Remaining"))
				}
				return n
			}
			// The spoofed first line changes every time; the proxy's line
			// (with a port) stays: one bucket.
			for i, want := range []int{2, 1, 0} {
				r := send("6.6.6."+strconv.Itoa(i), "203.0.113.9:4711")
				if r.StatusCode != 200 || remaining(r) != want {
					t.Fatalf("request %d: status %d, remaining %d, want 200 and %d", i, r.StatusCode, remaining(r), want)
				}
			}
			if r := send("6.6.6.99", "203.0.113.9"); r.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("4th request from 203.0.113.9 got %d, want 429", r.StatusCode)
			}
			// IPv6 in brackets with a port, in one line: its own bucket.
			if r := send("6.6.6.6, [2001:db8::1]:443"); r.StatusCode != 200 || remaining(r) != 2 {
				t.Fatalf("[2001:db8::1]:443: status %d, want 200 with 2 left", r.StatusCode)
			}
			if r := send("[2001:DB8::1]"); r.StatusCode != 200 || remaining(r) != 1 {
				t.Fatalf("[2001:DB8::1]: status %d, want 200 with 1 left (same bucket)", r.StatusCode)
			}
		})
	}
}

// TestIPv6HostIsItsNetwork (issue 22, item 4), through the built module:
// one host with 40 addresses of its /64, 10 requests from each, against a
// per-IP rule of burst 10 at a standstill clock. Keyed by address it got
// 400 of 400 through; keyed by its /64 (the default ipv6_prefix) it gets
// the burst, 10. Another /64 keeps its own bucket, and ipv6_prefix: 128
// restores one bucket per address.
func TestIPv6HostIsItsNetwork(t *testing.T) {
	for _, tc := range []struct {
		name     string
		settings string
		want     int
	}{
		{"default /64", ``, 10},
		{"ipv6_prefix 128", `,"settings":{"ipv6_prefix":128}`, 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":0.1,"burst":10}}]` + tc.settings + `}`
			h, _ := startHost(t, hostOpts(cfg, false, 2, wasmhost.NewFakeClock(t0), nil))
			admitted := 0
			for a := range 40 {
				for range 10 {
					if serve(h, "[2001:db8:7:1:"+strconv.FormatInt(int64(a+1)*0x3f1, 16)+"::"+strconv.Itoa(a+1)+"]:4242").Code == http.StatusOK {
						admitted++
					}
				}
			}
			if admitted != tc.want {
				t.Errorf("40 addresses of 2001:db8:7:1::/64: %d of 400 admitted, want %d", admitted, tc.want)
			}
			if rec := serve(h, "[2001:db8:7:2::1]:4242"); rec.Code != http.StatusOK {
				t.Errorf("a client of another /64: got %d, want 200", rec.Code)
			}
		})
	}
}
