package filter_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
)

// nginxCfg is nginx's "limit_req zone=... rate=10r/s; limit_req burst=5;"
// (no nodelay) in tokengate's terms: one request at once, five more held
// 100 ms apart.
const nginxCfg = `{"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5%s}}`

func delayFixture(t *testing.T, extra string) *fixture {
	t.Helper()
	return newFixture(t, strings.Replace(nginxCfg, "%s", extra, 1))
}

// TestDelayNginxEquivalence: 7 requests at once against 10/s, burst 1,
// max_reserved 5: the first goes on, the next five are held and released
// one by one at +100 ms … +500 ms, in order and never before their
// deadline, and the seventh gets a 429 whose Retry-After counts the time
// until it would fit the reservation.
func TestDelayNginxEquivalence(t *testing.T) {
	f := delayFixture(t, "")
	var ids []uint32
	for i := 1; i <= 7; i++ {
		_, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
		switch {
		case i == 1:
			if res.RequestAction != filter.Continue || res.Local != nil {
				t.Fatalf("request 1: action %v, reply %+v; want it through at once", res.RequestAction, res.Local)
			}
		case i <= 6:
			if res.RequestAction != filter.Pause || res.Local != nil {
				t.Fatalf("request %d: action %v, reply %+v; want it held", i, res.RequestAction, res.Local)
			}
			ids = append(ids, uint32(i))
		default:
			if res.Status() != 429 || res.Header("retry-after") != "1" {
				t.Fatalf("request 7: status %d, retry-after %q; want 429 after 1 s", res.Status(), res.Header("retry-after"))
			}
		}
	}
	if got := f.p.Waiting(); got != 5 {
		t.Fatalf("%d waiting, want 5", got)
	}
	if got := f.h.TickPeriods; !slices.Equal(got, []uint32{100}) {
		t.Fatalf("tick periods %v, want [100]: set once, for the earliest deadline", got)
	}
	var released []uint32
	for k := 1; k <= 5; k++ {
		deadline := epoch + float64(k)/10
		f.now = deadline - 1e-6
		if got := f.h.Tick(f.p); len(got) != 0 {
			t.Fatalf("tick 1 µs before +%d00 ms released %v: early", k, got)
		}
		f.now = deadline
		got := f.h.Tick(f.p)
		if len(got) != 1 {
			t.Fatalf("tick at +%d00 ms released %v, want one stream", k, got)
		}
		released = append(released, got...)
	}
	if !slices.Equal(released, ids) {
		t.Errorf("released %v, want %v (admission order)", released, ids)
	}
	if p := f.h.TickPeriod(); p != 0 || f.p.TickPeriod() != 0 {
		t.Errorf("tick period %d after the last release, want 0", p)
	}
	if got := f.counter("g", filter.CounterDelayed); got != 5 {
		t.Errorf("delayed = %d, want 5", got)
	}
	if got := f.counter("g", filter.CounterRejected); got != 1 {
		t.Errorf("rejected = %d, want 1", got)
	}
	// Released requests are never re-checked: the bucket is where the six
	// admissions left it, refilled by 0.5 s.
	if tokens, _ := f.state("tb:g:"); tokens != -5 {
		t.Errorf("stored %v tokens, want -5: the balance, in debt by max_reserved 5", tokens)
	}
}

// TestDelayTickOnlyWhenEarliestMoves: requests joining behind the earliest
// deadline leave the tick alone; one that comes first re-arms it.
func TestDelayTickOnlyWhenEarliestMoves(t *testing.T) {
	f := newFixture(t, `{"rules":[
		{"name":"slow","match":{"header:x-r":"slow"},"algorithm_config":{"rps":1,"burst":1,"max_reserved":5}},
		{"name":"fast","match":{"header:x-r":"fast"},"algorithm_config":{"rps":100,"burst":1,"max_reserved":5}}]}`)
	for range 4 {
		f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000", "x-r", "slow"))
	}
	if got := f.h.TickPeriods; !slices.Equal(got, []uint32{1000}) {
		t.Fatalf("tick periods %v, want [1000]", got)
	}
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000", "x-r", "fast"))
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000", "x-r", "fast"))
	if got := f.h.TickPeriods; !slices.Equal(got, []uint32{1000, 10}) {
		t.Fatalf("tick periods %v, want [1000 10]: re-armed for the earlier deadline", got)
	}
	f.now = epoch + 0.01
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{6}) {
		t.Fatalf("tick at +10 ms released %v, want [6]", got)
	}
	if p := f.h.TickPeriod(); p != 990 {
		t.Errorf("tick period %d after the fast release, want 990 (to the slow deadline)", p)
	}
}

// TestDelayClientLeaves: a held request whose client leaves is dropped from
// the heap, never continued, and refunded when refund_on_cancel says so;
// the tick follows the new earliest deadline.
func TestDelayClientLeaves(t *testing.T) {
	for _, refund := range []bool{false, true} {
		name := "kept"
		extra := ""
		if refund {
			name, extra = "refunded", `,"refund_on_cancel":true`
		}
		t.Run(name, func(t *testing.T) {
			f := delayFixture(t, extra)
			f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
			s2, _ := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
			f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
			before, _ := f.state("tb:g:")
			f.h.End(s2, 2)
			if got := f.p.Waiting(); got != 1 {
				t.Fatalf("%d waiting after the client left, want 1", got)
			}
			if got := f.h.TickPeriod(); got != 200 {
				t.Errorf("tick period %d, want 200: re-armed for the next deadline", got)
			}
			after, _ := f.state("tb:g:")
			want := before
			if refund {
				want++
			}
			if after != want {
				t.Errorf("stored %v tokens after the client left (before %v), want %v", after, before, want)
			}
			if got := f.counter("g", filter.CounterDelayCancelled); got != 1 {
				t.Errorf("delay_cancelled = %d, want 1", got)
			}
			f.now = epoch + 1
			if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{3}) {
				t.Errorf("tick released %v, want only [3]", got)
			}
			if f.p.Waiting() != 0 || f.h.TickPeriod() != 0 {
				t.Errorf("waiting %d, tick %d; want 0, 0", f.p.Waiting(), f.h.TickPeriod())
			}
		})
	}
}

// TestDelayGoneStreamNotContinued: a stream the host has ended but not yet
// deleted when its deadline comes fails set_effective_context and is never
// continued (which would resume whatever context was effective); it counts
// as cancelled and is refunded if asked; the others still go.
func TestDelayGoneStreamNotContinued(t *testing.T) {
	f := delayFixture(t, `,"refund_on_cancel":true`)
	for range 4 {
		f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	}
	f.h.Gone = map[uint32]bool{3: true}
	f.now = epoch + 0.2
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{2}) {
		t.Errorf("tick at +200 ms continued %v, want [2]", got)
	}
	if got := f.counter("g", filter.CounterDelayCancelled); got != 1 {
		t.Errorf("delay_cancelled = %d, want 1", got)
	}
	// Balance -3 at the start, +2 refilled, +1 refunded.
	if tokens, last := f.state("tb:g:"); tokens != 0 || last != epoch+0.2 {
		t.Errorf("stored %v at %+v, want 0 at +0.2", tokens, last-epoch)
	}
	f.now = epoch + 1
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{4}) {
		t.Errorf("tick at +1 s continued %v, want [4]", got)
	}
	if f.p.Waiting() != 0 {
		t.Errorf("%d waiting, want 0", f.p.Waiting())
	}
}

// TestDelayLimits: max_pending and max_delay_ms turn a request that would
// wait too long, or one too many, into a 429, with its tokens given back.
func TestDelayLimits(t *testing.T) {
	tests := []struct {
		name     string
		extra    string
		held     int // of requests 2..7
		retry    string
		rejected int
		stored   float64 // the balance
	}{
		{name: "max_pending", extra: `,"max_pending":2`, held: 2, retry: "1", rejected: 4, stored: -2},
		// 250 ms at 10/s caps the debt at 2.5 tokens: waits of 100 and 200
		// ms fit, 300 ms does not.
		{name: "max_delay_ms", extra: `,"max_delay_ms":250`, held: 2, retry: "1", rejected: 4, stored: -2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := delayFixture(t, tc.extra)
			held, rejected := 0, 0
			for i := 1; i <= 7; i++ {
				_, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
				switch {
				case res.Status() == 429:
					rejected++
					if got := res.Header("retry-after"); got != tc.retry {
						t.Errorf("request %d: retry-after %q, want %q", i, got, tc.retry)
					}
				case res.RequestAction == filter.Pause:
					held++
				}
			}
			if held != tc.held || rejected != tc.rejected || f.p.Waiting() != tc.held {
				t.Fatalf("held %d, rejected %d, waiting %d; want %d, %d", held, rejected, f.p.Waiting(), tc.held, tc.rejected)
			}
			// Only the admitted and held requests took tokens: 3 of them,
			// balance -2.
			if tokens, _ := f.state("tb:g:"); tokens != tc.stored {
				t.Errorf("stored %v tokens, want %v: rejected requests keep nothing", tokens, tc.stored)
			}
		})
	}
}

// TestDelayReload: a reload leaves held requests to their deadlines (they
// are never re-checked) and the new configuration decides new requests.
func TestDelayReload(t *testing.T) {
	f := delayFixture(t, "")
	for range 3 {
		f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	}
	if !f.p.OnConfigure([]byte(`{"name":"g","algorithm_config":{"rps":5,"burst":1,"max_reserved":5}}`)) {
		t.Fatal("reload refused")
	}
	if f.p.Waiting() != 2 {
		t.Fatalf("%d waiting after the reload, want 2", f.p.Waiting())
	}
	// Balance -2 at 5/s: the new request waits 600 ms.
	if _, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000")); res.RequestAction != filter.Pause {
		t.Fatalf("new request after the reload: status %d, want it held", res.Status())
	}
	f.now = epoch + 0.1
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{2}) {
		t.Errorf("tick at +100 ms released %v, want [2]", got)
	}
	f.now = epoch + 0.2
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{3}) {
		t.Errorf("tick at +200 ms released %v, want [3]", got)
	}
	f.now = epoch + 0.6 - 1e-6
	if got := f.h.Tick(f.p); len(got) != 0 {
		t.Errorf("tick before +600 ms released %v", got)
	}
	f.now = epoch + 0.6
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{4}) {
		t.Errorf("tick at +600 ms released %v, want [4]", got)
	}
}

// TestDelayAcrossWorkers: two workers share the bucket; each holds its own
// requests and releases them from its own tick, and together they release
// in admission order at the rate.
func TestDelayAcrossWorkers(t *testing.T) {
	f := delayFixture(t, "")
	h2 := f.h.NewWorker()
	p2 := filter.NewPlugin(h2)
	p2.Clock = func() float64 { return f.now }
	if !p2.OnConfigure([]byte(strings.Replace(nginxCfg, "%s", "", 1))) {
		t.Fatal("worker 2 refused the configuration")
	}
	type rel struct {
		worker int
		id     uint32
	}
	var order []rel
	// Admissions alternate: worker 1 stream 1 (at once), worker 2 stream
	// 1, worker 1 stream 2, worker 2 stream 2, worker 1 stream 3.
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	h2.Start(p2, filtertest.Get("/", "192.0.2.1:5000"))
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	h2.Start(p2, filtertest.Get("/", "192.0.2.1:5000"))
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	for k := 1; k <= 4; k++ {
		f.now = epoch + float64(k)/10
		for _, id := range f.h.Tick(f.p) {
			order = append(order, rel{1, id})
		}
		for _, id := range h2.Tick(p2) {
			order = append(order, rel{2, id})
		}
	}
	want := []rel{{2, 1}, {1, 2}, {2, 2}, {1, 3}}
	if !slices.Equal(order, want) {
		t.Errorf("released %v, want %v", order, want)
	}
}

// TestDelayTickRefused: a host that refuses proxy_set_tick_period_milliseconds
// (as a host without timers answers UNIMPLEMENTED; the module's host always
// has the method) cannot hold a request: the one that would wait gets the
// 429 with its wait as Retry-After, naming the reserving rule, and takes
// nothing; the plugin remembers, so later requests that would wait are
// refused without asking the host again.
func TestDelayTickRefused(t *testing.T) {
	f := newFixture(t, `{"rules":[
		{"name":"wide","algorithm_config":{"rps":100,"burst":100}},
		{"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5}}]}`)
	f.h.TickError = errors.New("proxy-wasm status 12")
	if res := f.get(); res.Status() != 200 {
		t.Fatalf("first request: %d", res.Status())
	}
	before, _ := f.state("tb:g:")
	for i := 2; i <= 3; i++ {
		res := f.get()
		if res.Status() != 429 || res.Header("retry-after") != "1" || res.Header("x-tokengate-rule") != "g" {
			t.Fatalf("request %d: status %d, retry-after %q, rule %q; want 429, 1, g (the reserving rule)",
				i, res.Status(), res.Header("retry-after"), res.Header("x-tokengate-rule"))
		}
	}
	if after, _ := f.state("tb:g:"); after != before {
		t.Errorf("stored %v tokens after the refused holds, %v before: they must take nothing", after, before)
	}
	if wide, _ := f.state("tb:wide:"); wide != 99 {
		t.Errorf("rule wide has %v tokens, want 99: the refused requests take nothing from any rule", wide)
	}
	if f.p.Waiting() != 0 || f.h.TickRefused != 1 {
		t.Errorf("waiting %d, tick calls refused %d; want 0 and 1 (the plugin remembers)", f.p.Waiting(), f.h.TickRefused)
	}
	if got := f.counter("g", filter.CounterDelayed); got != 0 {
		t.Errorf("delayed = %d, want 0", got)
	}
	if got := f.counter("g", filter.CounterRejected); got != 2 {
		t.Errorf("rejected = %d, want 2", got)
	}
}

// TestDelayUnholdableNamesReservingRule: a request over max_pending gets a
// 429 naming the rule whose reservation it would wait for, not the first
// rule of the request.
func TestDelayUnholdableNamesReservingRule(t *testing.T) {
	f := newFixture(t, `{"rules":[
		{"name":"wide","algorithm_config":{"rps":100,"burst":100}},
		{"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5,"max_pending":1}}]}`)
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	if _, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000")); res.RequestAction != filter.Pause || res.Local != nil {
		t.Fatalf("second request: status %d, want held", res.Status())
	}
	_, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	if res.Status() != 429 || res.Header("x-tokengate-rule") != "g" {
		t.Errorf("third request: status %d, rule %q; want 429 naming g", res.Status(), res.Header("x-tokengate-rule"))
	}
}

// TestDelayDroppedAtDone: a held stream is dropped when the host ends it
// (proxy_on_done), before proxy_on_delete: a tick that comes in between,
// while the context still exists and set_effective_context would succeed,
// does not continue it; on_delete after that changes nothing.
func TestDelayDroppedAtDone(t *testing.T) {
	f := delayFixture(t, `,"refund_on_cancel":true`)
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	s2, _ := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	before, _ := f.state("tb:g:")
	s2.OnDone()
	f.h.EndCallback()
	if got := f.p.Waiting(); got != 1 {
		t.Fatalf("%d waiting after on_done, want 1", got)
	}
	if after, _ := f.state("tb:g:"); after != before+1 {
		t.Errorf("stored %v tokens after on_done (before %v), want the refund", after, before)
	}
	f.now = epoch + 1
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{3}) {
		t.Errorf("tick continued %v, want only [3]: stream 2 ended at on_done", got)
	}
	s2.Release()
	f.h.EndCallback()
	if got := f.counter("g", filter.CounterDelayCancelled); got != 1 {
		t.Errorf("delay_cancelled = %d, want 1 (counted once)", got)
	}
}

// TestDelayConfig: the fields' errors name their path.
func TestDelayConfig(t *testing.T) {
	tests := []struct {
		name, config, expectedErr string
	}{
		{"negative reserve", `{"name":"g","algorithm_config":{"rps":1,"burst":1,"max_reserved":-1}}`, "algorithm_config.max_reserved: must be a number from 0 to 1e+12, got -1"},
		{"delay without reserve", `{"name":"g","algorithm_config":{"rps":1,"burst":1,"max_delay_ms":10}}`, "algorithm_config.max_delay_ms: needs max_reserved > 0"},
		{"pending zero", `{"name":"g","algorithm_config":{"rps":1,"burst":1,"max_reserved":1,"max_pending":0}}`, "algorithm_config.max_pending: must be an integer from 1 to 1048576, got 0"},
		{"refund not bool", `{"name":"g","algorithm_config":{"rps":1,"burst":1,"max_reserved":1,"refund_on_cancel":"yes"}}`, "algorithm_config.refund_on_cancel: must be true or false, got a string"},
		{"fixed window", `{"name":"g","algorithm":"fixed_window","algorithm_config":{"limit":1,"window_seconds":1,"max_reserved":1}}`, `max_reserved: unknown field`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.config))
			if err == nil || !strings.Contains(err.Error(), tc.expectedErr) {
				t.Errorf("got error %v, want one containing %q", err, tc.expectedErr)
			}
		})
	}
	cfg, err := config.Parse([]byte(`{"name":"g","algorithm_config":{"rps":1,"burst":1,"max_reserved":0}}`))
	if err != nil || cfg.Policies[0].Rules[0].Delay.MaxReserved != 0 {
		t.Errorf("max_reserved 0: %v", err)
	}
}

// TestDelayHeldHeaders: a held request's response gets RateLimit headers
// that say nothing is left and when the bucket is full again (the debt
// paid back and the burst refilled), not the negative balance.
func TestDelayHeldHeaders(t *testing.T) {
	f := delayFixture(t, "")
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	s, _ := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000")) // balance -2
	f.now = epoch + 0.2
	f.h.Tick(f.p)
	f.h.Tick(f.p)
	f.h.Response = filtertest.Response{}
	s.OnResponseHeaders(0, false)
	got := map[string]string{}
	for _, kv := range f.h.Response.Headers {
		got[kv[0]] = kv[1]
	}
	// Balance -2 then +1 at 10/s: full (1 token) 300 ms later, 1 s rounded up.
	if got["ratelimit-remaining"] != "0" || got["ratelimit"] != `"g";r=0;t=1` || got["ratelimit-policy"] != `"g";q=1;w=1` {
		t.Errorf("headers %v", got)
	}
}

// TestDelayClockSteppedBack: a clock stepped back by more than
// bucket.MaxClockSkew while requests are held does not make them wait for
// the old time to come back: they keep the wait they had left.
func TestDelayClockSteppedBack(t *testing.T) {
	f := delayFixture(t, "")
	for range 3 { // held until +100 and +200 ms
		f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	}
	f.now = epoch + 0.05
	f.h.Tick(f.p)
	f.now = epoch - 3600 // an hour back, 50 ms after the last tick
	if got := f.h.Tick(f.p); len(got) != 0 {
		t.Fatalf("released %v right after the step", got)
	}
	f.now += 0.05 + 1e-6 // a microsecond for the rounding of the shift
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{2}) {
		t.Errorf("50 ms after the step released %v, want [2]", got)
	}
	f.now += 0.1
	if got := f.h.Tick(f.p); !slices.Equal(got, []uint32{3}) {
		t.Errorf("150 ms after the step released %v, want [3]", got)
	}
}

// TestDelaySlotted: a reserving rule with limit keys (slots) holds and
// refunds per key: two clients do not share a reservation, and a refund
// goes to the slot the cost was taken from.
func TestDelaySlotted(t *testing.T) {
	f := newFixture(t, `{"name":"g","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":1,"max_reserved":2,"refund_on_cancel":true}}`)
	from := func(ip string) filtertest.Request { return filtertest.Get("/", ip+":5000") }
	var got []string
	var held *filter.Stream
	for _, ip := range []string{"192.0.2.1", "192.0.2.1", "192.0.2.2", "192.0.2.1", "192.0.2.1"} {
		s, res := f.h.Start(f.p, from(ip))
		switch {
		case res.Status() == 429:
			got = append(got, "429")
		case res.RequestAction == filter.Pause:
			got = append(got, "held")
			held = s
		default:
			got = append(got, "200")
		}
	}
	if want := []string{"200", "held", "200", "held", "429"}; !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	f.h.End(held, 4) // the second held request of 192.0.2.1 leaves: refunded
	if _, res := f.h.Start(f.p, from("192.0.2.1")); res.RequestAction != filter.Pause || res.Local != nil {
		t.Errorf("after the refund: status %d, want held", res.Status())
	}
}

// TestDelayShiftedStateUpgrade pins what a value stored by the older code,
// which kept a reserving rule's balance shifted up by its reservation
// (capacity burst + 5, true balance + 5), means after an upgrade: it reads
// as the true balance, clamped to the burst, so the new code over-admits by
// at most the reservation, and a key at rest (full) is decided exactly
// (docs/configuration.md, "Delayed admission").
func TestDelayShiftedStateUpgrade(t *testing.T) {
	const reservation = 5
	tests := []struct {
		name    string
		old     string   // tokens stored by the shifted code, at epoch
		want    []string // 7 requests at once
		truth   int      // requests the true balance (old - 5) admits
		balance float64  // stored afterwards: the floor, -reservation
	}{
		{"full: exact", "6.000000", []string{"200", "held", "held", "held", "held", "held", "429"}, 6, -5},
		{"balance 0: one token over", "5.000000", []string{"200", "held", "held", "held", "held", "held", "429"}, 5, -5},
		{"in debt 3: four over", "2.000000", []string{"200", "held", "held", "held", "held", "held", "429"}, 2, -5},
		{"at the reservation: the reservation over", "0.000000", []string{"held", "held", "held", "held", "held", "429", "429"}, 0, -5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := delayFixture(t, "")
			f.put("tb:g:", tc.old+":"+strconv.FormatFloat(epoch, 'f', 6, 64))
			var got []string
			admitted := 0
			for range 7 {
				_, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
				switch {
				case res.Status() == 429:
					got = append(got, "429")
				case res.RequestAction == filter.Pause:
					got, admitted = append(got, "held"), admitted+1
				default:
					got, admitted = append(got, "200"), admitted+1
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if over := admitted - tc.truth; over < 0 || over > reservation {
				t.Errorf("admitted %d, the true balance admits %d: over-admission %d outside [0, %d]", admitted, tc.truth, over, reservation)
			}
			if tokens, _ := f.state("tb:g:"); tokens != tc.balance {
				t.Errorf("stored %v tokens afterwards, want %v", tokens, tc.balance)
			}
		})
	}
}
