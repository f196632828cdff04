package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// The lease tests run the built module in three local hosts (three
// proxies, two worker VMs each) with a lease-mode rule decided by one
// tokengate-rls on a real redis-server (docs/lease.md).

type leaseFleet struct {
	redis   *redistest.Server
	rls     *rlsProc
	hosts   []*wasmhost.Host
	proxies []*httptest.Server
}

// The call timeout is generous: a request that waits for its proxy's next
// refill gets on_error after lease_tick_ms + timeout_ms, and on a loaded
// machine a tick and its call can take longer than the half second these
// tests had, which turned admissions into 503s. A grant must outlive
// twice the tick plus the timeout, hence the ttl.
const leaseTickMs, leaseTimeoutMs, leaseTTLMs = 50, 2000, 3000

// leaseRule is a lease-mode rule keyed by x-api-key.
func leaseRule(rps, burst float64, leaseMax int, onError string) string {
	return `{"rules":[{"name":"lease","scope":"cluster","mode":"lease","lease_max":` + strconv.Itoa(leaseMax) +
		`,"lease_ttl_ms":` + strconv.Itoa(leaseTTLMs) + `,"limit_keys":["header:x-api-key"],
	  "algorithm_config":{"rps":` + strconv.FormatFloat(rps, 'f', -1, 64) + `,"burst":` + strconv.FormatFloat(burst, 'f', -1, 64) + `}}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":` + strconv.Itoa(leaseTimeoutMs) + `,"lease_tick_ms":` + strconv.Itoa(leaseTickMs) + `,"on_error":"` + onError + `"}}}`
}

func startLeaseFleet(t *testing.T, cfg string) *leaseFleet {
	t.Helper()
	return startLeaseFleetN(t, cfg, 3)
}

// startLeaseFleetN is startLeaseFleet with n proxies.
func startLeaseFleetN(t *testing.T, cfg string, n int) *leaseFleet {
	t.Helper()
	f := &leaseFleet{redis: redistest.Start(t)}
	// startTokengateRLS's generous Redis timeout: on a loaded machine a
	// Redis round trip can take longer than the product's 25 ms, and must
	// not turn into on_error answers here.
	f.rls = startTokengateRLS(t, cfg, f.redis.Addr)
	for range n {
		h, srv := startClusterHost(t, cfg, rlsBootstrap(f.rls.Addr), 2)
		f.hosts = append(f.hosts, h)
		f.proxies = append(f.proxies, srv)
	}
	return f
}

func (f *leaseFleet) send(t testing.TB, i int, key string) int {
	t.Helper()
	resp, _ := getURL(t, f.proxies[i].URL+"/", map[string]string{"x-api-key": key})
	return resp.StatusCode
}

// kill stops proxy i as a crash would: its VMs and their ticks are gone,
// whatever they held.
func (f *leaseFleet) kill(i int) {
	f.proxies[i].Close()
	_ = f.hosts[i].Close(context.Background())
}

// rlsRequests returns the ShouldRateLimit calls tokengate-rls answered.
func (f *leaseFleet) rlsRequests(t testing.TB) float64 {
	t.Helper()
	_, body := getURL(t, "http://"+f.rls.Admin+"/metrics", nil)
	n := 0.0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "tokengate_rls_requests_total{") {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += v
		}
	}
	return n
}

func (f *leaseFleet) leaseCalls() uint64 {
	var n uint64
	for _, h := range f.hosts {
		v, _ := h.Metric("tokengate.lease_calls")
		n += v
	}
	return n
}

// counts tallies answers, and keeps when each admitted request was sent
// and answered.
type counts struct {
	ok, over, unavailable, other atomic.Int64

	mu                  sync.Mutex
	admitted            []span
	firstSend, lastSend time.Time
}

// span is one request's send and answer times.
type span struct{ sent, done time.Time }

func (c *counts) add(code int) { c.addSpan(code, time.Time{}, time.Time{}) }

func (c *counts) addSpan(code int, sent, done time.Time) {
	switch code {
	case http.StatusOK:
		c.ok.Add(1)
	case http.StatusTooManyRequests:
		c.over.Add(1)
	case http.StatusServiceUnavailable:
		c.unavailable.Add(1)
	default:
		c.other.Add(1)
	}
	if sent.IsZero() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if code == http.StatusOK {
		c.admitted = append(c.admitted, span{sent, done})
	}
	if c.firstSend.IsZero() || sent.Before(c.firstSend) {
		c.firstSend = sent
	}
	if sent.After(c.lastSend) {
		c.lastSend = sent
	}
}

// worstWindow returns, over every window [a, b] from a send to an answer,
// by how much the requests certainly admitted in it (sent at or after a,
// answered by b) exceed burst + rate x (b - a); <= 0 is within the bound.
func (c *counts) worstWindow(rate, burst float64) float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	sp := append([]span(nil), c.admitted...)
	sort.Slice(sp, func(i, j int) bool { return sp[i].sent.Before(sp[j].sent) })
	worst := -burst
	for i := range sp {
		a := sp[i].sent
		// The requests sent from a on, by answer time: the k-th earliest
		// answer b closes a window holding at least k of them.
		var done []time.Time
		for _, x := range sp[i:] {
			done = append(done, x.done)
		}
		sort.Slice(done, func(x, y int) bool { return done[x].Before(done[y]) })
		for k, b := range done {
			worst = max(worst, float64(k+1)-(burst+rate*b.Sub(a).Seconds()))
		}
	}
	return worst
}

// hammer sends requests for key from clients[i] goroutines to proxy i until
// stop, each at most 4000, and returns the elapsed time from the first send
// to the last answer.
func (f *leaseFleet) hammer(t *testing.T, key string, clients []int, d time.Duration, c *counts, during func()) float64 {
	start := time.Now()
	stopAt := start.Add(d)
	var wg sync.WaitGroup
	for p, n := range clients {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 4000 && time.Now().Before(stopAt); k++ {
					sent := time.Now()
					code := f.send(t, p, key)
					c.addSpan(code, sent, time.Now())
				}
			}()
		}
	}
	if during != nil {
		during()
	}
	wg.Wait()
	return time.Since(start).Seconds()
}

// TestLeaseFleetSkewedHotKey: one hot key, from cold, saturated, 90 % of
// the clients on one proxy and 5 % on each other (each client sends its
// next request when the last is answered). In every window the fleet
// admits at most burst + rate x T (the exact-mode bound, checked on the
// client's clock: +1 for the clocks); over the run it admits at least
// burst + rate x T - (N - 1) x lease_max (the wrong rejections the issue
// allows: the other processes' allowances); leases are taken; and once
// the cold start is over, the RLS calls for the key stay within processes
// / tick period, whatever the request rate.
func TestLeaseFleetSkewedHotKey(t *testing.T) {
	const rate, burst, leaseMax, n = 100.0, 100.0, 10, 3
	f := startLeaseFleet(t, leaseRule(rate, burst, leaseMax, "deny"))
	d := 2 * time.Second
	if testing.Short() {
		d = time.Second
	}
	var c counts
	calls0, rls0 := f.leaseCalls(), f.rlsRequests(t)
	// The cold start: the first requests of each process wait for its
	// first lease; the leases then double while granted in full
	// (docs/lease.md). Steady state is counted from half a second in.
	var rlsMid float64
	var tMid time.Time
	f.hammer(t, "hot", []int{18, 1, 1}, d, &c, func() {
		time.Sleep(d / 4)
		rlsMid, tMid = f.rlsRequests(t), time.Now()
	})
	rlsEnd := f.rlsRequests(t)
	steady := (rlsEnd - rlsMid) / time.Since(tMid).Seconds()
	cold := rlsMid - rls0
	calls := f.leaseCalls() - calls0
	span := c.lastSend.Sub(c.firstSend).Seconds()
	got := float64(c.ok.Load())
	lower := burst + rate*span - (n-1)*leaseMax
	worst := c.worstWindow(rate, burst)
	t.Logf("admitted %d, rejected %d, 503 %d, other %d over %.2fs of sending: %.0f below burst + rate x T (bound %d); worst window %+.1f; %d lease calls, %.0f RLS calls in the first %v, then %.1f/s (bound %d/s); %.0f requests/s",
		c.ok.Load(), c.over.Load(), c.unavailable.Load(), c.other.Load(), span, burst+rate*span-got, (n-1)*leaseMax, worst,
		calls, cold, d/4, steady, n*1000/leaseTickMs, float64(c.ok.Load()+c.over.Load())/span)
	if c.other.Load()+c.unavailable.Load() != 0 {
		t.Errorf("%d answers neither 200 nor 429 while the service is up", c.other.Load()+c.unavailable.Load())
	}
	if c.over.Load() == 0 {
		t.Fatal("nothing rejected: the load never exceeded the limit")
	}
	if worst > 1 {
		t.Errorf("a window admitted %.1f more than burst + rate x T (+1): over the limit", worst)
	}
	if got < lower {
		t.Errorf("admitted %v < burst + rate x T - (N-1) x lease_max = %.0f: more wrong rejections than the other processes' allowances explain", got, lower)
	}
	if calls == 0 {
		t.Error("no lease call: the hot key was never leased")
	}
	// Processes / tick period, with 10 % for the ticks' jitter.
	if limit := 1.1 * n * 1000 / leaseTickMs; steady > limit {
		t.Errorf("%.1f RLS calls a second for one key after the cold start, more than processes / tick period (+10 %%): %.0f", steady, limit)
	}
	// The cold start: per process, a first lease and its doublings up to
	// lease_max, the burst in leases of lease_max, and one call per tick.
	coldLimit := n*(2+math.Ceil(math.Log2(leaseMax))) + burst/leaseMax + n*(d/4).Seconds()*1000/leaseTickMs
	if cold > coldLimit {
		t.Errorf("%.0f RLS calls in the cold start (%v), more than %.0f", cold, d/4, coldLimit)
	}
}

// TestLeaseFleetManyKeys: 100 keys, each sent 2 x burst requests spread
// over the proxies: no key is ever admitted more than its burst (the rate
// adds nothing in the test's time).
func TestLeaseFleetManyKeys(t *testing.T) {
	const burst = 4
	f := startLeaseFleet(t, leaseRule(0.001, burst, 2, "deny"))
	const keys = 100
	admitted := make([]atomic.Int64, keys)
	var other atomic.Int64
	var otherCode atomic.Int64
	var wg sync.WaitGroup
	for w := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < keys; k += 12 {
				for r := range 2 * burst {
					switch code := f.send(t, (k+r)%3, "k"+strconv.Itoa(k)); code {
					case http.StatusOK:
						admitted[k].Add(1)
					case http.StatusTooManyRequests:
					default:
						other.Add(1)
						otherCode.Store(int64(code))
					}
				}
			}
		}()
	}
	wg.Wait()
	total := int64(0)
	for k := range admitted {
		if n := admitted[k].Load(); n > burst {
			t.Errorf("key %d: %d admitted, burst %d", k, n, burst)
		}
		total += admitted[k].Load()
	}
	t.Logf("%d keys: %d admitted of %d possible", keys, total, keys*burst)
	if other.Load() != 0 {
		t.Errorf("%d answers neither 200 nor 429 (one was %d)", other.Load(), otherCode.Load())
	}
	if total < keys*burst/2 {
		t.Errorf("only %d of %d admitted", total, keys*burst)
	}
}

// TestLeaseFleetReleasesStrandedTokens: a proxy that stops seeing a key
// gives its allowance back once idle, so another proxy can then spend the
// whole bucket.
func TestLeaseFleetReleasesStrandedTokens(t *testing.T) {
	const burst, leaseMax = 30.0, 15
	f := startLeaseFleet(t, leaseRule(0.001, burst, leaseMax, "deny"))
	var c0 counts
	// Proxy 0 spends part of the bucket (exact calls while it has no
	// allowance), and the demand makes its next tick lease an allowance.
	for range 8 {
		c0.add(f.send(t, 0, "k"))
	}
	// Its next tick leases: wait for the call (not a fixed number of
	// ticks, which a loaded machine may not run in time).
	var v uint64
	for end := time.Now().Add(20 * time.Second); v == 0 && time.Now().Before(end); time.Sleep(time.Millisecond) {
		v, _ = f.hosts[0].Metric("tokengate.lease_calls")
	}
	if c0.ok.Load() == 0 || v == 0 {
		t.Fatalf("proxy 0 admitted %d, made %d lease calls", c0.ok.Load(), v)
	}
	// Wait past the idle release (half the ttl) and a few ticks.
	time.Sleep(time.Duration(leaseTTLMs/2+6*leaseTickMs) * time.Millisecond)
	// Proxy 1 then asks, paced, until the bucket must be empty: it gets
	// the rest, including what proxy 0 gave back.
	var c1 counts
	deadline := time.Now().Add(3 * time.Second)
	for n := 0; n < 80 && time.Now().Before(deadline) && c0.ok.Load()+c1.ok.Load() < int64(burst)+3; n++ {
		c1.add(f.send(t, 1, "k"))
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("proxy 0 admitted %d, then proxy 1 %d: %d of the burst %v", c0.ok.Load(), c1.ok.Load(), c0.ok.Load()+c1.ok.Load(), burst)
	if got := c0.ok.Load() + c1.ok.Load(); got != int64(burst) {
		t.Errorf("admitted %d in all, want exactly the burst %v: stranded tokens not returned (or over)", got, burst)
	}
}

// TestLeaseFleetServiceLost: the service dies mid-run, under a load the
// limit does not reach. Each proxy spends what it holds (some requests sent
// after the service is gone are admitted, at most what a proxy can hold),
// then on_error (deny) answers 503, and nothing is admitted after a
// proxy's first 503; once the allowances have expired, every request gets
// on_error.
func TestLeaseFleetServiceLost(t *testing.T) {
	const rate, burst, leaseMax = 1000.0, 1000.0, 100
	f := startLeaseFleet(t, leaseRule(rate, burst, leaseMax, "deny"))
	type answer struct {
		sent, answered time.Time
		code           int
	}
	answers := make([][]answer, 3)
	var stopped time.Time
	stop := time.Now().Add(700 * time.Millisecond)
	// The senders go on for 700 ms after the kill itself, not after the
	// planned stop: on a loaded machine the kill can come late.
	var killedAt atomic.Int64
	sending := func() bool {
		k := killedAt.Load()
		return k == 0 || time.Now().UnixNano() < k+int64(700*time.Millisecond)
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// About 200 requests a second per proxy: 600 of the 1000.
			for k := 0; k < 1000 && sending(); k++ {
				sent := time.Now()
				code := f.send(t, i, "hot")
				answers[i] = append(answers[i], answer{sent, time.Now(), code})
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	time.Sleep(time.Until(stop))
	// Lost, not shut down: killed, its calls in flight fail.
	_ = f.rls.cmd.Process.Kill()
	stopped = time.Now()
	killedAt.Store(stopped.UnixNano())
	<-f.rls.done
	wg.Wait()
	after := 0
	for i, as := range answers {
		var ok, unavailable, okAfter, okAfter503 int
		seen503 := false
		for _, a := range as {
			switch a.code {
			case http.StatusOK:
				ok++
				if a.sent.After(stopped) {
					okAfter++
					if seen503 {
						okAfter503++
					}
				}
			case http.StatusServiceUnavailable:
				unavailable++
				// Judged by when the answer came, not when the request
				// left: on a loaded machine a request sent before the
				// kill can wait for a lease call that the kill ends.
				if a.answered.Before(stopped) {
					t.Errorf("proxy %d: a 503 answered before the service was killed (sent %v before it)", i, stopped.Sub(a.sent))
				}
				seen503 = true
			default:
				t.Errorf("proxy %d: status %d", i, a.code)
			}
		}
		var last200, first503 time.Duration
		for _, a := range as {
			if a.code == http.StatusOK {
				last200 = a.sent.Sub(stopped)
			} else if a.code == http.StatusServiceUnavailable && first503 == 0 {
				first503 = a.sent.Sub(stopped)
			}
		}
		t.Logf("proxy %d: %d admitted (%d sent after the service was gone), %d 503; last 200 sent at %v, first 503 at %v from the kill (killed %v after the planned stop)",
			i, ok, okAfter, unavailable, last200, first503, stopped.Sub(stop))
		after += okAfter
		if okAfter > 2*leaseMax {
			t.Errorf("proxy %d admitted %d after the service was gone, more than it can hold (lease_max %d, and one grant in flight)", i, okAfter, leaseMax)
		}
		if okAfter503 > 0 {
			t.Errorf("proxy %d admitted %d requests after its first 503: on_error must come after what it holds, not before", i, okAfter503)
		}
		if unavailable == 0 {
			t.Errorf("proxy %d: no 503 after the service died: on_error never applied", i)
		}
	}
	if after == 0 {
		t.Error("no request admitted after the service was gone: the proxies did not spend what they held")
	}
	// Once the allowances have expired, every request gets on_error.
	time.Sleep(time.Duration(leaseTTLMs) * time.Millisecond)
	var late counts
	for i := range 3 {
		for range 5 {
			late.add(f.send(t, i, "hot"))
		}
	}
	if late.ok.Load() != 0 || late.unavailable.Load() != 15 {
		t.Errorf("after the allowances expired: %d admitted, %d 503 of 15; want on_error for all", late.ok.Load(), late.unavailable.Load())
	}
}

// TestLeaseFleetKilledProxy: a proxy killed while it holds a lease with
// unspent tokens. While its grant lives, the service keeps counting it:
// the others get at most what the bucket has beyond it. After the grant
// expires its room comes back, and the bucket refills to its full burst
// at the rule's rate (the tokens themselves do not come back: the service
// cannot know how many the dead proxy spent; docs/lease.md).
func TestLeaseFleetKilledProxy(t *testing.T) {
	const rate, burst, leaseMax = 20.0, 40.0, 20
	f := startLeaseFleet(t, leaseRule(rate, burst, leaseMax, "deny"))
	start := time.Now()
	// Proxy 0 builds demand until it holds unspent leased tokens.
	var c0 counts
	held := 0.0
	for k := 0; k < 30 && held < 1; k++ {
		c0.add(f.send(t, 0, "k"))
		time.Sleep(5 * time.Millisecond)
		held = allowance(t, f.hosts[0], "tl:lease:k")
	}
	// Its grants at the service: "id,amount,expiry;...".
	var amount, expiry float64
	fields := f.redis.MustDo("HGETALL", "tl:{lease:k}").([]any)
	for i := 0; i+1 < len(fields); i += 2 {
		if k := fields[i].(string); strings.HasPrefix(k, "h:") {
			for _, g := range strings.Split(fields[i+1].(string), ";") {
				parts := strings.Split(g, ",")
				a, _ := strconv.ParseFloat(parts[1], 64)
				e, _ := strconv.ParseFloat(parts[2], 64)
				amount, expiry = amount+a, max(expiry, e)
			}
		}
	}
	f.kill(0)
	killed := time.Now()
	t.Logf("proxy 0 admitted %d, holds %v unspent; the service counts %v held by it until %.3f s from now",
		c0.ok.Load(), held, amount, expiry-float64(killed.UnixNano())/1e9)
	if held < 1 || amount < held {
		t.Fatalf("proxy 0 holds %v unspent tokens and the service counts %v: the test needs a live lease", held, amount)
	}
	// At once: proxy 1 drains the bucket. The dead proxy's unspent tokens
	// are out of reach: the fleet's total stays within the burst, plus the
	// refill, less what the dead proxy holds.
	drain := func() (int64, float64) {
		var c counts
		var wg sync.WaitGroup
		t0 := time.Now()
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 20 {
					c.add(f.send(t, 1, "k"))
				}
			}()
		}
		wg.Wait()
		return c.ok.Load(), time.Since(t0).Seconds()
	}
	c1, d1 := drain()
	elapsed := time.Since(start).Seconds()
	t.Logf("right after the kill, proxy 1 admitted %d in %.2fs (the fleet %d in %.2fs; limit %.0f without the dead proxy's %v)",
		c1, d1, c0.ok.Load()+c1, elapsed, burst+rate*elapsed, held)
	if float64(c0.ok.Load()+c1) > burst+rate*elapsed-held+1 {
		t.Errorf("the fleet admitted %d: the dead proxy's %v unspent tokens were spent again", c0.ok.Load()+c1, held)
	}
	// After the grant's expiry and the time to refill the whole burst (the
	// room it held refills only from its expiry), the burst is there.
	wait := time.Until(time.Unix(0, int64(expiry*1e9))) + time.Duration(burst/rate*float64(time.Second)) + 500*time.Millisecond
	time.Sleep(wait)
	c2, d2 := drain()
	t.Logf("after expiry and refill, proxy 1 admitted %d of 80 in %.2fs (burst %v)", c2, d2, burst)
	if float64(c2) < burst || float64(c2) > burst+rate*d2+1 {
		t.Errorf("proxy 1 admitted %d, want the burst %v (+ the refill while draining): the dead proxy's room did not come back", c2, burst)
	}
}

// allowance returns the unspent tokens of a lease record in host h's
// shared data (the first field of "tokens:expiry:grant:..."), 0 if none
// or expired.
func allowance(t *testing.T, h *wasmhost.Host, key string) float64 {
	t.Helper()
	v, _, st := h.Store().Get(key)
	if st != wasmhost.StatusOK {
		return 0
	}
	fs := strings.Split(string(v), ":")
	if len(fs) < 2 {
		t.Fatalf("lease record %q", v)
	}
	tokens, _ := strconv.ParseFloat(fs[0], 64)
	expiry, _ := strconv.ParseFloat(fs[1], 64)
	if float64(time.Now().UnixNano())/1e9 >= expiry {
		return 0
	}
	return tokens
}

// TestLeaseFleetLowRate: a low-rate limit (10 a minute) with requests
// alternating over the three proxies, each proxy seeing one every few
// refill periods. No proxy holds a token it does not use (each request is
// an exact take of its own), so the fleet admits exactly the burst before
// its first 429, never more than burst + rate x T, and every 429 comes
// once the bucket is spent; afterwards no proxy holds tokens and the
// service records no grant.
func TestLeaseFleetLowRate(t *testing.T) {
	const rate, burst = 10.0 / 60, 10.0
	f := startLeaseFleet(t, leaseRule(rate, burst, 5, "deny"))
	start := time.Now()
	var codes []int
	for k := range 16 {
		codes = append(codes, f.send(t, k%3, "slow"))
		// Each proxy sees a request every three of these: well past its
		// refill period, so its demand is never one a lease serves.
		time.Sleep(2 * leaseTickMs * time.Millisecond / 3)
	}
	elapsed := time.Since(start).Seconds()
	admitted, first429 := 0, -1
	for k, c := range codes {
		switch c {
		case http.StatusOK:
			admitted++
			if first429 >= 0 {
				// Only a token refilled since could admit it.
				if float64(admitted) > burst+rate*elapsed {
					t.Errorf("request %d admitted after a 429: %d admitted in %.2fs, over burst + rate x T", k, admitted, elapsed)
				}
			}
		case http.StatusTooManyRequests:
			if first429 < 0 {
				first429 = k
			}
		default:
			t.Errorf("request %d: status %d", k, c)
		}
	}
	t.Logf("codes %v: %d admitted in %.2fs, first 429 at request %d; %d lease-mode calls", codes, admitted, elapsed, first429, f.leaseCalls())
	if first429 != int(burst) {
		t.Errorf("first 429 at request %d, want %v: the fleet admits exactly the burst before the bucket is spent", first429, burst)
	}
	if float64(admitted) > burst+rate*elapsed {
		t.Errorf("%d admitted in %.2fs: over burst + rate x T", admitted, elapsed)
	}
	// One take per admitted request, and one refused take per proxy: then
	// it knows the bucket empty until its retry time and answers 429
	// without a call.
	if n := f.leaseCalls(); n < uint64(admitted) || n > uint64(admitted+len(f.hosts)) {
		t.Errorf("%d calls for %d admitted requests, want one take each and at most one refused take per proxy", n, admitted)
	}
	// Nothing held: no allowance in any proxy, no grant at the service.
	for i, h := range f.hosts {
		if a := allowance(t, h, "tl:lease:slow"); a != 0 {
			t.Errorf("proxy %d holds %v tokens", i, a)
		}
	}
	fields := f.redis.MustDo("HGETALL", "tl:{lease:slow}").([]any)
	for i := 0; i+1 < len(fields); i += 2 {
		if k := fields[i].(string); strings.HasPrefix(k, "h:") && fields[i+1].(string) != "" {
			t.Errorf("the service records grants %s %q: a proxy leased tokens for requests one at a time", k, fields[i+1])
		}
	}
}

// TestLeaseFleetFairShares: three (and four) proxies with equal demand on
// one key: every 20 ms each proxy is sent the same number of requests
// (equal offered load, whatever the machine's speed), far above its fair
// share of the limit. From 1 s in (the burst a full bucket holds goes to
// whoever asks first), each proxy's share of the admissions, by answer
// time, over every 2 s window is within ±25 % of a fair share, none goes a
// second without an admission, and the fleet stays within burst + rate x
// T (+1 for the clocks). Before the service divided the refill among its
// holders one proxy got everything (issue 22: 0/98/0, 23/77/0).
//
// The fleet bound is checked on every run. The shares are measured in
// wall-clock windows of ~25 admissions per proxy, granted in leases of up
// to 10, on a machine whose other tests can hold a proxy's goroutines
// back for a window: a run with a share off is run again on a fresh key,
// up to fairRuns times, and the test fails when none is fair. A service
// that starves a proxy (the defect) is unfair in every run.
func TestLeaseFleetFairShares(t *testing.T) {
	const rate, burst, leaseMax, fairRuns = 60.0, 60.0, 10, 3
	for _, n := range []int{3, 4} {
		t.Run(strconv.Itoa(n)+" proxies", func(t *testing.T) {
			f := startLeaseFleetN(t, leaseRule(rate, burst, leaseMax, "deny"), n)
			var unfair []string
			for run := range fairRuns {
				problem := fairShareRun(t, f, n, "fair"+strconv.Itoa(run), rate, burst)
				if problem == "" {
					return
				}
				t.Logf("run %d: %s", run+1, problem)
				unfair = append(unfair, problem)
			}
			t.Errorf("unfair in all %d runs: %s", fairRuns, strings.Join(unfair, "; "))
		})
	}
}

// fairShareRun is one run of TestLeaseFleetFairShares on key: it fails t
// when the fleet goes over its bound or answers other than 200/429, and
// returns what was unfair ("" when every window was fair).
func fairShareRun(t *testing.T, f *leaseFleet, n int, key string, rate, burst float64) string {
	t.Helper()
	// 50 requests a second per proxy, 2.5 to 3.3 times its fair share.
	const perTick, tick, run = 1, 20 * time.Millisecond, 5 * time.Second
	type answer struct {
		proxy int
		done  time.Time
	}
	var mu sync.Mutex
	var admitted []answer
	var c counts
	var wg sync.WaitGroup
	start := time.Now()
	// At most run / tick ticks, each sending perTick requests to every
	// proxy.
	for k := 0; k < int(run/tick) && time.Since(start) < run; k++ {
		for p := range n {
			for range perTick {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sent := time.Now()
					code := f.send(t, p, key)
					done := time.Now()
					c.addSpan(code, sent, done)
					if code == http.StatusOK {
						mu.Lock()
						admitted = append(admitted, answer{p, done})
						mu.Unlock()
					}
				}()
			}
		}
		time.Sleep(time.Until(start.Add(time.Duration(k+1) * tick)))
	}
	wg.Wait()
	end := time.Since(start)
	if c.other.Load()+c.unavailable.Load() != 0 {
		t.Errorf("%d answers neither 200 nor 429 while the service is up", c.other.Load()+c.unavailable.Load())
	}
	worst := c.worstWindow(rate, burst)
	if worst > 1 {
		t.Errorf("a window admitted %.1f more than burst + rate x T (+1): over the limit", worst)
	}
	if c.over.Load() == 0 {
		t.Fatal("nothing rejected: the load never exceeded the limit")
	}
	in := func(p int, a, b time.Duration) int {
		k := 0
		for _, x := range admitted {
			if d := x.done.Sub(start); x.proxy == p && d >= a && d < b {
				k++
			}
		}
		return k
	}
	totals := make([]int, n)
	for _, x := range admitted {
		totals[x.proxy]++
	}
	t.Logf("%d proxies, key %s: admitted %v, %d rejected, over %v; worst window %+.1f",
		n, key, totals, c.over.Load(), end.Round(time.Millisecond), worst)
	for a := time.Second; a+2*time.Second <= end; a += 250 * time.Millisecond {
		got, sum := make([]int, n), 0
		for p := range n {
			got[p] = in(p, a, a+2*time.Second)
			sum += got[p]
		}
		fair := float64(sum) / float64(n)
		for p := range n {
			if off := math.Abs(float64(got[p])-fair) / fair; off > 0.25 {
				return "2 s window from " + a.String() + ": admissions " + fmt.Sprint(got) +
					", fair share " + strconv.FormatFloat(fair, 'f', 1, 64) + " each: more than 25 % off"
			}
		}
	}
	for p := range n {
		for a := time.Second; a+time.Second <= end; a += 250 * time.Millisecond {
			if in(p, a, a+time.Second) == 0 {
				return "proxy " + strconv.Itoa(p) + " admitted nothing from " + a.String() + " to " + (a + time.Second).String()
			}
		}
	}
	return ""
}
