package filter

import (
	"math"

	"github.com/tokengate/tokengate/bucket"
)

// The plugin's one timer (Plugin.timer, one per worker VM).
//
// Who owns what:
//   - the timer alone calls Ticker.SetTickPeriod and chooses the period
//     (period, armedFor, armedEvery), keeps the entries in order (the
//     deadline heap of one-shot entries, and one periodic entry) and moves
//     every deadline when the clock is stepped back (rebase);
//   - each entry belongs to the code that armed it, which alone arms, moves
//     or stops it: one one-shot entry per held request (delay.go, owned by
//     waiter.due), and lease mode's periodic entry (lease_tick.go,
//     leaseState.tick, owned by leaseOnTick: due at the next periodic refill,
//     every lease_tick_ms; polled at every tick, every leasePollMs, while
//     requests wait for a refill);
//   - OnTick dispatches the due entries to their owners: the periodic one
//     first, then the one-shot ones in deadline order. Lease mode makes its
//     calls from its periodic entry, and a call made once a stream is
//     effective would belong to that stream and die with it in Envoy
//     (lease_tick.go, leaseServe): so every call of a tick is made before a held
//     request is resumed.
//
// Envoy recreates the timer on every proxy_set_tick_period_milliseconds, so
// outside a tick the period is set only when the entries changed (the
// earliest deadline moved, or the periodic entry's period changed), never
// because time passed: a period set per request would postpone the tick for
// as long as requests keep coming.

// timerEntry is one registration with the timer. The zero value is an
// unarmed one-shot entry; set owner before arming it.
type timerEntry struct {
	// deadline is when the entry is due, in seconds since the Unix epoch:
	// at or after it. A one-shot entry's moves only through timer.arm; a
	// periodic entry's owner may change it at any time.
	deadline float64
	// every, in milliseconds, makes the entry periodic: while it is armed
	// the tick comes at least every that many ms, whatever its deadline.
	// poll makes a periodic entry due at every tick, its deadline then
	// being its owner's own reckoning. Both are set before arming; change
	// them through timer.arm.
	every uint32
	poll  bool
	// owner runs from OnTick when the entry is due: the code the entry
	// belongs to. A one-shot entry is out of the timer by then (arm it
	// again to come back); a periodic entry stays armed, and its owner
	// moves its deadline if it wants to. A func, not an interface: an
	// owner type held in an interface keeps the methods of every type it
	// reaches (Rule, Descriptor...) in the module.
	owner func(p *Plugin, now float64)

	seq uint64 // arming order: equal deadlines are due in that order
	// pos is the entry's position plus one in the heap (inHeap), 1 for
	// the periodic entry; 0: not armed.
	pos    int
	inHeap bool
	gen    uint64 // timer.gen when it was armed
}

// armed reports whether e is in the timer.
func (e *timerEntry) armed() bool { return e.pos > 0 }

// timer is the plugin's timer: a min-heap of one-shot entries on (deadline,
// seq), one periodic entry, and the tick period it has set. One periodic
// entry is all lease mode needs; a second one would take its place.
type timer struct {
	// ticker is the host's timer, nil on a host without one; refused is
	// set once the host has refused a period (a proxy-wasm host without
	// timers answers UNIMPLEMENTED): the timer asks for none after that.
	ticker  Ticker
	refused bool
	// log reports the refusal, once: the host.
	log Host

	h        []*timerEntry
	periodic *timerEntry
	seq      uint64
	// gen counts ticks; an entry armed during a tick's dispatch (its gen
	// is timer.gen) waits for the next tick.
	gen uint64

	// period is the tick period in force (ms, 0: none); armedFor and
	// armedEvery are the earliest one-shot deadline and the periodic
	// entry's every it was chosen for.
	period     uint32
	armedFor   float64
	armedEvery uint32
	// latest is the latest time seen: a clock more than
	// bucket.MaxClockSkew behind it was stepped back.
	latest float64
}

// minTickMs is the shortest tick period the timer asks for. Envoy's timers
// count milliseconds, so an entry is dispatched late by less than a
// millisecond plus the host's timer slack, and never early (OnTick rechecks
// the clock).
const minTickMs = 1

// usable reports whether the timer can tick: the host has a timer and has
// not refused a period.
func (t *timer) usable() bool { return t.ticker != nil && !t.refused }

// arm puts e in the timer and sets the tick for the entries. Arming an
// armed entry again applies its new deadline (a one-shot entry is then
// armed anew, after the others of its deadline), or its new every and poll
// (a periodic entry). Whether an entry is periodic is fixed while it is
// armed. arm reports false, leaving e out of the timer, if the timer cannot
// tick.
func (t *timer) arm(e *timerEntry, now float64) bool {
	if e.inHeap || !t.usable() {
		t.remove(e) // a one-shot entry armed again is armed anew
	}
	if !t.usable() {
		return false
	}
	if !e.armed() {
		t.seq++
		e.seq, e.gen, e.inHeap = t.seq, t.gen, e.every == 0
		if e.inHeap {
			t.h = append(t.h, e)
			e.pos = len(t.h)
			t.up(e.pos - 1)
		} else {
			if t.periodic != nil {
				t.remove(t.periodic)
			}
			t.periodic, e.pos = e, 1
		}
	}
	t.rebase(now) // a clock stepped back since e's deadline was set moves it with the rest
	if !t.rearm(now, false) {
		t.remove(e)
		return false
	}
	return true
}

// stop takes e out of the timer, if it is in it, and sets the tick for the
// entries left (none: 0).
func (t *timer) stop(e *timerEntry, now float64) {
	if !e.armed() {
		return
	}
	t.remove(e)
	t.rearm(now, false)
}

// rebase moves every deadline back by the amount the clock was stepped
// back since latest, so that entries keep the wait they had left instead of
// waiting for the old time to come back (the buckets re-anchor at the new
// time too; see bucket.Limit.Refill). Moving them all keeps the heap's
// order.
func (t *timer) rebase(now float64) {
	if step := t.latest - now; step > bucket.MaxClockSkew {
		for _, e := range t.h {
			e.deadline -= step
		}
		if e := t.periodic; e != nil {
			e.deadline -= step
		}
		t.armedFor = 0
		t.latest = now
	}
	t.latest = max(t.latest, now)
}

// want returns the period the entries need at now (0: none), the earliest
// one-shot deadline (0: none) and the periodic entry's every (0: none): the
// time left to the earliest deadline, rounded up to whole ms (at least
// minTickMs), or every if that is shorter.
func (t *timer) want(now float64) (ms uint32, top float64, every uint32) {
	if t.periodic != nil {
		every = t.periodic.every
	}
	if len(t.h) > 0 {
		top = t.h[0].deadline
		ms = minTickMs
		// The microsecond taken off absorbs rounding in top-now (epoch
		// seconds carry about 0.2 µs of precision); a tick that comes
		// that early finds nothing due and re-arms for 1 ms.
		if left := math.Ceil((top-now)*1000 - 1e-3); left > minTickMs {
			ms = uint32(min(left, math.MaxUint32))
		}
	}
	if every > 0 && (ms == 0 || every < ms) {
		ms = every
	}
	return ms, top, every
}

// rearm sets the tick for the entries. Outside a tick (ticked false) it
// sets it only if the entries changed since it last did; at the end of a
// tick it also corrects a period that no longer matches the time left.
// Nothing armed: 0. It reports false if the host refused the period.
func (t *timer) rearm(now float64, ticked bool) bool {
	if !t.usable() {
		return false
	}
	ms, top, every := t.want(now)
	switch {
	case ms == 0:
		t.armedFor, t.armedEvery = 0, 0
		if t.period == 0 {
			return true
		}
	case !ticked && t.period != 0 && top == t.armedFor && every == t.armedEvery:
		return true
	case ticked && ms == t.period:
		t.armedFor, t.armedEvery = top, every
		return true
	}
	if err := t.ticker.SetTickPeriod(ms); err != nil {
		t.refused = true
		t.log.Log(LogError, "tokengate: the host refused a tick period ("+err.Error()+
			"): from now on requests that would wait for a reservation are rejected, and leases are not refilled ahead")
		return false
	}
	t.period, t.armedFor, t.armedEvery = ms, top, every
	return true
}

// dispatch runs the entries due at now: the periodic one first (see the
// file comment), then the one-shot ones in (deadline, seq) order. An entry
// armed during the dispatch waits for the next tick. It ends with the tick
// set for what is left.
func (t *timer) dispatch(p *Plugin, now float64) {
	t.rebase(now)
	t.gen++
	if e := t.periodic; e != nil && e.gen != t.gen && (e.poll || e.deadline <= now) {
		e.owner(p, now)
	}
	// One at a time from the heap: an owner may stop other entries (a
	// stream that ends while another is resumed). An entry armed during
	// the dispatch, and those after it, wait for the next tick.
	for len(t.h) > 0 && t.h[0].deadline <= now && t.h[0].gen != t.gen {
		e := t.h[0]
		t.remove(e)
		e.owner(p, now)
	}
	t.rearm(now, true)
}

// remove takes e out of the timer (nothing if it is not in it), without
// touching the tick.
func (t *timer) remove(e *timerEntry) {
	if !e.armed() {
		return
	}
	i := e.pos - 1
	if !e.inHeap {
		t.periodic, e.pos = nil, 0
		return
	}
	last := len(t.h) - 1
	if i != last {
		t.swap(i, last)
	}
	t.h[last] = nil
	t.h = t.h[:last]
	if i != last {
		t.down(i)
		t.up(i)
	}
	e.pos = 0
}

func (t *timer) less(i, j int) bool {
	a, b := t.h[i], t.h[j]
	return a.deadline < b.deadline || a.deadline == b.deadline && a.seq < b.seq
}

func (t *timer) swap(i, j int) {
	t.h[i], t.h[j] = t.h[j], t.h[i]
	t.h[i].pos, t.h[j].pos = i+1, j+1
}

func (t *timer) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !t.less(i, parent) {
			return
		}
		t.swap(i, parent)
		i = parent
	}
}

func (t *timer) down(i int) {
	n := len(t.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && t.less(r, l) {
			m = r
		}
		if !t.less(m, i) {
			return
		}
		t.swap(i, m)
		i = m
	}
}

// OnTick is the root context's proxy_on_tick: the timer dispatches the
// entries that are due (held requests are released, in deadline order;
// lease mode refills and serves the requests waiting for it, before them)
// and sets the tick for the next (or stops it).
func (p *Plugin) OnTick() {
	defer p.recoverTo("proxy_on_tick", nil)
	if p.timer.ticker == nil {
		return
	}
	p.timer.dispatch(p, p.time())
}

// TickPeriod returns the tick period, in milliseconds, the plugin last set
// (0: no tick).
func (p *Plugin) TickPeriod() uint32 { return p.timer.period }
