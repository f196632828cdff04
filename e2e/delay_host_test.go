package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Delayed admission through the built module against host behaviour the
// default host never shows: a refused tick period, a refused
// set_effective_context, Envoy's per-root timers counted call by call, and
// a configuration update that makes a new root context.

// callLog records every ABI call the host sees (Options.Observe).
type callLog struct {
	mu    sync.Mutex
	calls []wasmhost.Call
}

func (l *callLog) observe(c wasmhost.Call) {
	l.mu.Lock()
	l.calls = append(l.calls, c)
	l.mu.Unlock()
}

// all returns the calls so far, in order.
func (l *callLog) all() []wasmhost.Call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wasmhost.Call(nil), l.calls...)
}

// named returns the calls of one callback (guest) or host function.
func (l *callLog) named(name string, guest bool) []wasmhost.Call {
	var out []wasmhost.Call
	for _, c := range l.all() {
		if c.Name == name && c.Guest == guest {
			out = append(out, c)
		}
	}
	return out
}

// continues counts proxy_continue_stream calls per context.
func (l *callLog) continues() map[uint32]int {
	out := map[uint32]int{}
	for _, c := range l.named("proxy_continue_stream", false) {
		out[c.Context]++
	}
	return out
}

// streamOf returns the context id of the n-th stream (from 1) the host
// created, in creation order.
func (l *callLog) streamOf(n int) uint32 {
	for _, c := range l.named("proxy_on_context_create", true) {
		if c.Args[1] == 0 {
			continue // a root context
		}
		if n--; n == 0 {
			return c.Context
		}
	}
	return 0
}

const setTick = "proxy_set_tick_period_milliseconds"

// TestDelayTickRefused: a host that answers proxy_set_tick_period_milliseconds
// with UNIMPLEMENTED (as hosts without timers do) cannot hold a request:
// the one that would wait gets the 429 at once (not a stream timeout),
// naming the reserving rule, with its wait as Retry-After, and takes
// nothing; the module asks the host once and then remembers.
func TestDelayTickRefused(t *testing.T) {
	r := newDelayRig(t, `{"rules":[{"name":"wide","algorithm_config":{"rps":100,"burst":100}},
		{"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5}}]}`, 1, func(o *wasmhost.Options, po *proxy.Options) {
		po.PauseTimeout = time.Minute // a held request would hang the test, not pass it
		o.Fault = func(c wasmhost.Call) (wasmhost.Status, bool) {
			return wasmhost.StatusUnimplemented, c.Name == setTick
		}
	})
	r.sendInOrder(3)
	_, res := r.snapshot()
	if res[1].status != 200 {
		t.Fatalf("request 1: %+v, want 200", res[1])
	}
	for id := 2; id <= 3; id++ {
		if res[id].status != 429 || res[id].retry != "1" || res[id].rule != "g" {
			t.Errorf("request %d: %+v; want 429, Retry-After 1, rule g (the reserving rule)", id, res[id])
		}
	}
	if n := r.h.HostCalls()[setTick]; n != 1 {
		t.Errorf("%d tick period calls, want 1: the module remembers the refusal", n)
	}
	if n := r.metric("delayed"); n != 0 {
		t.Errorf("delayed = %d, want 0", n)
	}
	// The refused requests took nothing: 150 ms later the bucket has its
	// token again and the next request goes at once (it would wait 150 ms
	// if they had kept theirs).
	r.clk.Advance(150 * time.Millisecond)
	r.send(context.Background(), 4, nil)
	r.decided(4)
	if _, res := r.snapshot(); res[4].status != 200 {
		t.Errorf("request 4, 150 ms later: %+v, want 200", res[4])
	}
}

// TestDelayEffectiveContextRefused: when the host refuses
// set_effective_context for a held stream at its deadline, nothing is
// continued in its place (the guest's next call is not a continue), the
// request counts as cancelled and is refunded, and the other held streams
// are released, each continued exactly once.
func TestDelayEffectiveContextRefused(t *testing.T) {
	var log callLog
	var refuse atomic.Uint32
	r := newDelayRig(t, sprintf(delayCfg, `,"refund_on_cancel":true`), 1, func(o *wasmhost.Options, _ *proxy.Options) {
		o.Observe = log.observe
		o.Fault = func(c wasmhost.Call) (wasmhost.Status, bool) {
			return wasmhost.StatusBadArgument, c.Name == "proxy_set_effective_context" && c.Args[0] == uint64(refuse.Load())
		}
	})
	r.send(context.Background(), 1, nil)
	r.decided(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.send(ctx, 2, nil) // held until +100 ms; its context will be refused
	r.decided(2)
	for id := 3; id <= 4; id++ { // held until +200 and +300 ms
		r.send(context.Background(), id, nil)
		r.decided(id)
	}
	gone := log.streamOf(2)
	refuse.Store(gone)
	r.run(300*time.Millisecond, func(el time.Duration) int {
		switch {
		case el < 200*time.Millisecond:
			return 1
		case el < 300*time.Millisecond:
			return 2
		}
		return 3
	})
	calls := log.all()
	refused := 0
	for i, c := range calls {
		if c.Name != "proxy_set_effective_context" || c.Args[0] != uint64(gone) {
			continue
		}
		refused++
		for _, next := range calls[i+1:] {
			if next.Guest {
				continue
			}
			if next.Name == "proxy_continue_stream" {
				t.Errorf("the refused set_effective_context(%d) was followed by a continue of context %d", gone, next.Context)
			}
			break
		}
	}
	if refused != 1 {
		t.Errorf("set_effective_context(%d) called %d times, want once", gone, refused)
	}
	want := map[uint32]int{log.streamOf(3): 1, log.streamOf(4): 1}
	if got := log.continues(); len(got) != 2 || got[log.streamOf(3)] != 1 || got[log.streamOf(4)] != 1 {
		t.Errorf("continues per context %v, want %v: never stream %d", got, want, gone)
	}
	if n := r.metric("delay_cancelled"); n != 1 {
		t.Errorf("delay_cancelled = %d, want 1", n)
	}
	// Refunded: at +300 ms the debt of requests 1, 3 and 4 is paid and the
	// refunded token is there, so a new request goes at once (without the
	// refund it would wait 100 ms).
	r.send(context.Background(), 5, nil)
	r.until("request 5's decision", func() bool { _, res := r.snapshot(); _, ok := res[5]; return ok || r.metric("delayed") == 4 })
	r.run(10*time.Millisecond, func(time.Duration) int { return 4 }) // at once, or held for a rounding error
	// The refused stream stays paused in the host until its client leaves.
	cancel()
	r.until("request 2's end", func() bool { _, res := r.snapshot(); _, ok := res[2]; return ok })
	if got := log.continues()[gone]; got != 0 {
		t.Errorf("stream %d continued %d times after its client left", gone, got)
	}
}

// TestDelayTickCalls: through the module, on Envoy's timer model
// (TickDue): five holds with one earliest deadline set the tick period
// once; the releases, 100 ms apart, keep the period as it is, and the last
// one stops the tick: two calls in all, and exactly five ticks.
func TestDelayTickCalls(t *testing.T) {
	var log callLog
	r := newDelayRig(t, sprintf(delayCfg, ""), 1, func(o *wasmhost.Options, _ *proxy.Options) { o.Observe = log.observe })
	r.tickDue = true
	r.sendInOrder(6)
	if got := log.named(setTick, false); len(got) != 1 || got[0].Args[0] != 100 {
		t.Fatalf("tick period calls after five holds: %+v, want one, of 100 ms", got)
	}
	r.run(600*time.Millisecond, func(el time.Duration) int { return 1 + min(5, int(el/(100*time.Millisecond))) })
	sets := log.named(setTick, false)
	if len(sets) != 2 || sets[1].Args[0] != 0 {
		t.Errorf("tick period calls %+v, want two: 100 ms, then 0 once nothing waits", sets)
	}
	if n := r.h.HostCalls()[setTick]; n != 2 {
		t.Errorf("HostCalls counts %d tick period calls, want 2", n)
	}
	if ticks := log.named("proxy_on_tick", true); len(ticks) != 5 {
		t.Errorf("%d ticks, want 5 (one per release)", len(ticks))
	}
}

// TestDelayNotStarvedUnderLoad: requests arrive every 10 ms (fake time),
// five times the rate, while held ones are due every 50 ms; the host fires
// only the ticks Envoy's timer would (restarted whenever the period is
// set). Releases keep pace with the rate throughout the load, and the
// tick period is set only when the earliest deadline moves, not per
// request.
func TestDelayNotStarvedUnderLoad(t *testing.T) {
	var log callLog
	r := newDelayRig(t, `{"name":"g","algorithm_config":{"rps":20,"burst":1,"max_reserved":10}}`, 1,
		func(o *wasmhost.Options, _ *proxy.Options) { o.Observe = log.observe })
	r.tickDue = true
	const steps = 150 // 1.5 s of load, a request per 10 ms step
	for i := 1; i <= steps; i++ {
		r.send(context.Background(), i, nil)
		r.decided(i)
		r.step(10 * time.Millisecond)
		r.settle()
		// By then the bucket has paid 1 + 20/s × elapsed requests; those
		// held for longer than the reservation (10 tokens, 500 ms) cannot
		// be missing.
		el := time.Duration(i) * 10 * time.Millisecond
		if lo := int(20*(el-500*time.Millisecond).Seconds()) - 1; lo > 0 {
			if a, _ := r.snapshot(); len(a) < lo {
				t.Fatalf("at +%v only %d requests reached the upstream, want >= %d: the tick starved", el, len(a), lo)
			}
		}
	}
	held := r.metric("delayed")
	if held < 20 {
		t.Fatalf("%d held: the load did not exercise the reservation", held)
	}
	for i := 0; i < 60; i++ { // the load is over: the last held go within the reservation's 500 ms
		r.step(10 * time.Millisecond)
	}
	r.until("every answer", func() bool { _, res := r.snapshot(); return len(res) == steps })
	// Which callback set the period: a request's (a new earliest
	// deadline) or a tick's (re-arming after releases).
	inRequest, inTick, ticks := 0, 0, 0
	last := ""
	for _, c := range log.all() {
		switch {
		case c.Guest:
			last = c.Name
			if c.Name == "proxy_on_tick" {
				ticks++
			}
		case c.Name == setTick && last == "proxy_on_tick":
			inTick++
		case c.Name == setTick:
			inRequest++
		}
	}
	// The heap never empties under this load, so only the first hold
	// moved the earliest deadline; a tick re-arms at most once.
	if inRequest != 1 || inTick > ticks {
		t.Errorf("tick period set %d times by requests (want 1: only when the earliest deadline moves) and %d times by %d ticks",
			inRequest, inTick, ticks)
	}
	t.Logf("%d requests, %d held, %d ticks, tick period set %d + %d times", steps, held, ticks, inRequest, inTick)
}

// TestDelayReloadNewRoot: a configuration update while requests are held
// makes a new root context (as Envoy does): the held requests stay with
// the old root, which releases them on time from its own tick and is then
// shut down; a new request follows the new configuration (5/s: it waits
// 600 ms) and is released by the new root.
func TestDelayReloadNewRoot(t *testing.T) {
	var log callLog
	r := newDelayRig(t, sprintf(delayCfg, ""), 1, func(o *wasmhost.Options, _ *proxy.Options) { o.Observe = log.observe })
	r.tickDue = true
	r.sendInOrder(3) // 2 and 3 held until +100 and +200 ms under root 1
	if err := r.h.Reconfigure([]byte(`{"name":"g","algorithm_config":{"rps":5,"burst":1,"max_reserved":5}}`)); err != nil {
		t.Fatal(err)
	}
	roots := r.h.Roots(0)
	if len(roots) != 2 || !roots[0].Retired || roots[0].Streams != 2 || roots[0].TickPeriod != 100*time.Millisecond {
		t.Fatalf("roots after the update: %+v; want the old root retired with its 2 held streams and its 100ms tick", roots)
	}
	oldRoot, newRoot := roots[0].ID, roots[1].ID
	r.send(context.Background(), 4, nil)
	r.decided(4)
	if roots := r.h.Roots(0); roots[1].TickPeriod != 600*time.Millisecond || roots[1].Streams != 1 {
		t.Fatalf("new root %+v, want request 4 held there for 600 ms", roots[1])
	}
	r.run(600*time.Millisecond, func(el time.Duration) int {
		switch {
		case el < 100*time.Millisecond:
			return 1
		case el < 200*time.Millisecond:
			return 2
		case el < 600*time.Millisecond:
			return 3
		}
		return 4
	})
	arr, _ := r.snapshot()
	if len(arr) != 4 || arr[1].id != 2 || arr[2].id != 3 || arr[3].id != 4 || arr[3].at < 600*time.Millisecond {
		t.Errorf("arrivals %+v; want 2 at +100 ms, 3 at +200 ms, 4 at +600 ms", arr)
	}
	byRoot := map[uint32][]uint32{}
	for _, c := range log.named("proxy_continue_stream", false) {
		byRoot[c.Root] = append(byRoot[c.Root], c.Context)
	}
	if got := byRoot[oldRoot]; len(got) != 2 || got[0] != log.streamOf(2) || got[1] != log.streamOf(3) {
		t.Errorf("the old root %d continued %v, want requests 2 and 3", oldRoot, got)
	}
	if got := byRoot[newRoot]; len(got) != 1 || got[0] != log.streamOf(4) {
		t.Errorf("the new root %d continued %v, want request 4", newRoot, got)
	}
	r.until("the old root's shutdown", func() bool { return len(r.h.Roots(0)) == 1 })
	deleted := false
	for _, c := range log.named("proxy_on_delete", true) {
		deleted = deleted || c.Context == oldRoot
	}
	if !deleted {
		t.Errorf("root %d was never deleted", oldRoot)
	}
}
