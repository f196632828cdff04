package e2e

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

const perIPConfig = `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm":"token_bucket",` +
	`"algorithm_config":{"rps":5,"burst":10}}]}`

// TestBurstThen429 walks a step table over real HTTP: a client IP's burst
// of 10 at rps 5, the 429 with every header, refills on the fake clock
// exactly as the bucket math says, and a second client IP (a connection from
// 127.0.0.2, seen by the filter through source.address) with its own bucket.
// Under Envoy's and Kong's shared-data semantics.
//
// Offsets are binary fractions of a second: a decimal such as +0.6 s is not
// exact in float64 seconds since the epoch, and the filter floors the time to
// the microsecond, so it would see 2.999995 tokens where the math says 3.
func TestBurstThen429(t *testing.T) {
	type step struct {
		at        time.Duration // offset of the fake clock from t0
		ip        string        // client address
		status    int
		remaining int // RateLimit-Remaining
		reset     int // RateLimit-Reset
		retry     int // Retry-After, for a 429
	}
	const a, b = "127.0.0.1", "127.0.0.2"
	var steps []step
	for k := 1; k <= 10; k++ { // the burst: 10 tokens, 0.2 s each to refill
		steps = append(steps, step{at: 0, ip: a, status: 200, remaining: 10 - k, reset: int(math.Ceil(float64(k) / 5))})
	}
	// A 429's reset (RateLimit t, RateLimit-Reset) is when this request
	// could pass: 1 token at 5 a second, within a second.
	steps = append(steps,
		step{at: 0, ip: a, status: 429, remaining: 0, reset: 1, retry: 1},
		step{at: 0, ip: b, status: 200, remaining: 9, reset: 1}, // its own bucket
		// +0.4 s: 5 × 0.4 = 2 tokens.
		step{at: 400 * time.Millisecond, ip: a, status: 200, remaining: 1, reset: 2},
		step{at: 400 * time.Millisecond, ip: a, status: 200, remaining: 0, reset: 2},
		step{at: 400 * time.Millisecond, ip: a, status: 429, remaining: 0, reset: 1, retry: 1},
		// +0.5 s: half a token.
		step{at: 500 * time.Millisecond, ip: a, status: 429, remaining: 0, reset: 1, retry: 1},
		// +0.75 s: 0.5 + 1.25 = 1.75 tokens: one request, 0.75 left.
		step{at: 750 * time.Millisecond, ip: a, status: 200, remaining: 0, reset: 2},
		step{at: 750 * time.Millisecond, ip: a, status: 429, remaining: 0, reset: 1, retry: 1},
		step{at: 750 * time.Millisecond, ip: b, status: 200, remaining: 9, reset: 1}, // refilled to 10 (capped)
		// Ten seconds later the bucket is full again, not fuller.
		step{at: 10750 * time.Millisecond, ip: a, status: 200, remaining: 9, reset: 1},
	)
	for _, sem := range semantics {
		t.Run(sem.name, func(t *testing.T) {
			clk := wasmhost.NewFakeClock(t0)
			ms := wasmhost.NewSharedData(sem.kong)
			h, srv := startHost(t, hostOpts(perIPConfig, sem.kong, 4, clk, ms))
			clients := map[string]*http.Client{a: clientFrom(a, 1), b: clientFrom(b, 1)}
			allowed, rejected := 0, 0
			for i, s := range steps {
				clk.Set(t0.Add(s.at))
				r := mustDo(t, clients[s.ip], srv, "/hello", nil)
				if r.status != s.status {
					t.Fatalf("step %d (%s at +%v): got status %d, want %d (body %q)", i, s.ip, s.at, r.status, s.status, r.body)
				}
				want := map[string]string{
					"RateLimit-Limit":     "10",
					"RateLimit-Remaining": strconv.Itoa(s.remaining),
					"RateLimit-Reset":     strconv.Itoa(s.reset),
					"RateLimit":           `"per-ip";r=` + strconv.Itoa(s.remaining) + ";t=" + strconv.Itoa(s.reset),
					"RateLimit-Policy":    `"per-ip";q=10;w=2`,
					"Content-Type":        "application/json",
				}
				if s.status == 429 {
					rejected++
					want["Retry-After"] = strconv.Itoa(s.retry)
					want["X-Tokengate-Reason"] = "token_bucket_exceeded"
					want["X-Tokengate-Rule"] = "per-ip"
					wantBody := `{"error":"rate_limited","reason":"token_bucket_exceeded","rule":"per-ip","retry_after":` +
						strconv.Itoa(s.retry) + "}\n"
					if r.body != wantBody {
						t.Errorf("step %d: got body %q, want %q", i, r.body, wantBody)
					}
				} else {
					allowed++
					for _, k := range []string{"Retry-After", "X-Tokengate-Reason", "X-Tokengate-Rule"} {
						if v := r.header.Values(k); len(v) > 0 {
							t.Errorf("step %d: got %s %q on a 200", i, k, v)
						}
					}
					var echo proxy.Echo
					if err := json.Unmarshal([]byte(r.body), &echo); err != nil || echo.Path != "/hello" {
						t.Errorf("step %d: the upstream's echo: got %q (%v), want path /hello", i, r.body, err)
					}
				}
				for k, v := range want {
					if got := r.header.Values(k); len(got) != 1 || got[0] != v {
						t.Errorf("step %d: got %s %q, want [%q]", i, k, got, v)
					}
				}
			}
			if got := metric(t, h, "per-ip", "allowed"); got != uint64(allowed) {
				t.Errorf("allowed counter: got %d, want %d", got, allowed)
			}
			if got := metric(t, h, "per-ip", "rejected"); got != uint64(rejected) {
				t.Errorf("rejected counter: got %d, want %d", got, rejected)
			}
			for _, c := range []string{"fail_open", "store_denied", "descriptor_missing"} {
				if got := metric(t, h, "per-ip", c); got != 0 {
					t.Errorf("%s counter: got %d, want 0", c, got)
				}
			}
			// The stored buckets: a took one token at +10.75 s from a full
			// bucket; b took its second at +0.75 s from a bucket refilled to
			// 10 (9 + 3.75, capped).
			for _, w := range []struct {
				ip           string
				tokens, last float64
			}{
				{a, 9, seconds(t0.Add(10750 * time.Millisecond))},
				{b, 9, seconds(t0.Add(750 * time.Millisecond))},
			} {
				got, ok := findBucket(t, ms, "per-ip", w.ip)
				if !ok {
					t.Fatalf("no bucket for %s in %v", w.ip, ms.Snapshot(""))
				}
				if got.tokens != w.tokens || got.last != w.last {
					t.Errorf("%s (%s): got tokens %v last %.6f, want %v, %.6f", w.ip, got.key, got.tokens, got.last, w.tokens, w.last)
				}
			}
			if n := len(bucketKeys(ms, "per-ip")); n != 2 {
				t.Errorf("got %d per-ip buckets, want 2: %v", n, bucketKeys(ms, "per-ip"))
			}
		})
	}
}

// TestIPv6Client: a client connecting over IPv6 loopback ([::1]) is
// limited by its address, which the filter reads from source.address
// ("[::1]:port" on Envoy, "::1" on Kong) and, cut to its /64 (the default
// settings.ipv6_prefix, issue 22), stores as the slot's owner "::/64",
// colons and all.
func TestIPv6Client(t *testing.T) {
	for _, sem := range semantics {
		t.Run(sem.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "[::1]:0")
			if err != nil {
				t.Skipf("no IPv6 loopback: %v", err)
			}
			clk := wasmhost.NewFakeClock(t0)
			ms := wasmhost.NewSharedData(sem.kong)
			opts := hostOpts(perIPConfig, sem.kong, 2, clk, ms)
			opts.Wasm, opts.LogSink = loadModule(t), func(wasmhost.LogLevel, string) {}
			h, err := wasmhost.New(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer closeHost(t, h)
			srv := httptest.NewUnstartedServer(proxy.New(h, proxy.Options{}))
			srv.Listener.Close()
			srv.Listener = ln
			srv.Start()
			defer srv.Close()
			var got []int
			for range 11 {
				got = append(got, mustDo(t, srv.Client(), srv, "/", nil).status)
			}
			want := []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("statuses: got %v, want %v", got, want)
			}
			b, ok := findBucket(t, ms, "per-ip", "::/64")
			if !ok || b.tokens != 0 || b.last != seconds(t0) {
				t.Errorf("bucket of ::/64: got %+v (found %v) in %v, want 0 tokens at t0", b, ok, ms.Snapshot(""))
			}
		})
	}
}
