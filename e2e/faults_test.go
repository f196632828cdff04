package e2e

import (
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// seedKey is where the filter keeps its slot seed in shared data (its
// documented key, written here rather than imported from the product).
const seedKey = "tokengate:seed"

// switchable returns a FaultData over ms whose gets (failGet) or sets answer
// INTERNAL_FAILURE while on is set. Faults are switched on only after the
// host has started, so the plugin's slot seed is loaded normally.
func switchable(ms *wasmhost.MemData, failGet bool, on *atomic.Bool) *wasmhost.FaultData {
	f := &wasmhost.FaultData{SharedData: ms}
	if failGet {
		f.GetFault = func(string) wasmhost.Status { return onStatus(on) }
	} else {
		f.SetFault = func(string, []byte, uint32) wasmhost.Status { return onStatus(on) }
	}
	return f
}

func onStatus(on *atomic.Bool) wasmhost.Status {
	if on.Load() {
		return wasmhost.StatusInternalFailure
	}
	return wasmhost.StatusOK
}

// hasLog reports whether the filter logged a line at level that mentions
// rule and one of events (the wording may be "event=fail_open" or "fail
// open").
func hasLog(h *wasmhost.Host, level wasmhost.LogLevel, rule string, events ...string) bool {
	for _, e := range h.Logs() {
		if e.Host || e.Level != level || !strings.Contains(e.Message, rule) {
			continue
		}
		for _, ev := range events {
			if strings.Contains(e.Message, ev) {
				return true
			}
		}
	}
	return false
}

// TestStoreFaultsFailOpen: while the shared data's Get or Set answers
// INTERNAL_FAILURE, requests (for a known and a new client IP) are let
// through to the upstream without RateLimit headers, nothing stored
// changes, fail_open counts every request and a warning is logged; once the
// store recovers, the bucket carries on from where it was. Under Envoy's and
// Kong's semantics.
func TestStoreFaultsFailOpen(t *testing.T) {
	for _, sem := range semantics {
		for _, op := range []string{"get", "set"} {
			t.Run(sem.name+"/"+op, func(t *testing.T) {
				clk := wasmhost.NewFakeClock(t0)
				ms := wasmhost.NewSharedData(sem.kong)
				var on atomic.Bool
				h, srv := startHost(t, hostOpts(perIPConfig, sem.kong, 2, clk, switchable(ms, op == "get", &on)))
				a, b := clientFrom("127.0.0.1", 1), clientFrom("127.0.0.2", 1)
				for i := range 3 {
					if r := mustDo(t, a, srv, "/", nil); r.status != 200 || r.header.Get("RateLimit-Remaining") != fmt.Sprint(9-i) {
						t.Fatalf("warm-up %d: got %d %v", i, r.status, r.header)
					}
				}
				before := ms.Snapshot("")

				on.Store(true)
				const n = 20
				for i := range n {
					c, who := a, "127.0.0.1"
					if i%4 == 3 {
						c, who = b, "127.0.0.2 (new)"
					}
					r := mustDo(t, c, srv, "/", nil)
					if r.status != http.StatusOK || !strings.Contains(r.body, `"method": "GET"`) {
						t.Errorf("step %d (%s): got %d %q, want the upstream's 200", i, who, r.status, r.body)
					}
					checkNoRateLimitHeaders(t, fmt.Sprintf("step %d (%s)", i, who), r)
				}
				on.Store(false)

				if after := ms.Snapshot(""); !reflect.DeepEqual(after, before) {
					t.Errorf("the store changed while failing:\nbefore %v\nafter  %v", before, after)
				}
				for c, want := range map[string]uint64{"fail_open": n, "allowed": 3, "rejected": 0, "store_denied": 0} {
					if got := metric(t, h, "per-ip", c); got != want {
						t.Errorf("%s counter: got %d, want %d", c, got, want)
					}
				}
				if !hasLog(h, wasmhost.LogWarn, "per-ip", "fail_open", "fail open") {
					t.Errorf("no fail-open warning for per-ip in %v", h.Logs())
				}
				// Recovered: the bucket holds 7 tokens, as before the failure.
				if r := mustDo(t, a, srv, "/", nil); r.status != 200 || r.header.Get("RateLimit-Remaining") != "6" {
					t.Errorf("after recovery: got %d remaining %q, want 200 and 6", r.status, r.header.Get("RateLimit-Remaining"))
				}
			})
		}
	}
}

// TestStoreFaultsDeny: a rule with "on_store_error": "deny" answers 503
// while the store fails, with the store_error reason and rule, and counts
// store_denied instead of fail_open.
func TestStoreFaultsDeny(t *testing.T) {
	cfg := `{"rules":[{"name":"strict","limit_keys":["ip:address"],"on_store_error":"deny",` +
		`"algorithm_config":{"rps":5,"burst":10}}]}`
	for _, sem := range semantics {
		for _, op := range []string{"get", "set"} {
			t.Run(sem.name+"/"+op, func(t *testing.T) {
				clk := wasmhost.NewFakeClock(t0)
				ms := wasmhost.NewSharedData(sem.kong)
				var on atomic.Bool
				h, srv := startHost(t, hostOpts(cfg, sem.kong, 2, clk, switchable(ms, op == "get", &on)))
				c := clientFrom("127.0.0.1", 1)
				mustDo(t, c, srv, "/", nil)
				before := ms.Snapshot("")
				on.Store(true)
				const n = 5
				for i := range n {
					r := mustDo(t, c, srv, "/", nil)
					want := `{"error":"rate_limiter_unavailable","reason":"store_error","rule":"strict"}` + "\n"
					if r.status != http.StatusServiceUnavailable || r.body != want {
						t.Fatalf("step %d: got %d %q, want 503 %q", i, r.status, r.body, want)
					}
					for k, v := range map[string]string{"X-Tokengate-Reason": "store_error", "X-Tokengate-Rule": "strict",
						"Content-Type": "application/json"} {
						if got := r.header.Get(k); got != v {
							t.Errorf("step %d: got %s %q, want %q", i, k, got, v)
						}
					}
					for _, k := range append(rateLimitHeaders, "Retry-After") {
						if v := r.header.Values(k); len(v) > 0 {
							t.Errorf("step %d: got %s %q on a store error", i, k, v)
						}
					}
				}
				on.Store(false)
				if after := ms.Snapshot(""); !reflect.DeepEqual(after, before) {
					t.Errorf("the store changed while failing:\nbefore %v\nafter  %v", before, after)
				}
				for c, want := range map[string]uint64{"store_denied": n, "fail_open": 0, "allowed": 1} {
					if got := metric(t, h, "strict", c); got != want {
						t.Errorf("%s counter: got %d, want %d", c, got, want)
					}
				}
				if !hasLog(h, wasmhost.LogWarn, "strict", "store_denied", "store error") {
					t.Errorf("no store-error warning in %v", h.Logs())
				}
			})
		}
	}
}

// TestCASStorm: while every Set answers CAS_MISMATCH (wasmhost.CASStorm), each
// request makes at most cas_max_attempts (8) rounds, then fails open and is
// counted; 48 concurrent requests (a known client IP, whose bucket exists,
// and new client IPs, whose bucket must first be created) all complete
// within the client's timeout. For the known IP every round is one Set, so
// the Sets and cas_retries are exactly 8 per request.
func TestCASStorm(t *testing.T) {
	const attempts = 8
	cfg := `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":5,"burst":10}}],` +
		`"settings":{"cas_max_attempts":8}}`
	for _, sem := range semantics {
		t.Run(sem.name, func(t *testing.T) {
			clk := wasmhost.NewFakeClock(t0)
			ms := wasmhost.NewSharedData(sem.kong)
			var sets atomic.Int64
			var on atomic.Bool
			storm := wasmhost.CASStorm(ms, &sets)
			stormFault := storm.SetFault
			storm.SetFault = func(k string, v []byte, cas uint32) wasmhost.Status {
				if !on.Load() {
					return wasmhost.StatusOK
				}
				return stormFault(k, v, cas)
			}
			h, srv := startHost(t, hostOpts(cfg, sem.kong, hammerWorkers, clk, storm))
			known := clientFrom("127.0.0.1", hammerClients)
			mustDo(t, known, srv, "/", nil)
			before := ms.Snapshot("")
			retriesBefore := metric(t, h, "per-ip", "cas_retries")
			sets.Store(0)
			on.Store(true)

			// Known IP first, alone, so its Sets can be counted exactly.
			const nKnown, nNew = 40, 8
			run := func(n int, client func(i int) *http.Client) []response {
				out := make([]response, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r, err := do(client(i), srv, "/", nil)
						if err != nil {
							t.Errorf("request %d did not complete: %v", i, err)
						}
						out[i] = r
					}()
				}
				wg.Wait()
				return out
			}
			rs := run(nKnown, func(int) *http.Client { return known })
			knownSets, knownRetries := sets.Load(), metric(t, h, "per-ip", "cas_retries")-retriesBefore
			newClients := make([]*http.Client, nNew)
			for i := range newClients {
				newClients[i] = clientFrom(fmt.Sprintf("127.0.1.%d", i+1), 1)
			}
			rs = append(rs, run(nNew, func(i int) *http.Client { return newClients[i] })...)
			on.Store(false)

			for i, r := range rs {
				if r.status != http.StatusOK {
					t.Errorf("request %d: got %d %q, want a fail-open 200", i, r.status, r.body)
				}
				checkNoRateLimitHeaders(t, fmt.Sprintf("request %d", i), r)
			}
			if knownSets != nKnown*attempts || knownRetries != nKnown*attempts {
				t.Errorf("known key: got %d Sets and %d cas_retries for %d requests, want %d each (%d rounds per request)",
					knownSets, knownRetries, nKnown, nKnown*attempts, attempts)
			}
			newSets := sets.Load() - knownSets
			// Creating a missing key takes at most 2 Sets per round.
			if max := int64(nNew * 2 * (attempts + 1)); newSets > max {
				t.Errorf("new keys: got %d Sets for %d requests, want at most %d", newSets, nNew, max)
			}
			if got := metric(t, h, "per-ip", "fail_open"); got != nKnown+nNew {
				t.Errorf("fail_open counter: got %d, want %d", got, nKnown+nNew)
			}
			if after := ms.Snapshot(""); !reflect.DeepEqual(after, before) {
				t.Errorf("the store changed during the storm:\nbefore %v\nafter  %v", before, after)
			}
			if !hasLog(h, wasmhost.LogWarn, "per-ip", "fail_open", "fail open") {
				t.Errorf("no fail-open warning for per-ip in the log")
			}
			t.Logf("%s: known key %d Sets / %d requests; new keys %d Sets / %d requests; cas_retries %d",
				sem.name, knownSets, nKnown, newSets, nNew, metric(t, h, "per-ip", "cas_retries"))
		})
	}
}

// TestSeedDisagreementSplitsBuckets pinned a bug in the bounded key space:
// each worker VM loaded the slot seed (shared-data key "tokengate:seed")
// once, at configuration, and kept it. Workers agree on an identity's slots
// only if they use the same seed, but:
//   - "get fails": a worker whose read of the seed failed used seed 0 while
//     the others used the stored seed. Now a worker that never read the
//     seed reads it again on its next request, so at one instant one client
//     IP over 2 workers is admitted exactly the burst;
//   - "evicted (kong)": on Kong the shm_kv zone may evict the seed; a worker
//     configured afterwards creates a new one. Workers re-read the seed
//     every second and adopt the stored one, so they may disagree at the
//     instant of the eviction but agree one second later: 1.5 s on, at
//     1 token/s, the client is admitted exactly once (one shared bucket),
//     not once per seed in use.
func TestSeedDisagreementSplitsBuckets(t *testing.T) {
	cfg := `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":5}}]}`
	tests := []struct {
		name string
		kong bool
		// onSeedRead runs on every read of the seed once it exists; n counts
		// those reads from 1 (worker 0's read after creating it is 1,
		// worker 1's first read is 2).
		onSeedRead func(ms *wasmhost.MemData, n int64) wasmhost.Status
	}{
		{name: "get fails", onSeedRead: func(_ *wasmhost.MemData, n int64) wasmhost.Status {
			if n == 2 {
				return wasmhost.StatusInternalFailure
			}
			return wasmhost.StatusOK
		}},
		{name: "evicted (kong)", kong: true, onSeedRead: func(ms *wasmhost.MemData, n int64) wasmhost.Status {
			if n == 2 {
				ms.Evict(seedKey) // LRU eviction just before worker 1 reads it
			}
			return wasmhost.StatusOK
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms := wasmhost.NewSharedData(tc.kong)
			var reads atomic.Int64
			fs := &wasmhost.FaultData{SharedData: ms, GetFault: func(key string) wasmhost.Status {
				if key != seedKey {
					return wasmhost.StatusOK
				}
				if _, _, st := ms.Get(key); st != wasmhost.StatusOK {
					return wasmhost.StatusOK // not created yet
				}
				return tc.onSeedRead(ms, reads.Add(1))
			}}
			clk := wasmhost.NewFakeClock(t0)
			h, srv := startHost(t, hostOpts(cfg, tc.kong, 2, clk, fs))
			c := clientFrom("127.0.0.1", 1)
			admitted := 0
			for range 20 {
				if mustDo(t, c, srv, "/", nil).status == http.StatusOK {
					admitted++
				}
			}
			seedErrors, _ := h.Metric("tokengate.seed_errors")
			if !tc.kong && admitted != 5 {
				t.Errorf("one client IP over 2 workers at one instant: admitted %d, want the burst, 5 "+
					"(seed_errors %d; buckets %q)", admitted, seedErrors, bucketKeys(ms, "per-ip"))
			}
			clk.Advance(1500 * time.Millisecond)
			admitted = 0
			for range 20 {
				if mustDo(t, c, srv, "/", nil).status == http.StatusOK {
					admitted++
				}
			}
			if admitted != 1 {
				t.Errorf("1.5 s later at 1 token/s over 2 workers: admitted %d, want 1 (all workers on one seed; buckets %q)",
					admitted, bucketKeys(ms, "per-ip"))
			}
		})
	}
}

// TestNoSharedDataPerWorker models APISIX, whose shared-data calls answer
// UNIMPLEMENTED: each worker VM keeps its own buckets, so with 2 workers one
// client IP is admitted at most twice its burst at one instant, and at
// least its burst, instead of being let through without limit.
func TestNoSharedDataPerWorker(t *testing.T) {
	cfg := `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":5}}]}`
	ms := wasmhost.NewSharedData(false)
	unimplemented := wasmhost.FailingData(ms, wasmhost.StatusUnimplemented, wasmhost.StatusUnimplemented)
	clk := wasmhost.NewFakeClock(t0)
	h, srv := startHost(t, hostOpts(cfg, false, 2, clk, unimplemented))
	c := clientFrom("127.0.0.1", 1)
	admitted := 0
	for range 40 {
		if mustDo(t, c, srv, "/", nil).status == http.StatusOK {
			admitted++
		}
	}
	if admitted < 5 || admitted > 10 {
		t.Errorf("admitted %d of 40 at one instant over 2 workers, want between the burst (5) and 2 × burst", admitted)
	}
	if n, _ := h.Metric("tokengate.local_state"); n < 1 || n > 2 {
		t.Errorf("local_state: got %d, want one per worker that switched", n)
	}
	if n, _ := h.Metric("tokengate.rule.per-ip.fail_open"); n != 0 {
		t.Errorf("fail_open: got %d, want 0", n)
	}
	if ms.Len() != 0 {
		t.Errorf("the host store holds %d keys, want none", ms.Len())
	}
}

// TestNoSharedDataManyClients interleaves many clients on one worker whose
// buckets live in the guest (APISIX): each client is admitted exactly its
// burst at one instant. The filter hands the store its keys as views of a
// buffer it rewrites for every request, so this fails if the in-guest store
// kept a key without copying it (its map, grown past a few keys, would hash
// them by bytes that have since changed).
func TestNoSharedDataManyClients(t *testing.T) {
	cfg := `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}}]}`
	unimplemented := wasmhost.FailingData(wasmhost.NewSharedData(false), wasmhost.StatusUnimplemented, wasmhost.StatusUnimplemented)
	h, _ := startHost(t, hostOpts(cfg, false, 1, wasmhost.NewFakeClock(t0), unimplemented))
	const clients = 300
	admitted := make([]int, clients)
	ex := &wasmhost.Exchange{Request: []wasmhost.Header{{Name: ":authority", Value: "example.com"},
		{Name: ":path", Value: "/"}, {Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"}}}
	for range 5 {
		for i := range clients {
			ex.RemoteAddr = "10.2." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255) + ":5000"
			res, err := h.Exchange(0, ex)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status == http.StatusOK {
				admitted[i]++
			}
		}
	}
	for i, n := range admitted {
		if n != 3 {
			t.Errorf("client %d: admitted %d of 5 at one instant, want the burst, 3", i, n)
		}
	}
}
