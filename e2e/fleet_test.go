package e2e

import (
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/redistest"
)

// The fleet tests run the built module in three local hosts (three
// proxies, two worker VMs each) whose cluster-scope rules are decided by
// one tokengate-rls process on a real redis-server: what Envoy replicas in
// front of one service do.

// fleet is three proxies sharing one tokengate-rls.
type fleet struct {
	redis   *redistest.Server
	rls     *rlsProc
	proxies []*httptest.Server
}

// startFleet starts Redis, tokengate-rls with cfg, and n proxies with cfg
// whose "ratelimit" cluster is the service. The service's Redis timeout is
// raised from its 25 ms to 1 s: these tests count decisions, and on a
// loaded machine a Redis round trip can take longer than 25 ms
// (TestFleetFaults keeps the default).
func startFleet(t *testing.T, cfg string, n int) *fleet {
	t.Helper()
	f := &fleet{redis: redistest.Start(t)}
	f.rls = startTokengateRLS(t, cfg, f.redis.Addr, "-redis-timeout", "1s")
	for range n {
		_, srv := startClusterHost(t, cfg, rlsBootstrap(f.rls.Addr), 2)
		f.proxies = append(f.proxies, srv)
	}
	return f
}

// fleetRule is a configuration with one rule of the given scope, keyed by
// x-api-key, decided by the service of cluster "ratelimit".
func fleetRule(name, scope string, rps, burst float64, onError string, timeoutMs int) string {
	return `{"rules":[{"name":"` + name + `","scope":"` + scope + `","limit_keys":["header:x-api-key"],
	  "algorithm_config":{"rps":` + strconv.FormatFloat(rps, 'f', -1, 64) + `,"burst":` + strconv.FormatFloat(burst, 'f', -1, 64) + `}}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":` + strconv.Itoa(timeoutMs) + `,"on_error":"` + onError + `"}}}`
}

// send sends GET / with headers to proxy i and returns the status.
func (f *fleet) send(t testing.TB, i int, headers map[string]string) int {
	t.Helper()
	resp, _ := getURL(t, f.proxies[i%len(f.proxies)].URL+"/", headers)
	return resp.StatusCode
}

// TestFleetHammersOneKey: three proxies x four clients each hammer one key
// for about two seconds. The fleet admits at most burst + rate x elapsed
// (+1), elapsed from the first request sent to the last answer received,
// and at least burst + rate x (the time requests kept coming) minus a few:
// one bucket, not one per proxy, and none of its tokens lost.
func TestFleetHammersOneKey(t *testing.T) {
	const rate, burst = 10.0, 10.0
	f := startFleet(t, fleetRule("fleet", "cluster", rate, burst, "deny", 1000), 3)
	const clients = 4
	duration := 2 * time.Second
	if testing.Short() {
		duration = time.Second
	}
	var admitted, rejected, other atomic.Int64
	var firstRecv, lastSend atomic.Int64 // unix nanos
	firstRecv.Store(math.MaxInt64)
	start := time.Now()
	stopAt := start.Add(duration)
	var wg sync.WaitGroup
	for p := range f.proxies {
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < 5000 && time.Now().Before(stopAt); n++ {
					sent := time.Now().UnixNano()
					code := f.send(t, p, map[string]string{"x-api-key": "hot"})
					recv := time.Now().UnixNano()
					for { // firstRecv = min
						old := firstRecv.Load()
						if recv >= old || firstRecv.CompareAndSwap(old, recv) {
							break
						}
					}
					for { // lastSend = max
						old := lastSend.Load()
						if sent <= old || lastSend.CompareAndSwap(old, sent) {
							break
						}
					}
					switch code {
					case http.StatusOK:
						admitted.Add(1)
					case http.StatusTooManyRequests:
						rejected.Add(1)
					default:
						other.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	pressing := float64(lastSend.Load()-firstRecv.Load()) / 1e9
	upper := burst + rate*elapsed + 1
	lower := burst + rate*pressing - 3
	got := float64(admitted.Load())
	t.Logf("admitted %d, rejected %d, other %d in %.2fs (pressing %.2fs): bounds [%.1f, %.1f]",
		admitted.Load(), rejected.Load(), other.Load(), elapsed, pressing, lower, upper)
	if other.Load() != 0 {
		t.Errorf("%d answers neither 200 nor 429 while Redis and the service are up", other.Load())
	}
	if rejected.Load() == 0 {
		t.Fatal("nothing rejected: the load never exceeded the limit, the test proves nothing")
	}
	if got > upper {
		t.Errorf("admitted %v > burst + rate x elapsed + 1 = %.1f: over the fleet's limit", got, upper)
	}
	if got < lower {
		t.Errorf("admitted %v < burst + rate x pressing - 3 = %.1f: tokens lost", got, lower)
	}
}

// TestFleetManyKeys: 300 keys, each sent burst + 2 requests spread over the
// three proxies; each key gets exactly its burst (the rate adds nothing in
// the test's time), whichever proxy its requests reach.
func TestFleetManyKeys(t *testing.T) {
	const burst = 3
	f := startFleet(t, fleetRule("keys", "cluster", 0.001, burst, "deny", 1000), 3)
	const keys = 300
	admitted := make([]atomic.Int64, keys)
	var other atomic.Int64
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < keys; k += 6 {
				for i := range burst + 2 {
					switch f.send(t, k+i, map[string]string{"x-api-key": "k" + strconv.Itoa(k)}) {
					case http.StatusOK:
						admitted[k].Add(1)
					case http.StatusTooManyRequests:
					default:
						other.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if other.Load() != 0 {
		t.Errorf("%d answers neither 200 nor 429", other.Load())
	}
	for k := range keys {
		if n := admitted[k].Load(); n != burst {
			t.Errorf("key k%d: %d admitted, want %d", k, n, burst)
		}
	}
}

// codesOf sends one request per header set to proxies in turn and returns
// the statuses and the x-tokengate-rule of each answer.
func (f *fleet) codesOf(t *testing.T, hs ...map[string]string) ([]int, []string) {
	t.Helper()
	var codes []int
	var rules []string
	for i, h := range hs {
		resp, _ := getURL(t, f.proxies[i%len(f.proxies)].URL+"/", h)
		codes = append(codes, resp.StatusCode)
		rules = append(rules, resp.Header.Get("x-tokengate-rule"))
	}
	return codes, rules
}

func ab(a, b string) map[string]string { return map[string]string{"x-a": a, "x-b": b} }

func repeat(h map[string]string, n int) []map[string]string {
	out := make([]map[string]string, n)
	for i := range out {
		out[i] = h
	}
	return out
}

// TestFleetAllOrNothing: a request that one rule rejects takes from no
// bucket, across two cluster rules (decided in one call by the service) and
// across a local and a cluster rule (the local bucket refunded when the
// service rejects; the service never asked when the local rule rejects).
func TestFleetAllOrNothing(t *testing.T) {
	t.Run("cluster rules", func(t *testing.T) {
		const cfg = `{"rules":[
		  {"name":"a","scope":"cluster","limit_keys":["header:x-a"],"algorithm_config":{"rps":0.001,"burst":5}},
		  {"name":"b","scope":"cluster","limit_keys":["header:x-b"],"algorithm_config":{"rps":0.001,"burst":2}}],
		  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":1000,"on_error":"deny"}}}`
		f := startFleet(t, cfg, 3)
		// b1 admits 2; the three it rejects must not take from a1, which
		// then still has 3: two with b2, one with b3.
		var hs []map[string]string
		hs = append(hs, repeat(ab("a1", "b1"), 5)...)
		hs = append(hs, repeat(ab("a1", "b2"), 3)...)
		hs = append(hs, repeat(ab("a1", "b3"), 2)...)
		codes, rules := f.codesOf(t, hs...)
		want := []int{200, 200, 429, 429, 429, 200, 200, 429, 200, 429}
		wantRules := []string{"", "", "b", "b", "b", "", "", "b", "", "a"}
		if !slices.Equal(codes, want) || !slices.Equal(rules, wantRules) {
			t.Errorf("codes %v rules %q, want %v %q", codes, rules, want, wantRules)
		}
	})
	t.Run("local and cluster rules", func(t *testing.T) {
		const cfg = `{"rules":[
		  {"name":"l","limit_keys":["header:x-a"],"algorithm_config":{"rps":0.001,"burst":3}},
		  {"name":"c","scope":"cluster","limit_keys":["header:x-b"],"algorithm_config":{"rps":0.001,"burst":1}}],
		  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":1000,"on_error":"deny"}}}`
		f := startFleet(t, cfg, 1) // local buckets are per proxy: one proxy
		codes, rules := f.codesOf(t,
			ab("a1", "b1"), ab("a1", "b1"), // c rejects the second: l refunded
			ab("a1", "b2"), ab("a1", "b3"), // l: 3 - 3 = 0
			ab("a1", "b4"), // l rejects: c never asked, b4 untouched
			ab("a2", "b4"), // so b4 admits
		)
		want := []int{200, 429, 200, 200, 429, 200}
		wantRules := []string{"", "c", "", "", "l", ""}
		if !slices.Equal(codes, want) || !slices.Equal(rules, wantRules) {
			t.Errorf("codes %v rules %q, want %v %q", codes, rules, want, wantRules)
		}
	})
}

// TestFleetShadow: a cluster rule in a shadow policy never rejects and adds
// no headers, though its bucket runs dry.
func TestFleetShadow(t *testing.T) {
	const cfg = `{"bundle_version":1,"policies":[{"id":"trial","spec":{"mode":"shadow",
	  "rules":[{"name":"trial","scope":"cluster","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":0.001,"burst":2}}]}}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":1000,"on_error":"deny"}}}`
	f := startFleet(t, cfg, 3)
	for i := range 6 {
		resp, _ := getURL(t, f.proxies[i%3].URL+"/", map[string]string{"x-api-key": "shadowed"})
		r := response{status: resp.StatusCode, header: resp.Header}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request %d: %d, want 200 (shadow)", i, resp.StatusCode)
		}
		checkNoRateLimitHeaders(t, "request "+strconv.Itoa(i), r)
	}
}

// TestFleetFaults: the service down, frozen (slower than timeout_ms) and
// its Redis down. Each request follows on_error, none waits much past the
// timeout, and nothing is admitted past the limit.
func TestFleetFaults(t *testing.T) {
	const timeoutMs = 100
	// Generous: the bound is that a request does not hang on the service,
	// not how fast this machine is.
	const patience = 3 * time.Second
	cfg := func(onError string) string { return fleetRule("f", "cluster", 0.001, 2, onError, timeoutMs) }
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, cfg("deny"), redis.Addr)
	proxies := map[string]string{}
	for _, oe := range []string{"allow", "deny", "local"} {
		_, srv := startClusterHost(t, cfg(oe), rlsBootstrap(rls.Addr), 2)
		proxies[oe] = srv.URL
	}
	// check sends n requests with a fresh key to each on_error flavour and
	// compares the statuses.
	check := func(t *testing.T, fault string, n int) {
		t.Helper()
		want := map[string][]int{
			"allow": slices.Repeat([]int{200}, n),
			"deny":  slices.Repeat([]int{503}, n),
			// Decided in this proxy's shared data: burst 2.
			"local": append([]int{200, 200}, slices.Repeat([]int{429}, n-2)...),
		}
		for _, oe := range []string{"allow", "deny", "local"} {
			var codes []int
			for range n {
				t0 := time.Now()
				resp, _ := getURL(t, proxies[oe]+"/", map[string]string{"x-api-key": fault})
				if d := time.Since(t0); d > patience {
					t.Errorf("%s, on_error %s: a request took %v (timeout_ms %d)", fault, oe, d, timeoutMs)
				}
				codes = append(codes, resp.StatusCode)
			}
			if !slices.Equal(codes, want[oe]) {
				t.Errorf("%s, on_error %s: %v, want %v", fault, oe, codes, want[oe])
			}
		}
	}
	// Healthy first: the service decides (burst 2 for the key, whatever
	// the flavour).
	for _, oe := range []string{"allow", "deny", "local"} {
		var codes []int
		for range 3 {
			resp, _ := getURL(t, proxies[oe]+"/", map[string]string{"x-api-key": "healthy-" + oe})
			codes = append(codes, resp.StatusCode)
		}
		if want := []int{200, 200, 429}; !slices.Equal(codes, want) {
			t.Fatalf("healthy, on_error %s: %v, want %v", oe, codes, want)
		}
	}
	t.Run("redis down", func(t *testing.T) {
		redis.Kill()
		defer redis.Restart()
		check(t, "redis-down", 4)
	})
	t.Run("service frozen", func(t *testing.T) {
		rls.Freeze()
		defer rls.Thaw()
		check(t, "frozen", 3)
	})
	t.Run("service down", func(t *testing.T) {
		rls.Stop()
		check(t, "down", 4)
	})
}
