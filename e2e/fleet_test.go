package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// The fleet tests run the built module in three local hosts (three
// proxies, two worker VMs each) whose cluster-scope rules are decided by
// one tokengate-rls process on a real redis-server: what Envoy replicas in
// front of one service do.

// fleet is three proxies sharing one tokengate-rls.
type fleet struct {
	redis   *redistest.Server
	rls     *rlsProc
	hosts   []*wasmhost.Host
	proxies []*httptest.Server
}

// startFleet starts Redis, tokengate-rls with cfg, and n proxies with cfg
// whose "ratelimit" cluster is the service. The service has
// startTokengateRLS's generous Redis timeout, not the product's 25 ms:
// these tests count decisions, and on a loaded machine a Redis round trip
// can take longer than 25 ms (TestFleetFaults sets its own).
func startFleet(t *testing.T, cfg string, n int) *fleet {
	t.Helper()
	f := &fleet{redis: redistest.Start(t)}
	f.rls = startTokengateRLS(t, cfg, f.redis.Addr)
	for range n {
		h, srv := startClusterHost(t, cfg, rlsBootstrap(f.rls.Addr), 2)
		f.hosts = append(f.hosts, h)
		f.proxies = append(f.proxies, srv)
	}
	return f
}

// sum adds up a rule's counter over the proxies.
func (f *fleet) sum(t testing.TB, rule, counter string) uint64 {
	t.Helper()
	var n uint64
	for _, h := range f.hosts {
		n += metric(t, h, rule, counter)
	}
	return n
}

// The fault tests bound how long a request may wait on a failing service
// by the call's timeout_ms plus callSlack. The slack is generous on
// purpose: the property is that no request hangs on the service (without a
// timeout it would wait for the fault to end, or for the host's 60 s pause
// timeout), not how fast this machine answers; two cores shared with other
// work can stall a process for a second. Where a fault has an end the test
// controls (a frozen service, DEBUG SLEEP), the tests also check that the
// answer came while the fault lasted, which no clock decides.
const callSlack = 4 * time.Second

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

// TestFleetOnRedisCluster: the fleet on a 3-master Redis Cluster. Keys
// spread over every master's slots; each gets exactly its burst; a request
// with two cluster rules whose buckets live on different masters is
// all-or-nothing across them (the service refunds across nodes); with a
// master killed, requests that need it follow on_error and the rest are
// decided.
func TestFleetOnRedisCluster(t *testing.T) {
	const cfg = `{"rules":[
	  {"name":"a","scope":"cluster","limit_keys":["header:x-a"],"algorithm_config":{"rps":0.001,"burst":3}},
	  {"name":"b","scope":"cluster","limit_keys":["header:x-b"],"algorithm_config":{"rps":0.001,"burst":1}}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":1000,"on_error":"deny"}}}`
	rc := redistest.StartCluster(t, 3)
	rls := startTokengateRLS(t, cfg, strings.Join(rc.Addrs(), ","), "-redis-cluster", "-redis-timeout", "1s")
	f := &fleet{rls: rls}
	for range 3 {
		h, srv := startClusterHost(t, cfg, rlsBootstrap(rls.Addr), 2)
		f.hosts = append(f.hosts, h)
		f.proxies = append(f.proxies, srv)
	}
	// One proxy of each other on_error flavour, for the killed master.
	flavours := map[string]string{"deny": f.proxies[0].URL}
	for _, oe := range []string{"allow", "local"} {
		_, srv := startClusterHost(t, strings.Replace(cfg, `"on_error":"deny"`, `"on_error":"`+oe+`"`, 1), rlsBootstrap(rls.Addr), 2)
		flavours[oe] = srv.URL
	}
	// 30 keys of rule a, each with a fresh b: exactly 3 pass per a-key.
	nodes := map[int]bool{}
	for k := range 30 {
		key := "ka" + strconv.Itoa(k)
		nodes[rc.NodeFor("tb:{a:"+key+"}")] = true
		var hs []map[string]string
		for i := range 5 {
			hs = append(hs, ab(key, key+"-b"+strconv.Itoa(i)))
		}
		codes, _ := f.codesOf(t, hs...)
		if want := []int{200, 200, 200, 429, 429}; !slices.Equal(codes, want) {
			t.Errorf("key %s: %v, want %v", key, codes, want)
		}
	}
	if len(nodes) != 3 {
		t.Errorf("the keys reached %d masters, want all 3", len(nodes))
	}
	// b-keys on another master than a's key "x": the first b admits one;
	// the second request with it is rejected by b and must not take from
	// a, which then still admits two more (fresh bs) before running dry.
	aNode := rc.NodeFor("tb:{a:x}")
	var bs []string
	for i := 0; len(bs) < 4; i++ {
		if b := "b" + strconv.Itoa(i); rc.NodeFor("tb:{b:"+b+"}") != aNode {
			bs = append(bs, b)
		}
	}
	codes, rules := f.codesOf(t, ab("x", bs[0]), ab("x", bs[0]), ab("x", bs[1]), ab("x", bs[2]), ab("x", bs[3]))
	if want, wantRules := []int{200, 429, 200, 200, 429}, []string{"", "b", "", "", "a"}; !slices.Equal(codes, want) || !slices.Equal(rules, wantRules) {
		t.Errorf("across masters: %v %q, want %v %q", codes, rules, want, wantRules)
	}

	// A master killed: requests whose buckets live there follow on_error
	// without waiting past the timeout (plus callSlack); the others'
	// buckets keep deciding, and the failed requests take nothing from
	// them.
	dead := rc.NodeFor("tb:{a:x}")
	rc.Nodes[dead].Kill()
	// key returns a value of rule whose bucket is (or is not) on the dead
	// master, a different one for each prefix.
	key := func(rule string, onDead bool, prefix string) string {
		for i := 0; ; i++ {
			v := prefix + strconv.Itoa(i)
			if (rc.NodeFor("tb:{"+rule+":"+v+"}") == dead) == onDead {
				return v
			}
		}
	}
	// Each case sends the same request twice to each flavour (fresh keys
	// per flavour). On the dead master: deny answers 503; allow admits;
	// local decides both rules in the proxy's shared data, where b's burst
	// of 1 admits the first only.
	failing := map[string][]int{"deny": {503, 503}, "allow": {200, 200}, "local": {200, 429}}
	for ci, tc := range []struct {
		name       string
		aDead      bool
		bDead      bool
		liveAnswer bool
	}{
		{"both buckets on live masters", false, false, true},
		{"a on the dead master", true, false, false},
		{"b on the dead master", false, true, false},
	} {
		for _, oe := range []string{"deny", "allow", "local"} {
			p := strconv.Itoa(ci) + oe // fresh keys for each case and flavour
			h := ab(key("a", tc.aDead, "a"+p), key("b", tc.bDead, "b"+p))
			want := failing[oe]
			if tc.liveAnswer {
				want = []int{200, 429} // the service decides: b's burst is 1
			}
			var codes []int
			for range 2 {
				t0 := time.Now()
				resp, _ := getURL(t, flavours[oe]+"/", h)
				codes = append(codes, resp.StatusCode)
				if d := time.Since(t0); d > time.Second+callSlack {
					t.Errorf("master killed, %s, on_error %s: a request took %v (timeout_ms 1000 + %v slack)", tc.name, oe, d, callSlack)
				}
			}
			if !slices.Equal(codes, want) {
				t.Errorf("master killed, %s, on_error %s: %v, want %v", tc.name, oe, codes, want)
			}
			if tc.liveAnswer || (tc.aDead && tc.bDead) {
				continue
			}
			// Nothing over-admitted, nothing taken by the failed requests:
			// the live bucket still admits its whole burst through the
			// service (fresh keys of the other rule, on live masters).
			live, burst := "a", 3
			if tc.aDead {
				live, burst = "b", 1
			}
			liveKey := h["x-"+live]
			var got []int
			for i := range burst + 1 {
				other := key("a", false, "fresh-a"+p+strconv.Itoa(i))
				hh := ab(other, liveKey)
				if live == "a" {
					hh = ab(liveKey, key("b", false, "fresh-b"+p+strconv.Itoa(i)))
				}
				resp, _ := getURL(t, flavours["deny"]+"/", hh)
				got = append(got, resp.StatusCode)
			}
			if want := append(slices.Repeat([]int{200}, burst), 429); !slices.Equal(got, want) {
				t.Errorf("master killed, %s, on_error %s: the live bucket %s=%s then admits %v, want %v (its burst, untouched)", tc.name, oe, live, liveKey, got, want)
			}
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
// no headers, though its bucket runs dry: the service counts the four
// would-be rejections.
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
	resp, body := getURL(t, "http://"+f.rls.Admin+"/metrics", nil)
	want := `tokengate_rls_decisions_total{code="shadow_over_limit",rule="trial"} 4`
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, want) {
		t.Errorf("the service's metrics lack %s:\n%s", want, body)
	}
	// The service gone, on_error deny: a shadow rule still never rejects;
	// each failure counts as fail_open, none as store_denied.
	f.rls.Stop()
	for i := range 3 {
		resp, _ := getURL(t, f.proxies[i].URL+"/", map[string]string{"x-api-key": "shadowed"})
		if resp.StatusCode != http.StatusOK {
			t.Errorf("service down, request %d: %d, want 200 (a shadow rule fails open whatever on_error says)", i, resp.StatusCode)
		}
	}
	if n := f.sum(t, "trial", "fail_open"); n != 3 {
		t.Errorf("fail_open %d, want 3", n)
	}
	if n := f.sum(t, "trial", "store_denied"); n != 0 {
		t.Errorf("store_denied %d, want 0", n)
	}
}

// TestFleetFaults: the service down, frozen (slower than timeout_ms), its
// Redis down and its Redis slow (frozen, slower than the service's Redis
// timeout). Each request follows on_error, none waits past the
// timeout (plus callSlack, and before a fault the test ends is over), and
// nothing is admitted past the limit: deny admits none, local exactly its
// shared-data burst.
func TestFleetFaults(t *testing.T) {
	// Long enough that no healthy round trip on a loaded machine comes
	// near them (the healthy phase must not turn into errors); every
	// fault below answers at once or costs one timeout, and where a fault
	// lasts (a frozen Redis, a frozen service) it lasts until the test
	// ends it, so which timeout fires first, and when, does not change
	// the answers: the service's Redis timeout (below the filter's, so
	// the service usually answers UNAVAILABLE) and the filter's both lead
	// to on_error.
	const timeoutMs = 2000
	bound := timeoutMs*time.Millisecond + callSlack
	cfg := func(onError string) string { return fleetRule("f", "cluster", 0.001, 2, onError, timeoutMs) }
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, cfg("deny"), redis.Addr, "-redis-timeout", "1500ms")
	proxies := map[string]string{}
	for _, oe := range []string{"allow", "deny", "local"} {
		_, srv := startClusterHost(t, cfg(oe), rlsBootstrap(rls.Addr), 2)
		proxies[oe] = srv.URL
	}
	// check sends n requests with a fresh key to each on_error flavour, the
	// flavours side by side, and compares the statuses. lasting, if not
	// nil, reports whether the fault still lasts: every answer must come
	// while it does.
	check := func(t *testing.T, fault string, n int, lasting func() bool) {
		t.Helper()
		want := map[string][]int{
			"allow": slices.Repeat([]int{200}, n),
			"deny":  slices.Repeat([]int{503}, n),
			// Decided in this proxy's shared data: burst 2.
			"local": append([]int{200, 200}, slices.Repeat([]int{429}, n-2)...),
		}
		var wg sync.WaitGroup
		for _, oe := range []string{"allow", "deny", "local"} {
			wg.Add(1)
			go func() { // reports with t.Errorf only
				defer wg.Done()
				var codes []int
				for range n {
					t0 := time.Now()
					code, err := tryGet(proxies[oe]+"/", map[string]string{"x-api-key": fault})
					if err != nil {
						t.Errorf("%s, on_error %s: %v", fault, oe, err)
						return
					}
					if d := time.Since(t0); d > bound {
						t.Errorf("%s, on_error %s: a request took %v (timeout_ms %d + %v slack)", fault, oe, d, timeoutMs, callSlack)
					}
					if lasting != nil && !lasting() {
						t.Errorf("%s, on_error %s: an answer came only after the fault ended: the request waited on it", fault, oe)
					}
					codes = append(codes, code)
				}
				if !slices.Equal(codes, want[oe]) {
					t.Errorf("%s, on_error %s: %v, want %v", fault, oe, codes, want[oe])
				}
			}()
		}
		wg.Wait()
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
	t.Run("redis slow", func(t *testing.T) {
		// Redis frozen (SIGSTOP, certainly stopped before a request is
		// sent) until the test thaws it: it accepts connections and
		// answers nothing, slower than the service's Redis timeout and the
		// filter's, however long the requests take. The service answers
		// UNAVAILABLE, and every request must be answered while Redis is
		// still frozen.
		redis.Freeze()
		var frozen atomic.Bool
		frozen.Store(true)
		defer func() { frozen.Store(false); redis.Thaw() }()
		check(t, "redis-slow", 4, frozen.Load)
	})
	t.Run("redis down", func(t *testing.T) {
		redis.Kill()
		defer redis.Restart()
		check(t, "redis-down", 4, nil)
	})
	t.Run("service frozen", func(t *testing.T) {
		rls.Freeze(t) // returns once the service is certainly stopped
		var frozen atomic.Bool
		frozen.Store(true)
		defer func() { frozen.Store(false); rls.Thaw() }()
		check(t, "frozen", 3, frozen.Load)
	})
	t.Run("service down", func(t *testing.T) {
		rls.Stop()
		check(t, "down", 4, nil)
	})
}

// TestFleetClientLeavesWhilePaused: a client leaves while its request is
// paused for the service's answer (the service frozen), then the answer
// arrives: an admission, an OVER_LIMIT, or the call's timeout. The built
// module forgets the call when the stream ends: nothing is continued or
// answered on the gone stream (wasmhost counts stray continues), no rule
// counts a decision for it, no error is counted, and the proxy goes on
// deciding. The service did decide the gone request: its token is spent.
func TestFleetClientLeavesWhilePaused(t *testing.T) {
	// A call timeout far longer than a client's request takes to be
	// abandoned and the service thawed, however loaded the machine: only
	// the last case waits for it to fire (with the service still frozen).
	cfg := fleetRule("left", "cluster", 0.001, 2, "allow", 5000)
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, cfg, redis.Addr)
	h, srv := startClusterHost(t, cfg, rlsBootstrap(rls.Addr), 1)
	waitInFlight := func(t *testing.T, streams, callouts int) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			s, c := h.InFlight()
			if s == streams && c == callouts {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("in flight: %d streams, %d callouts; want %d and %d", s, c, streams, callouts)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// leave sends a request that the client abandons while the service
	// is frozen, and waits until the host has ended its stream with the
	// call still pending.
	leave := func(t *testing.T, key string) {
		t.Helper()
		rls.Freeze(t)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/", nil)
		req.Header.Set("x-api-key", key)
		done := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				err = fmt.Errorf("answered %d while the service was frozen", resp.StatusCode)
			}
			done <- err
		}()
		waitInFlight(t, 1, 1) // paused on the call
		cancel()
		if err := <-done; err == nil || !strings.Contains(err.Error(), "context canceled") {
			t.Fatalf("the client's request: %v, want it cancelled", err)
		}
		waitInFlight(t, 0, 1) // the stream ended; the call has not reported
	}
	counters := func() [4]uint64 {
		rlsErrors, _ := h.Metric("tokengate.rls_errors")
		return [4]uint64{metric(t, h, "left", "allowed"), metric(t, h, "left", "rejected"), metric(t, h, "left", "fail_open"), rlsErrors}
	}
	send := func(key string) int {
		resp, _ := getURL(t, srv.URL+"/", map[string]string{"x-api-key": key})
		return resp.StatusCode
	}

	t.Run("admitted after the client left", func(t *testing.T) {
		leave(t, "k1")
		rls.Thaw()
		waitInFlight(t, 0, 0) // the answer was reported to the filter
		if got := counters(); got != [4]uint64{} {
			t.Errorf("allowed, rejected, fail_open, rls_errors = %v after an answer for a gone stream, want none", got)
		}
		// The service took the gone request's token: one of burst 2 left.
		if codes := []int{send("k1"), send("k1")}; !slices.Equal(codes, []int{200, 429}) {
			t.Errorf("k1 after: %v, want [200 429]", codes)
		}
	})
	t.Run("OVER_LIMIT after the client left", func(t *testing.T) {
		before := counters()
		leave(t, "k1") // k1 is spent: the service answers OVER_LIMIT
		rls.Thaw()
		waitInFlight(t, 0, 0)
		if got := counters(); got != before {
			t.Errorf("counters %v -> %v for a rejection of a gone stream, want unchanged", before, got)
		}
		if code := send("k2"); code != http.StatusOK {
			t.Errorf("a new key after: %d", code)
		}
	})
	t.Run("timeout after the client left", func(t *testing.T) {
		before := counters()
		leave(t, "k3")
		waitInFlight(t, 0, 0) // still frozen: the call's 5 s timeout reports
		rls.Thaw()
		if got := counters(); got != before {
			t.Errorf("counters %v -> %v for a failed call of a gone stream, want unchanged (no rls_error, no fail_open)", before, got)
		}
	})
	if n := h.StrayContinues(); n != 0 {
		t.Errorf("%d stray continues", n)
	}
	if s, c := h.InFlight(); s != 0 || c != 0 {
		t.Errorf("left in flight: %d streams, %d callouts", s, c)
	}
}
