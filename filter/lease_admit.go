package filter

import (
	"math"
	"strings"

	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

const maxLeaseWaiters = 4096 // requests one worker holds for refills

// leaseDebit is a request's debit of one allowance, kept to give it back if
// another rule rejects the request (leaseRefund). taken marks a debit of an
// exact take's tokens (LeaseRecord.Taken), seq then being its TakenSeq.
type leaseDebit struct {
	_      incomparable
	key    string
	cost   float64
	grant  uint64
	expiry float64
	seq    uint32
	taken  bool
}

// leaseWaiter is a request paused until the allowances it needs are
// refilled.
type leaseWaiter struct {
	s  *Stream
	id uint32 // the stream's context id when it paused
	// pc carries what the answer needs: the local buckets and the lease
	// debits to give back on a rejection, the request's identity hash.
	pc       *pendingCall
	items    []leaseItem
	deadline float64
	// outcome is how the wait ended; empty and retry name the rule that
	// found its global bucket empty and its retry time.
	outcome waitOutcome
	empty   *rule
	retry   float64
}

type waitOutcome int

const (
	waitAdmitted waitOutcome = iota
	waitEmpty
	waitDown
	waitLate
	waitGone
)

// leaseItem is one allowance a waiting request still needs (or got).
type leaseItem struct {
	_    incomparable
	b    *leaseBucket
	cost float64
	// alt is the shared-data bucket on_error: local decides it with.
	alt  sharedstate.Request
	done bool
	// seq is the record's Claimer when the request was counted in Wait:
	// the exact take claimed next is for it. uncounted: taken out of Wait
	// again (leaseStopWaiting).
	seq       uint32
	uncounted bool
}

// leaseOutcome is what an allowance said about one request.
type leaseOutcome int

const (
	leaseAdmitted leaseOutcome = iota
	leaseEmpty                 // the global bucket is known empty
	leaseShort                 // not enough allowance: a refill decides
	leaseDown                  // not enough, and the service has failed for lease_fallback_ms
	leaseRecount               // a call it waited for failed: counted again for the next
	leaseBroken                // shared data failed
)

// leaseAsk is how a request asks an allowance for its cost (leaseTake).
type leaseAsk uint8

const (
	// askTake: a new request that cannot wait: spend if the allowance
	// covers it; otherwise its own call takes exactly (not counted in
	// Wait).
	askTake leaseAsk = iota
	// askWait: a new request: spend if covered; otherwise wait for the
	// next call, counted in Wait.
	askWait
	// askBehind: a new request while requests of this worker that came
	// earlier wait for this allowance: wait behind them, counted in
	// Wait, spending nothing (the tick serves the waiting requests in
	// arrival order).
	askBehind
	// askWaiting: a waiting request, retried: spend first from the exact
	// take claimed for it, then from the allowance.
	askWaiting
)

// leaseAskNew returns how a new request that may wait (or not) asks the
// allowance under key.
func (p *Plugin) leaseAskNew(key string, mayWait bool) leaseAsk {
	if !mayWait {
		return askTake
	}
	for _, w := range p.lease.waiters {
		for i := range w.items {
			if !w.items[i].done && w.items[i].b.key == key {
				return askBehind
			}
		}
	}
	return askWait
}

// leaseTake debits cost from the allowance under key if it holds that
// much (as ask says), appending the debit to *debits. Otherwise it
// says why: leaseEmpty (with the time until the retry), leaseShort, or,
// for a waiting request, when a lease call claimed since it was counted
// failed: leaseDown if the calls have been failing for lease_fallback_ms,
// else leaseRecount (counted in Wait again, for the next call). A new
// request's cost is demand, which the refill is sized from, and so is a
// waiting one's when the allowance admits it or is counted again.
//
// seq is the Claimer a waiting request was counted in Wait under (the
// exact take claimed next is for it): for askWaiting, an argument (and
// the result after leaseRecount); for a new request that starts waiting,
// the result.
func (p *Plugin) leaseTake(debits *[]leaseDebit, key string, cost, now float64, ask leaseAsk, seq uint32) (leaseOutcome, float64, uint32) {
	tick := float64(p.lease.refill) / 1000
	fallback := float64(p.cfg.Settings.RLS.LeaseFallbackMs) / 1000
	out := leaseShort
	var retry float64
	var d leaseDebit
	_, _, err := p.lease.upd.Update(key, func(rec *sharedstate.LeaseRecord) bool {
		out = leaseShort
		switch {
		case ask == askWaiting && rec.Taken >= cost && rec.TakenSeq == nextClaim(seq):
			// Taken for this request: counted already.
			out = leaseAdmitted
			d = leaseDebit{key: key, cost: cost, seq: rec.TakenSeq, taken: true}
			rec.Taken -= cost
			return true
		case ask == askBehind:
			// Whether the allowance covers it, or the bucket is known
			// empty, is for the tick to say after the earlier requests.
		case rec.Spendable(now) >= cost:
			out = leaseAdmitted
			d = leaseDebit{key: key, cost: cost, grant: rec.Grant, expiry: rec.Expiry, seq: rec.Claimer}
			rec.Tokens -= cost
			if ask == askWaiting && rec.Claimer == seq {
				// No call counted it yet: no exact take is for it.
				rec.Wait = math.Max(0, rec.Wait-cost)
			}
		case now < rec.Retry:
			out, retry = leaseEmpty, rec.Retry-now
			// A request the empty bucket turns away is demand: it shows
			// that requests kept coming (leaseDecide's contended). Counted
			// while the count is below one a refill period since Since, so
			// at most about one write a period, as a sample.
			switch {
			case ask == askWaiting:
				return false
			case rec.Used <= 0:
				rec.Used, rec.Since = cost, now
			case rec.Used*tick < now-rec.Since:
				rec.Used += cost
			default:
				return false
			}
			return true
		case ask == askWaiting && rec.Down > 0 && rec.Claim == 0 && rec.Claimer != seq:
			// The last call, claimed since this request was counted,
			// failed (Down is cleared by an answer).
			if now-rec.Down >= fallback {
				out = leaseDown
				break
			}
			// A transient failure: the request waits for the next call,
			// which is made for it as for a new one. Admitting it on
			// on_error (allow, or local: this proxy's own bucket) would
			// admit beyond what the fleet's bucket gave.
			out = leaseRecount
		}
		if out != leaseAdmitted && out != leaseRecount && ask == askWaiting {
			return false
		}
		if rec.Used == 0 {
			// The demand window starts at the first request since the
			// last refill, not at the refill: an idle spell must not
			// dilute the rate the next lease is sized from.
			rec.Since = now
		}
		rec.Used += cost
		if out == leaseShort && ask != askTake || out == leaseRecount {
			rec.Wait += cost
			seq = rec.Claimer
		}
		return true
	})
	if err != nil {
		return leaseBroken, 0, 0
	}
	if out == leaseAdmitted {
		*debits = append(*debits, d)
	}
	return out, retry, seq
}

// leaseUncount takes the cost of a request that stops waiting without
// being admitted (rejected, failed, gone) out of Wait, if it is still
// counted there (no call claimed since it was, under seq): an exact take
// must not take tokens for a request that no longer waits.
func (p *Plugin) leaseUncount(key string, cost float64, seq uint32) {
	_, _, _ = p.lease.upd.Update(key, func(rec *sharedstate.LeaseRecord) bool {
		if rec.Claimer != seq || rec.Wait <= 0 {
			return false
		}
		rec.Wait = math.Max(0, rec.Wait-cost)
		return true
	})
}

// leaseAdmit debits the request's lease buckets (st.lease). A bucket
// known empty rejects the request at once; a bucket the allowance cannot
// cover makes the request wait for the next lease call (or, when the
// request makes an exact call anyway, or the host has no ticks, joins that
// call as an exact take): its grant, or its failure (on_error), decides.
// Whatever rejects the request gives back what the others took. The rules
// for the exact call go to st.exact, for the cluster stage.
func (s *Stream) leaseAdmit(st *reqState) Action {
	p := s.p
	g, req, now := &st.lease, &st.req, st.now
	if s.costOverBurst(st, g) {
		return Pause
	}
	st.debits = st.debits[:0]
	var (
		empty      *rule
		emptyRetry float64
		short      []int    // rules the allowance cannot cover
		seqs       []uint32 // the Claimer each was counted under
		broken     []int    // rules whose shared data failed: exact calls
	)
	// The request waits for its process's call unless it makes an exact
	// call anyway, or the host cannot resume it.
	canWait := p.lease.refill > 0 && p.timer.usable() && len(st.cluster.reqs) == 0 && len(p.lease.waiters) < maxLeaseWaiters
	for i, r := range g.rules {
		lr := &g.reqs[i]
		out, retry, seq := p.leaseTake(&st.debits, lr.Key, lr.Cost, now, p.leaseAskNew(lr.Key, canWait && !r.Shadow), 0)
		if out != leaseAdmitted && out != leaseBroken {
			p.leaseRemember(r, lr.Key, lr.Owner)
		}
		if r.Shadow {
			// Observed, never enforced: counted, and never waits.
			if out == leaseAdmitted {
				r.metrics.allowed.inc(p.host, 1)
			} else {
				r.metrics.shadowRejected.inc(p.host, 1)
			}
			continue
		}
		switch out {
		case leaseAdmitted:
			r.metrics.allowed.inc(p.host, 1)
		case leaseEmpty:
			if empty == nil || retry > emptyRetry {
				empty, emptyRetry = r, retry
			}
		case leaseShort:
			short = append(short, i)
			seqs = append(seqs, seq)
		case leaseBroken:
			broken = append(broken, i)
		}
	}
	if empty == nil && len(short) == 0 && len(broken) == 0 {
		return Continue
	}
	pc := &pendingCall{s: s, now: now, idHash: req.identityHash(), local: st.enforce.reqs, lease: st.debits}
	if ct, ok := req.header("content-type"); ok && IsGRPC(ct) {
		pc.grpc = true
	}
	if empty != nil || len(broken) > 0 {
		for k, i := range short {
			if canWait && !g.rules[i].Shadow {
				p.leaseUncount(g.reqs[i].Key, g.reqs[i].Cost, seqs[k])
			}
		}
	}
	if empty != nil {
		empty.metrics.rejected.inc(p.host, 1)
		s.refundLocal(pc)
		status := rlscontract.Status{Code: rlscontract.CodeOverLimit, UntilReset: emptyRetry}
		s.sendClusterRejection(pc, empty, status, retryAfterHash(emptyRetry, pc.idHash), nil)
		return Pause
	}
	if len(broken) == 0 && canWait {
		return s.leaseWait(pc, g, short, seqs, now)
	}
	// An exact take for each, in the call the request makes: its cluster
	// rules' call, or one of its own.
	c := &st.exact
	for _, i := range append(short, broken...) {
		lr := &g.reqs[i]
		c.rules = append(c.rules, g.rules[i])
		c.reqs = append(c.reqs, altRequest(lr))
		c.vals = append(c.vals, g.vals[i])
	}
	return Continue
}

// altRequest is the shared-data bucket of a lease rule's request: the one
// on_error: local falls back to (Key is the tb: key, no owner).
func altRequest(lr *sharedstate.Request) sharedstate.Request {
	cr := *lr
	cr.Key, cr.Alt, cr.Owner = lr.Alt, "", ""
	return cr
}

// leaseWait pauses the request until the allowances of its rules short are
// refilled (seqs: the Claimer each was counted under): the next tick asks
// for the refill, and every request waiting for it shares the answer.
func (s *Stream) leaseWait(pc *pendingCall, g *group, short []int, seqs []uint32, now float64) Action {
	p := s.p
	rls := p.cfg.Settings.RLS
	pc.local = cloneReqs(pc.local)
	pc.lease = cloneDebits(pc.lease)
	// The refill is asked for at once, or at the end of the refill
	// period, and answered (or failed) within the timeout: past a period
	// more, a call was lost without a callback. Calls that fail are
	// followed by one a period later until they have failed for
	// lease_fallback_ms: the first failure comes within that wait, and
	// on_error within another after the fallback time.
	wait := 2*rls.LeaseTickMs + rls.TimeoutMs
	if rls.LeaseFallbackMs > 0 {
		wait = rls.LeaseFallbackMs + 2*wait
	}
	w := &leaseWaiter{s: s, id: s.id, pc: pc, deadline: now + float64(wait)/1000}
	for k, i := range short {
		lr := &g.reqs[i]
		b := p.leaseRemember(g.rules[i], lr.Key, lr.Owner)
		if b == nil {
			b = &leaseBucket{r: g.rules[i], key: strings.Clone(lr.Key), comp: strings.Clone(lr.Owner)}
		}
		alt := cloneReqs([]sharedstate.Request{altRequest(lr)})[0]
		w.items = append(w.items, leaseItem{b: b, cost: lr.Cost, alt: alt, seq: seqs[k]})
	}
	p.lease.waiters = append(p.lease.waiters, w)
	p.leaseSetPeriod()
	return Pause
}

func cloneDebits(ds []leaseDebit) []leaseDebit {
	out := make([]leaseDebit, len(ds))
	for i, d := range ds {
		d.key = strings.Clone(d.key)
		out[i] = d
	}
	return out
}

// leaseRefund gives back the allowance a request took when another rule
// rejected it (all-or-nothing), if no lease request was sent since the
// debit and the grant is the same: the tokens are then still covered by
// the service's record of that grant. Otherwise they stay spent, which
// only costs capacity.
func (p *Plugin) leaseRefund(ds []leaseDebit) {
	if len(ds) == 0 {
		return
	}
	now := p.time()
	for _, d := range ds {
		_, _, _ = p.lease.upd.Update(d.key, func(rec *sharedstate.LeaseRecord) bool {
			if d.taken {
				// Back to the exact take it came from, for the requests
				// it was taken for; another take replaced it: lost.
				if rec.TakenSeq != d.seq {
					return false
				}
				rec.Taken += d.cost
				return true
			}
			if rec.Grant != d.grant || rec.Expiry != d.expiry || rec.Claimer != d.seq || now >= rec.Expiry {
				return false
			}
			rec.Tokens += d.cost
			return true
		})
	}
}

// leaseRetry tries a waiting request's allowances again and reports
// whether it still waits; if not, w.outcome says how it ends.
func (p *Plugin) leaseRetry(w *leaseWaiter, now float64) bool {
	if w.s.id != w.id || w.s.st.ended {
		w.outcome = waitGone // the stream ended (and may be reused)
		p.leaseStopWaiting(w)
		return false
	}
	down, waiting := false, false
	for i := range w.items {
		it := &w.items[i]
		if it.done {
			continue
		}
		if p.leaseStillShort(it.b, it, now) {
			waiting = true
			continue
		}
		out, retry, seq := p.leaseTake(&w.pc.lease, it.b.key, it.cost, now, askWaiting, it.seq)
		it.b.seen = 0 // changed: read it again
		switch out {
		case leaseRecount:
			it.seq = seq
			waiting = true
		case leaseAdmitted:
			it.done = true // leaseTake appended its debit to w.pc.lease
			it.b.r.metrics.allowed.inc(p.host, 1)
		case leaseEmpty:
			if w.empty == nil || retry > w.retry {
				w.empty, w.retry = it.b.r, retry
			}
		case leaseDown, leaseBroken:
			down = true
		default:
			waiting = true
		}
	}
	switch {
	case w.empty != nil:
		w.outcome = waitEmpty
	case down:
		w.outcome = waitDown
	case !waiting:
		w.outcome = waitAdmitted
		return false
	case now >= w.deadline:
		w.outcome = waitLate
		if r := p.leaseStarved(w, now); r != nil {
			w.outcome, w.empty, w.retry = waitEmpty, r, float64(p.lease.refill)/1000
		}
	default:
		return true
	}
	p.leaseStopWaiting(w)
	return false
}

// leaseStarved returns the rule that turns away a request that waited
// its deadline while the service has not been failing for
// lease_fallback_ms: the calls it waited for were answered (or failed
// only now and then), and the fleet's bucket gave its process less than
// its demand. It gets 429: on_error (allow, or local: this proxy's own
// bucket) would admit beyond the fleet's limit. nil: on_error decides
// (the service failing, or lease_fallback_ms 0).
func (p *Plugin) leaseStarved(w *leaseWaiter, now float64) *rule {
	fallback := float64(p.cfg.Settings.RLS.LeaseFallbackMs) / 1000
	if fallback == 0 {
		return nil
	}
	var r *rule
	for i := range w.items {
		if it := &w.items[i]; !it.done {
			v, _, err := p.store.Get(it.b.key)
			if err != nil {
				return nil
			}
			rec, err := sharedstate.ParseLeaseRecord(v)
			if err != nil || rec.Down > 0 && now-rec.Down >= fallback {
				return nil
			}
			r = it.b.r
		}
	}
	return r
}

// leaseStopWaiting uncounts the allowances a request that is done waiting
// without being admitted still waited for.
func (p *Plugin) leaseStopWaiting(w *leaseWaiter) {
	for i := range w.items {
		if it := &w.items[i]; !it.done && !it.uncounted {
			p.leaseUncount(it.b.key, it.cost, it.seq)
			it.uncounted = true
		}
	}
}

// leaseStillShort reports whether b's allowance, read once per pass,
// certainly cannot cover cost while its global bucket is not known empty
// nor its service failing: the request then keeps waiting, with no
// compare-and-swap.
func (p *Plugin) leaseStillShort(b *leaseBucket, it *leaseItem, now float64) bool {
	if b.seen != p.lease.pass {
		b.seen, b.left, b.taken = p.lease.pass, -1, 0
		v, _, err := p.store.Get(b.key)
		if err != nil {
			return false
		}
		rec, err := sharedstate.ParseLeaseRecord(v)
		if err != nil || now < rec.Retry || rec.Down > 0 {
			return false
		}
		b.left, b.taken, b.takenSeq = rec.Spendable(now), rec.Taken, rec.TakenSeq
	}
	if b.taken > 0 && b.takenSeq == nextClaim(it.seq) {
		return false // an exact take was made for it: leaseTake decides
	}
	return b.left >= 0 && b.left < it.cost
}

// leaseFinish answers a request that is done waiting: resumed, 429 (a
// global bucket known empty), or on_error (the service failing, or no
// refill in time).
func (p *Plugin) leaseFinish(w *leaseWaiter) {
	if w.outcome == waitGone {
		return // the client left: its tokens stay spent
	}
	if !p.caller.SetEffectiveContext(w.id) {
		w.s.dropHold(true) // gone: never continued
		return
	}
	s, pc := w.s, w.pc
	switch w.outcome {
	case waitEmpty:
		w.empty.metrics.rejected.inc(p.host, 1)
		s.refundLocal(pc)
		st := rlscontract.Status{Code: rlscontract.CodeOverLimit, UntilReset: w.retry}
		s.sendClusterRejection(pc, w.empty, st, retryAfterHash(w.retry, pc.idHash), nil)
	case waitDown, waitLate:
		reason := "lease: the rate-limit service is failing"
		if w.outcome == waitLate {
			reason = "lease: no refill in time"
		}
		for i := range w.items {
			if !w.items[i].done {
				pc.rules = append(pc.rules, w.items[i].b.r)
				pc.buckets = append(pc.buckets, w.items[i].alt)
			}
		}
		s.clusterFailed(pc, reason, true)
	default:
		s.proceed(pc)
	}
}
