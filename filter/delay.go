package filter

import (
	"math"
	"strconv"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// Delayed admission ("max_reserved"): a request that finds its bucket short
// may still take its cost, leaving the balance in debt down to -debt
// tokens, and is then held for deficit/rate seconds before it goes on. The
// guest never sleeps: the request is paused in proxy_on_request_headers and
// released from the root context's proxy_on_tick, through a timer heap kept
// per plugin (one per worker VM).
//
// The reservation is the bucket's own (bucket.Limit.Reserve, set with
// MaxDebt by delayConfig): Take admits exactly the requests that fit it, in
// the same compare-and-swap as any other bucket, the stored balance is the
// true one (negative while in debt, as a settled debt is), a rejection's
// RetryAfter is the time until the request would fit the reservation again,
// and bucket.Limit.Delay is the wait an admission leaves.

// Ticker is implemented by hosts with a per-worker timer
// (proxy_set_tick_period_milliseconds); the timer calls Plugin.OnTick.
// Without it (or without Caller), or once the host has refused a tick
// period (Plugin.noTicks), a request that would have to wait is rejected
// instead.
type Ticker interface {
	// SetTickPeriod sets the period of the root context's tick, in
	// milliseconds; 0 stops it.
	SetTickPeriod(ms uint32) error
}

// minTickMs is the shortest tick period the filter asks for. Envoy's timers
// count milliseconds, so a release is late by less than a millisecond plus
// the host's timer slack, and never early (OnTick rechecks the clock).
const minTickMs = 1

// waiter is one held request in the plugin's timer heap.
type waiter struct {
	deadline float64 // seconds since the epoch: release at or after it
	seq      uint64  // admission order, to release equal deadlines in order
	idx      int     // position in the heap
	s        *Stream
	// rules are the reserving rules that count this request against their
	// max_pending; refund are the buckets given back if the client leaves
	// (rules with refund_on_cancel), copies owned by the waiter.
	rules  []*rule
	refund []sharedstate.Request
	// by is the rule whose reservation makes the wait.
	by *rule
}

// delayQueue is a plugin's held requests, a binary min-heap on (deadline,
// seq), and the tick it has asked the host for.
type delayQueue struct {
	h   []*waiter
	seq uint64
	// period is the tick period in force (ms, 0 = off) and armedFor the
	// deadline it was computed for.
	period   uint32
	armedFor float64
	// latest is the latest time seen when holding or ticking: a clock
	// more than bucket.MaxClockSkew behind it was stepped back.
	latest float64
}

// rebase moves every deadline back by the amount the clock was stepped
// back since latest, so that held requests keep the wait they had left
// instead of waiting for the old time to come back (the buckets re-anchor
// at the new time too; see bucket.Limit.Refill). Moving them all keeps the
// heap's order.
func (q *delayQueue) rebase(now float64) {
	if step := q.latest - now; step > bucket.MaxClockSkew {
		for _, w := range q.h {
			w.deadline -= step
		}
		q.armedFor = 0
		q.latest = now
	}
	q.latest = max(q.latest, now)
}

func (q *delayQueue) less(i, j int) bool {
	a, b := q.h[i], q.h[j]
	return a.deadline < b.deadline || a.deadline == b.deadline && a.seq < b.seq
}

func (q *delayQueue) swap(i, j int) {
	q.h[i], q.h[j] = q.h[j], q.h[i]
	q.h[i].idx, q.h[j].idx = i, j
}

func (q *delayQueue) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !q.less(i, parent) {
			return
		}
		q.swap(i, parent)
		i = parent
	}
}

func (q *delayQueue) down(i int) {
	n := len(q.h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			return
		}
		q.swap(i, m)
		i = m
	}
}

func (q *delayQueue) push(w *waiter) {
	q.seq++
	w.seq = q.seq
	w.idx = len(q.h)
	q.h = append(q.h, w)
	q.up(w.idx)
}

// remove takes w out of the heap.
func (q *delayQueue) remove(w *waiter) {
	i, last := w.idx, len(q.h)-1
	if i != last {
		q.swap(i, last)
	}
	q.h[last] = nil
	q.h = q.h[:last]
	if i != last {
		q.down(i)
		q.up(i)
	}
	w.idx = -1
}

// Waiting returns the number of requests the plugin holds.
func (p *Plugin) Waiting() int { return len(p.delays.h) }

// TickPeriod returns the tick period, in milliseconds, the plugin last set
// (0: no tick).
func (p *Plugin) TickPeriod() uint32 { return p.delays.period }

// reservationWait returns the longest wait, in seconds, the admission of
// g's requests left (bucket.Limit.Delay: 0 unless a bucket was taken into
// its reservation) and the index of the rule whose reservation makes it (-1
// for none). It reports the balance of reserving buckets in debt as 0 (for
// the headers and logs): what is left for the next request.
func reservationWait(g *group) (float64, int) {
	wait, by := 0.0, -1
	for i, r := range g.rules {
		if r.Delay.Debt == 0 {
			continue
		}
		res := &g.res[i]
		if w := r.Limit.Delay(*res); w > wait {
			wait, by = w, i
		}
		res.Tokens = math.Max(res.Tokens, 0)
	}
	return wait, by
}

// unholdable returns the index of the rule that keeps an admitted request
// from being held, or -1 if it can be: a reserving rule at its max_pending,
// or, on a host without ticks or stream resumption (or one that refused a
// tick period), by, the rule whose reservation the request would wait for.
func (s *Stream) unholdable(g *group, by int) int {
	p := s.p
	_, caller := p.host.(Caller)
	_, ticks := p.host.(Ticker)
	if !caller || !ticks || p.noTicks {
		return by
	}
	for i, r := range g.rules {
		if r.Delay.Debt > 0 && r.waiting >= r.Delay.MaxPending {
			return i
		}
	}
	return -1
}

// prepareHold makes the hold of a request its local buckets admitted into
// their reservation, due at now+wait (by: the index of the rule whose
// reservation makes the wait): its tokens are taken, and it counts against
// max_pending from now on. The hold starts (startHold) once every other
// rule (lease, cluster) has admitted the request too: a request is held
// only when nothing else will turn it away. unholdable must have said it
// can be held.
func (s *Stream) prepareHold(g *group, now, wait float64, by int) {
	p := s.p
	p.delays.rebase(now)
	w := &waiter{deadline: now + wait, s: s, by: g.rules[by]}
	for i, r := range g.rules {
		if r.Delay.Debt == 0 {
			continue
		}
		w.rules = append(w.rules, r)
		r.waiting++
		if r.Delay.RefundOnCancel {
			w.refund = append(w.refund, cloneReqs(g.reqs[i:i+1])...)
		}
	}
	s.pending = w
}

// startHold puts the prepared hold in the timer heap: OnTick releases the
// request at its deadline. It reports false, holding nothing (the hold is
// dropped), if the host refused the tick the request needs (the plugin then
// holds nothing more: noTicks).
func (s *Stream) startHold(now float64) bool {
	p := s.p
	w := s.pending
	s.pending = nil
	p.delays.push(w)
	p.delays.rebase(now) // a clock stepped back since moves w with the rest
	if !p.arm(p.host.(Ticker), now, false) {
		p.delays.remove(w)
		p.forget(w)
		return false
	}
	s.waiter = w
	for _, r := range w.rules {
		r.metrics.delayed.inc(p.host, 1)
	}
	return true
}

// dropHold forgets a prepared hold that will not start: the request was
// rejected (its tokens are refunded with the rest), or, with cancelled,
// its client left before its release (counted, and refunded if its rules
// ask for it, as a held request whose client leaves).
func (s *Stream) dropHold(cancelled bool) {
	w := s.pending
	if w == nil {
		return
	}
	p := s.p
	s.pending = nil
	p.forget(w)
	if cancelled {
		p.cancelled(w, p.Clock())
	}
}

// proceed goes on with a request every rule admitted after it was paused
// for the rate-limit service or a lease (the effective context is set):
// resumed, or, if its local buckets admitted it into their reservation,
// held until the hold's deadline, counted from when they admitted it (at
// once if it has passed). A hold the host cannot arm turns into a 429
// naming the reserving rule, with the request's tokens given back where
// they can be (pc).
func (s *Stream) proceed(pc *pendingCall) {
	w := s.pending
	if w == nil {
		s.resume()
		return
	}
	p := s.p
	now := p.Clock()
	if w.deadline <= now {
		s.pending = nil
		p.forget(w)
		for _, r := range w.rules {
			r.metrics.delayed.inc(p.host, 1)
		}
		s.resume()
		return
	}
	if s.startHold(now) {
		return // OnTick releases it
	}
	s.refundLocal(pc)
	w.by.metrics.rejected.inc(p.host, 1)
	wait := w.deadline - now
	st := rlscontract.Status{Code: rlscontract.CodeOverLimit, UntilReset: wait}
	s.sendClusterRejection(pc, w.by, st, retryAfterHash(wait, pc.idHash), nil)
}

// holdNow starts the prepared hold of a request every rule admitted in
// proxy_on_request_headers, or, if the host refuses the tick, rejects it as
// one that cannot be held, giving back the lease tokens it took too.
func (s *Stream) holdNow(req *request, now float64) Action {
	p := s.p
	w := s.pending
	if s.startHold(now) {
		return Pause
	}
	if len(p.rc.lease.reqs) > 0 {
		p.leaseRefund(p.lease.debits)
	}
	g := &p.rc.enforce
	by := 0
	for i, r := range g.rules {
		if r == w.by {
			by = i
		}
	}
	return s.refuseHold(req, g, now, w.deadline-now, by)
}

// refuseHold rejects a request that fits the reservation but cannot be
// held: its tokens go back and rule over is named in the 429, with the
// wait as Retry-After.
func (s *Stream) refuseHold(req *request, g *group, now, wait float64, over int) Action {
	p := s.p
	if _, err := p.upd.Refund(g.reqs, now); err != nil {
		p.warnf(now, "event=refund_error reason="+strconv.Quote(err.Error()))
	}
	g.res[over].Allowed = false
	g.res[over].RetryAfter = wait
	g.rules[over].metrics.rejected.inc(p.host, 1)
	retry := retryAfterHash(wait, req.identityHash())
	p.logDescribe("tokengate: event=rejected_pending ", g, over, retry)
	s.sendRejection(req, g, over, retry)
	return Pause
}

// arm sets the tick for the earliest deadline. Outside a tick it changes
// the period only when the earliest deadline moved (Envoy recreates the
// timer on every call, so setting it per request would postpone the tick
// for as long as requests keep coming); in a tick (ticked) it also corrects
// a period that no longer matches the time left. Nothing waiting: 0. It
// reports false if the host refused the period.
func (p *Plugin) arm(t Ticker, now float64, ticked bool) bool {
	q := &p.delays
	if len(q.h) == 0 {
		ok := true
		if q.period != 0 {
			ok = p.setTick(t, 0)
		}
		q.armedFor = 0
		return ok
	}
	top := q.h[0].deadline
	if top == q.armedFor && q.period != 0 && !ticked {
		return true
	}
	ms := uint32(minTickMs)
	// The microsecond taken off absorbs rounding in top-now (epoch
	// seconds carry about 0.2 µs of precision); a tick that comes that
	// early finds nothing due and re-arms for 1 ms.
	if left := math.Ceil((top-now)*1000 - 1e-3); left > minTickMs {
		ms = uint32(min(left, math.MaxUint32))
	}
	if ms != q.period || !ticked {
		if !p.setTick(t, ms) {
			return false
		}
	}
	q.armedFor = top
	return true
}

// setTick sets the host's tick period. A host that refuses it (a proxy-wasm
// host without timers answers UNIMPLEMENTED) is remembered as one without
// ticks: requests that would have to wait are rejected from then on.
func (p *Plugin) setTick(t Ticker, ms uint32) bool {
	// Lease mode refills every lease.period ms: the timer never runs
	// slower than that, nor stops, while a lease rule exists (lease.go).
	if lp := p.lease.period; lp > 0 && (ms == 0 || ms > lp) {
		ms = lp
	}
	if err := t.SetTickPeriod(ms); err != nil {
		if !p.noTicks {
			p.host.Log(LogError, "tokengate: the host refused a tick period ("+err.Error()+
				"): requests that would wait for their reservation are rejected from now on")
		}
		p.noTicks = true
		return false
	}
	p.delays.period = ms
	return true
}

// OnTick is the root context's proxy_on_tick: every held request whose
// deadline has come is released, in deadline order, and the tick is set
// for the next one (or stopped).
func (p *Plugin) OnTick() {
	defer p.recoverTo("proxy_on_tick", func() {})
	t, ok := p.host.(Ticker)
	if !ok {
		return
	}
	now := p.Clock()
	// Lease calls first: a call made once a stream is effective would
	// belong to that stream, and die with it in Envoy (lease.go).
	p.leaseOnTick(now)
	q := &p.delays
	q.rebase(now)
	for len(q.h) > 0 && q.h[0].deadline <= now {
		w := q.h[0]
		q.remove(w)
		p.forget(w)
		w.s.waiter = nil
		// A stream that is gone leaves the previous context effective:
		// continuing then would resume the wrong stream. Its client left.
		if p.host.(Caller).SetEffectiveContext(w.s.id) {
			w.s.resume()
		} else {
			p.cancelled(w, now)
		}
	}
	p.arm(t, now, true)
}

// abandon forgets what a stream that ended was waiting for: the rate-limit
// service's answer (dropped when it comes), a lease (its waiter is dropped
// at the next retry) and a hold not yet started. Nothing continues the
// stream after this; in Envoy a tick or an answer may still come between
// proxy_on_done and proxy_on_delete, when its context still exists.
func (s *Stream) abandon() {
	p := s.p
	s.ended = true
	if s.call != 0 {
		p.takeCall(s.call)
		s.call = 0
	}
	s.dropHold(true)
}

// forget drops w from its rules' pending counts.
func (p *Plugin) forget(w *waiter) {
	for _, r := range w.rules {
		r.waiting--
	}
}

// cancelWait drops a held request whose stream ended before its release
// (proxy_on_done, or proxy_on_delete from a host that skips on_done),
// refunding its buckets if its rules ask for it. Between on_done and
// on_delete Envoy may still run the root's tick, and the stream's context
// still exists then: it must not be continued.
func (s *Stream) cancelWait() {
	w := s.waiter
	if w == nil {
		return
	}
	p := s.p
	defer p.recoverTo("the end of a held stream", func() {})
	s.waiter = nil
	p.delays.remove(w)
	p.forget(w)
	now := p.Clock()
	p.cancelled(w, now)
	if t, ok := p.host.(Ticker); ok {
		p.arm(t, now, false)
	}
}

// cancelled counts a held request whose client left and, if its rules ask
// for it, gives its tokens back. The refund is made at the current time: a
// stale time would look to the bucket like the clock stepping back
// (bucket.MaxClockSkew).
func (p *Plugin) cancelled(w *waiter, now float64) {
	for _, r := range w.rules {
		r.metrics.delayCancelled.inc(p.host, 1)
	}
	if len(w.refund) > 0 {
		if _, err := p.upd.Refund(w.refund, now); err != nil {
			p.warnf(now, "event=refund_error reason="+strconv.Quote(err.Error()))
		}
	}
}
