package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Delayed admission through the built module on the wazero host. Most tests
// run on a fake clock with the host's own ticks off: the test moves time in
// steps and calls proxy_on_tick itself (Host.Tick), so "never early" is
// exact and nothing depends on the machine's speed. The upstream stamps
// each request with the fake time it arrived at; time moves on only once
// the requests a step may release have arrived.

// delayCfg is nginx's "rate=10r/s burst=5" (no nodelay): one request at
// once, five held 100 ms apart.
const delayCfg = `{"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5%s}}`

// arrival is one request the upstream received.
type arrival struct {
	id   int
	at   time.Duration // fake time since the start
	sum  [32]byte      // SHA-256 of the body
	size int
}

// delayRig is a host on a fake clock with a recording upstream.
type delayRig struct {
	t     *testing.T
	h     *wasmhost.Host
	srv   *httptest.Server
	clk   *wasmhost.FakeClock
	start time.Time

	// tickDue makes step fire only the ticks Envoy's per-root timers
	// would (Host.TickDue), instead of ticking every root that has a
	// period (Host.Tick).
	tickDue bool

	mu       sync.Mutex
	arrivals []arrival
	results  map[int]result
}

// result is what a client got.
type result struct {
	status int
	retry  string
	rule   string // x-tokengate-rule
}

// newDelayRig starts the module on workers VMs with cfg; mods adjust the
// host's and the proxy's options (faults, observers, the pause timeout)
// before it starts.
func newDelayRig(t *testing.T, cfg string, workers int, mods ...func(*wasmhost.Options, *proxy.Options)) *delayRig {
	t.Helper()
	r := &delayRig{t: t, clk: wasmhost.NewFakeClock(t0), start: t0, results: map[int]result{}}
	opts := hostOpts(cfg, false, workers, r.clk, nil)
	opts.DisableTicks = true
	popts := proxy.Options{PauseTimeout: 20 * time.Second}
	for _, m := range mods {
		m(&opts, &popts)
	}
	popts.Upstream = http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		id, _ := strconv.Atoi(req.Header.Get("x-id"))
		r.mu.Lock()
		r.arrivals = append(r.arrivals, arrival{id: id, at: r.clk.Now().Sub(r.start), sum: sha256.Sum256(b), size: len(b)})
		r.mu.Unlock()
	})
	r.h, r.srv = startHost(t, opts, popts)
	return r
}

// send starts request id (a GET, or a POST of body) in the background; ctx
// may cancel it.
func (r *delayRig) send(ctx context.Context, id int, body []byte) {
	method, rd := http.MethodGet, io.Reader(nil)
	if body != nil {
		method, rd = http.MethodPost, bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.srv.URL+"/", rd)
	if err != nil {
		r.t.Fatal(err)
	}
	req.Header.Set("x-id", strconv.Itoa(id))
	go func() {
		res := result{status: -1}
		if resp, err := r.srv.Client().Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			res = result{status: resp.StatusCode, retry: resp.Header.Get("Retry-After"), rule: resp.Header.Get("X-Tokengate-Rule")}
		}
		r.mu.Lock()
		r.results[id] = res
		r.mu.Unlock()
	}()
}

// metric returns a filter counter summed over the workers.
func (r *delayRig) metric(name string) uint64 {
	v, _ := r.h.Metric("tokengate.rule.g." + name)
	return v
}

// until waits for cond, at most 30 s (a bound for a hang, not a speed).
func (r *delayRig) until(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// decided waits until n requests have been decided: answered, or held.
func (r *delayRig) decided(n int) {
	r.t.Helper()
	r.until(strconv.Itoa(n)+" decisions", func() bool {
		r.mu.Lock()
		got := len(r.results)
		r.mu.Unlock()
		return got+int(r.metric("delayed")) >= n
	})
}

// sendInOrder sends requests 1..n one after the other, each once the one
// before has been decided, so that admission order is id order.
func (r *delayRig) sendInOrder(n int) {
	r.t.Helper()
	for id := 1; id <= n; id++ {
		r.send(context.Background(), id, nil)
		r.decided(id)
	}
}

func (r *delayRig) snapshot() ([]arrival, map[int]result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.arrivals), func() map[int]result {
		m := map[int]result{}
		for k, v := range r.results {
			m[k] = v
		}
		return m
	}()
}

// step moves the fake clock by d and ticks every worker.
func (r *delayRig) step(d time.Duration) {
	r.t.Helper()
	r.clk.Advance(d)
	var err error
	if r.tickDue {
		_, err = r.h.TickDue()
	} else {
		err = r.h.Tick()
	}
	if err != nil {
		r.t.Fatal(err)
	}
}

// settle waits until no new request has reached the upstream for 5 ms, so
// that releases are stamped with the step that made them.
func (r *delayRig) settle() {
	n, quiet := -1, time.Now()
	for time.Since(quiet) < 5*time.Millisecond {
		a, _ := r.snapshot()
		if len(a) != n {
			n, quiet = len(a), time.Now()
		}
		time.Sleep(time.Millisecond)
	}
}

// run steps the clock in 10 ms steps up to total; after each step it waits
// until the requests due by then have arrived (one step of slack for
// rounding), given want(elapsed) = how many may have arrived by elapsed,
// and fails on more: a release before its deadline. It returns once all
// due by total have arrived.
func (r *delayRig) run(total time.Duration, want func(time.Duration) int) {
	r.t.Helper()
	const stepD = 10 * time.Millisecond
	for el := stepD; el <= total; el += stepD {
		r.step(stepD)
		lo := want(el - stepD)
		r.until("arrivals due by "+el.String(), func() bool {
			a, _ := r.snapshot()
			return len(a) >= lo
		})
		time.Sleep(time.Millisecond) // room for an early release to show
		if a, _ := r.snapshot(); len(a) > want(el) {
			r.t.Fatalf("at +%v: %d arrivals, at most %d are due: %+v", el, len(a), want(el), a)
		}
	}
	r.until("arrivals due by the end", func() bool {
		a, _ := r.snapshot()
		return len(a) >= want(total)
	})
}

// TestDelayNginxEquivalence: 10/s, burst 1, max_reserved 5 and 7 requests
// at once, as nginx's limit_req rate=10r/s burst=5 treats them: the first
// goes on at once, the next five are held and reach the upstream in order
// at +100 … +500 ms and never before, the seventh gets a 429 with
// Retry-After 1, and the tick is off once nothing waits.
func TestDelayNginxEquivalence(t *testing.T) {
	r := newDelayRig(t, sprintf(delayCfg, ""), 1)
	r.sendInOrder(7)
	_, res := r.snapshot()
	if res[1].status != 200 || res[7].status != 429 || res[7].retry != "1" || len(res) != 2 {
		t.Fatalf("answered before any tick: %+v; want 1: 200, 7: 429 with Retry-After 1", res)
	}
	if p := r.h.TickPeriod(0); p != 100*time.Millisecond {
		t.Errorf("tick period %v, want 100ms (the earliest deadline)", p)
	}
	r.run(600*time.Millisecond, func(el time.Duration) int { return 1 + min(5, int(el/(100*time.Millisecond))) })
	r.until("all answers", func() bool { _, res := r.snapshot(); return len(res) == 7 })
	arr, res := r.snapshot()
	for k, a := range arr {
		if a.id != k+1 {
			t.Errorf("arrival %d is request %d, want %d (admission order)", k, a.id, k+1)
		}
		if due := time.Duration(k) * 100 * time.Millisecond; a.at < due {
			t.Errorf("request %d arrived at +%v, before its deadline +%v", a.id, a.at, due)
		}
	}
	for id := 2; id <= 6; id++ {
		if res[id].status != 200 {
			t.Errorf("held request %d answered %d", id, res[id].status)
		}
	}
	if p := r.h.TickPeriod(0); p != 0 {
		t.Errorf("tick period %v once nothing waits, want 0", p)
	}
}

// TestDelayReleaseOrderAcrossWorkers: two workers share the bucket, each
// holds the requests it admitted and releases them from its own tick; the
// upstream sees them in admission order, each at or after its deadline.
func TestDelayReleaseOrderAcrossWorkers(t *testing.T) {
	r := newDelayRig(t, sprintf(delayCfg, ""), 2)
	r.sendInOrder(6) // round robin: workers 0, 1, 0, 1, 0, 1
	r.run(600*time.Millisecond, func(el time.Duration) int { return 1 + min(5, int(el/(100*time.Millisecond))) })
	arr, _ := r.snapshot()
	for k, a := range arr {
		if a.id != k+1 || a.at < time.Duration(k)*100*time.Millisecond {
			t.Errorf("arrival %d: request %d at +%v; want request %d at or after +%v", k, a.id, a.at, k+1, time.Duration(k)*100*time.Millisecond)
		}
	}
	if len(arr) != 6 {
		t.Errorf("%d arrivals, want 6", len(arr))
	}
}

// TestDelayRateBoundEveryWindow: under a steady stream of requests faster
// than the rate, what reaches the upstream never exceeds burst + rate ×
// window in any window (with one 10 ms step of release lateness).
func TestDelayRateBoundEveryWindow(t *testing.T) {
	const rate, burst = 10.0, 2.0
	r := newDelayRig(t, `{"name":"g","algorithm_config":{"rps":10,"burst":2,"max_reserved":4}}`, 2)
	id := 0
	for i := range 220 { // 2.2 s in 10 ms steps, a request every 20 ms for 1.5 s
		if i%2 == 0 && id < 75 {
			id++
			r.send(context.Background(), id, nil)
			r.decided(id)
		}
		r.step(10 * time.Millisecond)
		r.settle()
	}
	r.until("every answer", func() bool { _, res := r.snapshot(); return len(res) == id })
	arr, _ := r.snapshot()
	slices.SortFunc(arr, func(a, b arrival) int { return int(a.at - b.at) })
	for i := range arr {
		for j := i; j < len(arr); j++ {
			w := (arr[j].at - arr[i].at).Seconds()
			if n := float64(j - i + 1); n > burst+rate*(w+0.01)+1e-9 {
				t.Fatalf("%v requests in %.3f s (from +%v): over burst + rate × window = %.2f", n, w, arr[i].at, burst+rate*(w+0.01))
			}
		}
	}
	if held := r.metric("delayed"); held < 10 || len(arr) < 15 {
		t.Errorf("%d held, %d through: the test did not exercise the reservation", held, len(arr))
	}
}

// TestDelayClientLeaves: a client that leaves while held is dropped
// (delay_cancelled), never reaches the upstream, and with refund_on_cancel
// its token goes back: the next request waits 100 ms less.
func TestDelayClientLeaves(t *testing.T) {
	r := newDelayRig(t, sprintf(delayCfg, `,"refund_on_cancel":true`), 1)
	r.send(context.Background(), 1, nil)
	r.decided(1)
	ctx, cancel := context.WithCancel(context.Background())
	r.send(ctx, 2, nil)
	r.decided(2)
	r.send(context.Background(), 3, nil) // deadline +200 ms
	r.decided(3)
	cancel()
	r.until("the cancellation", func() bool { return r.metric("delay_cancelled") == 1 })
	r.send(context.Background(), 4, nil) // refunded: +200 ms, not +300 ms
	r.decided(4)
	r.run(300*time.Millisecond, func(el time.Duration) int {
		if el < 200*time.Millisecond {
			return 1
		}
		return 3
	})
	// Request 4 took the refunded token: its deadline is request 3's
	// (+200 ms), not +300 ms; the two go in the same tick.
	arr, _ := r.snapshot()
	ids := []int{}
	for _, a := range arr {
		ids = append(ids, a.id)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []int{1, 3, 4}) {
		t.Errorf("upstream saw %v, want 1, 3 and 4: the cancelled request never goes", ids)
	}
	if p := r.h.TickPeriod(0); p != 0 {
		t.Errorf("tick period %v, want 0", p)
	}
}

// TestDelayLargeBody: a 2 MiB POST is held while its body is still being
// sent (the host reads none of it before the filter decides, as Envoy
// holds it with flow control), reaches the filter's body callback only
// after the tick continued it, and reaches the upstream intact. The
// local host buffers every body for the filter, so its buffer limit
// (Envoy's 1 MiB by default since issue 30) is raised above the body:
// Envoy would stream it past a filter that does not buffer.
func TestDelayLargeBody(t *testing.T) {
	var log callLog
	r := newDelayRig(t, sprintf(delayCfg, ""), 1, func(o *wasmhost.Options, po *proxy.Options) {
		o.Observe = log.observe
		po.BufferLimit = 4 << 20
	})
	body := make([]byte, 2<<20)
	if _, err := rand.Read(body); err != nil {
		t.Fatal(err)
	}
	r.send(context.Background(), 1, nil)
	r.decided(1)
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, r.srv.URL+"/", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("x-id", "2")
	go func() {
		if resp, err := r.srv.Client().Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	r.decided(2) // held before a byte of the body was sent
	go func() {
		_, _ = pw.Write(body)
		pw.Close()
	}()
	r.run(100*time.Millisecond, func(el time.Duration) int { return 1 + int(el/(100*time.Millisecond)) })
	arr, _ := r.snapshot()
	if len(arr) != 2 || arr[1].id != 2 || arr[1].size != len(body) || arr[1].sum != sha256.Sum256(body) {
		t.Fatalf("arrivals %+v: the held POST did not arrive intact", arr)
	}
	post := log.streamOf(2)
	var order []string
	for _, c := range log.all() {
		switch {
		case c.Guest && c.Context == post && c.Name == "proxy_on_request_headers":
			order = append(order, "headers")
			if c.Args[2] != 0 {
				t.Errorf("proxy_on_request_headers end_of_stream %d, want 0: a body follows", c.Args[2])
			}
		case c.Guest && c.Context == post && c.Name == "proxy_on_request_body":
			order = append(order, "body")
			if c.Args[1] != uint64(len(body)) || c.Args[2] != 1 {
				t.Errorf("proxy_on_request_body(%d, eos %d), want the whole body with end_of_stream", c.Args[1], c.Args[2])
			}
		case !c.Guest && c.Context == post && c.Name == "proxy_continue_stream":
			order = append(order, "continue")
		}
	}
	if strings.Join(order, ",") != "headers,continue,body" {
		t.Errorf("callbacks of the POST: %v, want headers, continue, body", order)
	}
}

// TestDelayLimits: beyond max_pending held requests, or a wait beyond
// max_delay_ms, the request gets a 429 and takes nothing.
func TestDelayLimits(t *testing.T) {
	for _, tc := range []struct{ name, extra string }{
		{"max_pending", `,"max_pending":2`},
		{"max_delay_ms", `,"max_delay_ms":250`}, // 100 and 200 ms fit
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newDelayRig(t, sprintf(delayCfg, tc.extra), 1)
			r.sendInOrder(5)
			_, res := r.snapshot()
			if res[1].status != 200 || res[4].status != 429 || res[5].status != 429 || len(res) != 3 {
				t.Fatalf("answers %+v; want 1: 200, 4 and 5: 429, 2 and 3 held", res)
			}
			r.run(200*time.Millisecond, func(el time.Duration) int { return 1 + min(2, int(el/(100*time.Millisecond))) })
			// The 429s took nothing: at +200 ms the balance is 0 again, so
			// request 6 waits 100 ms (300 ms if they had taken tokens).
			r.send(context.Background(), 6, nil)
			r.decided(5)
			r.until("request 6 held", func() bool { return r.metric("delayed") == 3 })
			r.run(100*time.Millisecond, func(el time.Duration) int { return 3 + int(el/(100*time.Millisecond)) })
		})
	}
}

// TestDelayOwnTimer runs on the real clock with the host's own timer
// (restarted whenever the period is set, as Envoy's is) under a load of
// four clients: every held request is eventually released (200) and the
// tick is stopped once nothing waits. It asserts no durations: the fake
// clock tests (TestDelayNotStarvedUnderLoad) count releases against time.
func TestDelayOwnTimer(t *testing.T) {
	opts := wasmhost.Options{PluginConfig: []byte(`{"name":"g","algorithm_config":{"rps":20,"burst":1,"max_reserved":10}}`),
		Workers: 2}
	h, srv := startHost(t, opts, proxy.Options{PauseTimeout: 20 * time.Second})
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				resp, err := srv.Client().Get(srv.URL + "/")
				if err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				resp.Body.Close()
				mu.Lock()
				statuses[resp.StatusCode]++
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	held, _ := h.Metric("tokengate.rule.g.delayed")
	if held == 0 || statuses[200]+statuses[429] != 100 || uint64(statuses[200]) < held {
		t.Errorf("statuses %v with %d held: every request must end 200 or 429, the held ones 200", statuses, held)
	}
	deadline := time.Now().Add(30 * time.Second)
	for w := range h.Workers() {
		for h.TickPeriod(w) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("worker %d: tick period %v with nothing waiting, want 0", w, h.TickPeriod(w))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// sprintf puts extra fields into a configuration template's %s.
func sprintf(format, extra string) string { return strings.Replace(format, "%s", extra, 1) }
