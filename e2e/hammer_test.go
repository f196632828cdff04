package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Hammer parameters: at least 4 worker VMs and 8 concurrent HTTP clients.
const (
	hammerWorkers = 4
	hammerClients = 8
	// Every advanceEvery completed requests the fake clock moves by
	// advanceStep, concurrently with the requests in flight.
	advanceEvery = 20
	advanceStep  = time.Millisecond
)

// tally counts the answers a phase got for each key.
type tally struct {
	mu       sync.Mutex
	admitted map[string]int
	rejected map[string]int
	// bad lists answers that were neither a decided 200 (with RateLimit
	// headers) nor a 429 of the rule: a fail-open 200, a 5xx, ...
	bad []string
}

func newTally() *tally {
	return &tally{admitted: map[string]int{}, rejected: map[string]int{}}
}

func (tl *tally) add(key string, r response, rule string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	switch {
	case r.status == http.StatusOK && r.header.Get("RateLimit-Remaining") != "":
		tl.admitted[key]++
	case r.status == http.StatusTooManyRequests && r.header.Get("X-Tokengate-Rule") == rule:
		tl.rejected[key]++
	default:
		if len(tl.bad) < 10 {
			tl.bad = append(tl.bad, fmt.Sprintf("key %q: %d %v %q", key, r.status, r.header, r.body))
		}
	}
}

// hammerPhase sends n requests from hammerClients goroutines, request i
// for key keyOf(i) (sent as x-api-key when apiKey is set). If clk is not
// nil, the clock advances by advanceStep after every advanceEvery completed
// requests, the last time before the final advanceEvery requests, so the
// phase ends with demand at the final instant.
func hammerPhase(t *testing.T, c *http.Client, srv *httptest.Server, rule string, n int, keyOf func(int) string,
	apiKey bool, clk *wasmhost.FakeClock, tl *tally) {
	t.Helper()
	var done atomic.Int64
	var header func(int) map[string]string
	if apiKey {
		header = func(i int) map[string]string { return map[string]string{"x-api-key": keyOf(i)} }
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, hammerClients)
	for range hammerClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				var hdr map[string]string
				if header != nil {
					hdr = header(i)
				}
				r, err := do(c, srv, "/", hdr)
				if err != nil {
					errs <- err
					return
				}
				tl.add(keyOf(i), r, rule)
				if d := done.Add(1); clk != nil && d%advanceEvery == 0 && d < int64(n-advanceEvery) {
					clk.Advance(advanceStep)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("request failed: %v", err)
	}
}

// drain sends requests for key at the current instant until one is
// rejected, so the bucket ends with less than one token, and adds them to
// tl.
func drain(t *testing.T, c *http.Client, srv *httptest.Server, rule, key string, apiKey bool, max int, tl *tally) {
	t.Helper()
	var hdr map[string]string
	if apiKey {
		hdr = map[string]string{"x-api-key": key}
	}
	for range max {
		r := mustDo(t, c, srv, "/", hdr)
		tl.add(key, r, rule)
		if r.status == http.StatusTooManyRequests {
			return
		}
	}
	t.Fatalf("key %q: no 429 after %d requests at one instant", key, max)
}

// checkBounds asserts burst + rate·elapsed − 1 <= admitted <= burst +
// rate·elapsed.
func checkBounds(t *testing.T, what string, admitted int, burst, rate float64, elapsed time.Duration) {
	t.Helper()
	hi := burst + rate*elapsed.Seconds()
	lo := hi - 1
	if float64(admitted) > hi || float64(admitted) < lo {
		t.Errorf("%s: admitted %d, want within [%.3f, %.3f] (burst %v + rate %v × %v)", what, admitted, lo, hi, burst, rate, elapsed)
	}
}

// TestHammerOneKey sends 23,000 requests from 8 concurrent HTTP clients
// through 4 worker VMs, all for one bucket (rate 1000/s, burst 1000): first
// 3,000 on a frozen clock, where exactly the burst is admitted, then 20,000
// while the fake clock advances concurrently by 1 ms every 20 requests
// (about 20 requests per token, so most are rejected), then requests at the
// final instant until a 429. The admitted count must lie within [burst +
// rate·elapsed − 1, burst + rate·elapsed]: no over-admission, no lost
// update. No request may fail open. The bucket is one client IP's in the
// bounded key space (a slot), in the unbounded one ("max_keys": 0), or the
// single bucket of a rule without limit keys (5,000 advancing requests for
// these two, to keep `make test` short); under Envoy's and Kong's semantics.
func TestHammerOneKey(t *testing.T) {
	const (
		rate, burst = 1000.0, 1000.0
		frozen      = 3000
	)
	kinds := []struct {
		name, keys string
		n          int // requests while the clock advances
		wantKey    func(k string) bool
	}{
		{name: "slot", keys: `"limit_keys":["ip:address"],`, n: 20000,
			wantKey: func(k string) bool { return len(k) > len("tb:hot:$") && k[:len("tb:hot:$")] == "tb:hot:$" }},
		{name: "unbounded", keys: `"limit_keys":["ip:address"],"max_keys":0,`, n: 5000,
			wantKey: func(k string) bool { return k == "tb:hot:127.0.0.1" }},
		{name: "global", keys: ``, n: 5000,
			wantKey: func(k string) bool { return k == "tb:hot:" }},
	}
	for _, kind := range kinds {
		kind.n = soak(kind.n)
		cfg := `{"rules":[{"name":"hot",` + kind.keys + `"algorithm":"token_bucket",` +
			`"algorithm_config":{"tokens_per_second":1000,"burst":1000}}]}`
		for _, sem := range semantics {
			t.Run(kind.name+"/"+sem.name, func(t *testing.T) {
				clk := wasmhost.NewFakeClock(t0)
				ms := wasmhost.NewSharedData(sem.kong)
				h, srv := startHost(t, hostOpts(cfg, sem.kong, hammerWorkers, clk, ms))
				c := clientFrom("127.0.0.1", hammerClients)
				key := func(int) string { return "127.0.0.1" }
				start := time.Now()

				tl := newTally()
				hammerPhase(t, c, srv, "hot", frozen, key, false, nil, tl)
				if got := tl.admitted["127.0.0.1"]; got != int(burst) {
					t.Errorf("frozen clock: admitted %d of %d, want exactly the burst, %v", got, frozen, burst)
				}

				hammerPhase(t, c, srv, "hot", kind.n, key, false, clk, tl)
				drain(t, c, srv, "hot", "127.0.0.1", false, int(burst)+1, tl)
				elapsed := clk.Now().Sub(t0)
				admitted := tl.admitted["127.0.0.1"]
				checkBounds(t, "one key", admitted, burst, rate, elapsed)
				if len(tl.bad) > 0 {
					t.Errorf("answers that were neither decided 200s nor 429s: %q", tl.bad)
				}
				total := admitted + tl.rejected["127.0.0.1"] + len(tl.bad)
				if got := metric(t, h, "hot", "allowed"); got != uint64(admitted) {
					t.Errorf("allowed counter: got %d, want %d", got, admitted)
				}
				if got := metric(t, h, "hot", "fail_open"); got != 0 {
					t.Errorf("fail_open counter: got %d, want 0", got)
				}
				if keys := bucketKeys(ms, "hot"); len(keys) != 1 || !kind.wantKey(keys[0]) {
					t.Errorf("bucket keys: got %q, want one %s key", keys, kind.name)
				}
				d := time.Since(start)
				t.Logf("%s/%s: %d requests in %v (%.0f req/s): admitted %d for bound %.1f over %v of fake time; cas_retries %d",
					kind.name, sem.name, total, d.Round(time.Millisecond), float64(total)/d.Seconds(), admitted,
					burst+rate*elapsed.Seconds(), elapsed, metric(t, h, "hot", "cas_retries"))
			})
		}
	}
}

// TestHammerManyKeys is TestHammerOneKey for 50 API keys at once
// (header:x-api-key, rate 20/s, burst 20): a frozen phase that admits
// exactly the burst for each key, then 20,000 requests round-robin over the
// keys while the clock advances, then each key drained at the final instant.
// Each key's admitted count must lie within its own bounds.
func TestHammerManyKeys(t *testing.T) {
	const (
		keys        = 50
		rate, burst = 20.0, 20.0
		n           = 20000
	)
	cfg := `{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm":"token_bucket",` +
		`"algorithm_config":{"rps":20,"burst":20}}]}`
	keyOf := func(i int) string { return fmt.Sprintf("key-%02d", i%keys) }
	for _, sem := range semantics {
		t.Run(sem.name, func(t *testing.T) {
			clk := wasmhost.NewFakeClock(t0)
			ms := wasmhost.NewSharedData(sem.kong)
			h, srv := startHost(t, hostOpts(cfg, sem.kong, hammerWorkers, clk, ms))
			c := clientFrom("127.0.0.1", hammerClients)
			start := time.Now()

			tl := newTally()
			hammerPhase(t, c, srv, "per-key", keys*(int(burst)+10), keyOf, true, nil, tl)
			for k := range keys {
				if got := tl.admitted[keyOf(k)]; got != int(burst) {
					t.Errorf("frozen clock, %s: admitted %d, want exactly the burst, %v", keyOf(k), got, burst)
				}
			}
			hammerPhase(t, c, srv, "per-key", soak(n), keyOf, true, clk, tl)
			elapsed := clk.Now().Sub(t0)
			total, admitted := 0, 0
			for k := range keys {
				drain(t, c, srv, "per-key", keyOf(k), true, int(burst)+1, tl)
				checkBounds(t, keyOf(k), tl.admitted[keyOf(k)], burst, rate, elapsed)
				admitted += tl.admitted[keyOf(k)]
				total += tl.admitted[keyOf(k)] + tl.rejected[keyOf(k)]
			}
			if len(tl.bad) > 0 {
				t.Errorf("answers that were neither decided 200s nor 429s: %q", tl.bad)
			}
			if got := metric(t, h, "per-key", "allowed"); got != uint64(admitted) {
				t.Errorf("allowed counter: got %d, want %d", got, admitted)
			}
			if got := metric(t, h, "per-key", "fail_open"); got != 0 {
				t.Errorf("fail_open counter: got %d, want 0", got)
			}
			for k := range keys {
				if _, ok := findBucket(t, ms, "per-key", keyOf(k)); !ok {
					t.Errorf("no stored bucket for %s", keyOf(k))
				}
			}
			d := time.Since(start)
			t.Logf("%s: %d requests in %v (%.0f req/s): admitted %d, %.1f per key for bound %.1f over %v; cas_retries %d, slot_collisions %d",
				sem.name, total, d.Round(time.Millisecond), float64(total)/d.Seconds(), admitted, float64(admitted)/keys,
				burst+rate*elapsed.Seconds(), elapsed, metric(t, h, "per-key", "cas_retries"), metric(t, h, "per-key", "slot_collisions"))
		})
	}
}

// soak returns n requests, or a quarter of them under go test -short.
func soak(n int) int {
	if testing.Short() {
		return n / 4
	}
	return n
}
