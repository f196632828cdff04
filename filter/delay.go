package filter

import (
	"math"
	"strconv"

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

// waiter is one held request: its entry in the plugin's timer (timer.go)
// is due at the request's release.
type waiter struct {
	// timerEntry's deadline is the release, in seconds since the epoch:
	// at or after it.
	timerEntry
	s *Stream
	// rules are the reserving rules that count this request against their
	// max_pending; refund are the buckets given back if the client leaves
	// (rules with refund_on_cancel), copies owned by the waiter.
	rules  []*rule
	refund []sharedstate.Request
	// by is the rule whose reservation makes the wait.
	by *rule
}

// Waiting returns the number of requests the plugin holds.
func (p *Plugin) Waiting() int { return p.held }

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
	if p.caller == nil || !p.timer.usable() {
		return by
	}
	for i, r := range g.rules {
		if r.Delay.Debt > 0 && r.waiting >= r.Delay.MaxPending {
			return i
		}
	}
	return -1
}

// prepareHold returns the hold of a request its local buckets admitted
// into their reservation, due at now+wait (by: the index of the rule whose
// reservation makes the wait): its tokens are taken, and it counts against
// max_pending from now on. The hold starts (startHold) once every other
// rule (lease, cluster) has admitted the request too: a request is held
// only when nothing else will turn it away. unholdable must have said it
// can be held.
func (s *Stream) prepareHold(g *group, now, wait float64, by int) *waiter {
	p := s.p
	p.timer.rebase(now)
	w := &waiter{s: s, by: g.rules[by]}
	w.deadline = now + wait
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
	return w
}

// startHold puts the prepared hold w of the stream in the timer heap:
// OnTick releases the request at its deadline. It reports false, holding
// nothing (the hold is dropped), if the host refused the tick the request
// needs (the timer then refuses every later hold: timer.usable).
func (s *Stream) startHold(w *waiter, now float64) bool {
	p := s.p
	w.owner = w.due
	if !p.timer.arm(&w.timerEntry, now) {
		p.forget(w)
		return false
	}
	p.held++
	s.st.cont.held = w
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
	w := s.st.cont.pending
	if w == nil {
		return
	}
	p := s.p
	s.st.cont.pending = nil
	p.forget(w)
	if cancelled {
		p.cancelled(w, p.time())
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
	w := s.st.cont.pending
	if w == nil {
		s.resume()
		return
	}
	s.st.cont.pending = nil
	p := s.p
	now := p.time()
	if w.deadline <= now {
		p.forget(w)
		for _, r := range w.rules {
			r.metrics.delayed.inc(p.host, 1)
		}
		s.resume()
		return
	}
	if s.startHold(w, now) {
		return // OnTick releases it
	}
	s.refundLocal(pc)
	w.by.metrics.rejected.inc(p.host, 1)
	wait := w.deadline - now
	st := rlscontract.Status{Code: rlscontract.CodeOverLimit, UntilReset: wait}
	s.sendClusterRejection(pc, w.by, st, retryAfterHash(wait, pc.idHash), nil)
}

// holdNow starts st.hold, the prepared hold of a request every rule
// admitted in proxy_on_request_headers, or, if the host refuses the tick,
// rejects it as one that cannot be held, giving back the lease tokens it
// took too (st.debits).
func (s *Stream) holdNow(st *reqState) Action {
	if s.startHold(st.hold, st.now) {
		return Pause // OnTick releases it
	}
	s.p.leaseRefund(st.debits)
	return s.refuseHold(&st.req, &st.enforce, st.now, st.wait, st.waitRule)
}

// refuseHold rejects a request that fits the reservation but cannot be
// held: its tokens go back and rule over is named in the 429, with the
// wait as Retry-After; the admission's headers are forgotten.
func (s *Stream) refuseHold(req *request, g *group, now, wait float64, over int) Action {
	p := s.p
	s.st.quotas = s.st.quotas[:0]
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

// due releases a held request whose deadline has come (the timer calls it
// from OnTick). A stream that is gone leaves the previous context
// effective: continuing then would resume the wrong stream. Its client
// left.
func (w *waiter) due(p *Plugin, now float64) {
	p.held--
	p.forget(w)
	w.s.st.cont.held = nil
	if p.caller.SetEffectiveContext(w.s.id) {
		w.s.resume()
	} else {
		p.cancelled(w, now)
	}
}

// abandon forgets what a stream that ended was waiting for: the rate-limit
// service's answer (dropped when it comes), a lease (its waiter is dropped
// at the next retry) and a hold not yet started. Nothing continues the
// stream after this; in Envoy a tick or an answer may still come between
// proxy_on_done and proxy_on_delete, when its context still exists.
func (s *Stream) abandon() {
	p := s.p
	s.st.ended = true
	if s.st.cont.call != 0 {
		p.callouts.take(s.st.cont.call) // its answer is dropped
		s.st.cont.call = 0
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
	w := s.st.cont.held
	if w == nil {
		return
	}
	p := s.p
	defer p.recoverTo("the end of a held stream", nil)
	s.st.cont.held = nil
	p.held--
	p.forget(w)
	now := p.time()
	p.timer.stop(&w.timerEntry, now)
	p.cancelled(w, now)
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
