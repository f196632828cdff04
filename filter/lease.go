package filter

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// Lease mode (docs/lease.md): a cluster rule with "mode": "lease" is
// decided from this process's allowance of tokens leased from the global
// bucket, kept in shared data. The allowance is refilled by one lease call
// per bucket and process at a time, from proxy_on_tick: once a refill
// period, and at once (the next tick, 1 ms on) when a request finds it
// spent; such a request waits for that call, and every request arriving
// meanwhile shares it, so the calls do not grow with the request rate.
// A process that holds no lease (cold) does not take one for a request or
// two: the call the waiting requests share is then an exact take of their
// total cost, which leaves nothing held; leasing starts when requests keep
// coming within a refill period of it.

// Limits and tuning of lease mode; a lease call's descriptor is
// rlscontract.LeaseDescriptor (docs/lease.md, "Wire protocol").
const (
	maxLeaseBuckets       = 4096
	maxLeaseWaiters       = 4096 // requests one worker holds for refills
	leaseClaimSlack       = 1.0  // seconds a claim outlives its call's timeout
	leaseIdleForgetFactor = 2    // forget an empty, idle bucket after this many TTLs
	// leasePollMs is the tick period while requests wait for a refill:
	// they are resumed by the worker that applies it, or by their own
	// worker's next tick.
	leasePollMs = 1
	// leaseHeadroom: an allowance is sized for a tick plus a round trip at
	// this many times the observed rate, so that a rate that grows within
	// a tick does not run it dry before the next refill.
	leaseHeadroom = 2
	// leaseMinRTT is the smallest round trip sample kept (a clock that
	// did not move between the call and its answer).
	leaseMinRTT = 1e-4
)

// leaseBucket is a bucket this worker has seen and whose allowance its ticks
// look after (shared data cannot be listed).
type leaseBucket struct {
	r    *rule
	key  string // the allowance key, tl:{rule}:{composite}
	comp string // the composite key sent to the service
	// calling is set while this worker's lease call for it is in flight;
	// mark dedupes the refills asked for in one pass over the waiters.
	calling bool
	mark    uint64
	// seen is the pass in which left (the spendable tokens, -1 when the
	// bucket is known empty or its service failing) and the last exact
	// take's tokens (taken, takenSeq) were read: waiters that they cannot
	// cover skip their compare-and-swap in that pass.
	seen     uint64
	left     float64
	taken    float64
	takenSeq uint32
}

// leaseCall is a lease request in flight.
type leaseCall struct {
	b *leaseBucket
	// seq is the claim's sequence number (LeaseRecord.Claimer).
	seq     uint32
	sent    float64
	unspent float64 // the report: tokens held when the call was sent
	want    float64 // new tokens asked for (an exact take: its cost)
	release bool
	// exact is an exact take (no holder) for the requests counted in
	// LeaseRecord.Wait when the claim pool was made; retake is the take
	// of what the global bucket had left that follows an exact take
	// refused for more than that.
	exact, retake bool
	pool          uint32
}

// leaseDebit is a request's debit of one allowance, kept to give it back if
// another rule rejects the request (leaseRefund). taken marks a debit of an
// exact take's tokens (LeaseRecord.Taken), seq then being its TakenSeq.
type leaseDebit struct {
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

// leaseState is a plugin's lease-mode state.
type leaseState struct {
	holder  string
	buckets []*leaseBucket
	waiters []*leaseWaiter
	// debits are the current request's debits (scratch).
	debits []leaseDebit
	pass   uint64
	upd    sharedstate.LeaseUpdater
	// refill is the refill period in ms (0: no lease rule, or a host
	// without ticks or callouts). tick is lease mode's entry in the
	// plugin's timer (timer.go), armed while refill is not 0: its deadline
	// is when the periodic refill is due; it keeps the tick every refill
	// ms, or every leasePollMs, polled at every tick, while requests wait
	// (leaseSetPeriod).
	refill uint32
	tick   timerEntry
}

// leaseConfigure resets the worker's lease state for a new configuration
// and starts ticks if a rule is in lease mode.
func (p *Plugin) leaseConfigure(cfg *config.Config) {
	p.lease.buckets = p.lease.buckets[:0]
	p.lease.upd.Store = p.store
	p.lease.upd.MaxAttempts = cfg.Settings.MaxAttempts
	p.lease.upd.Backoff = p.upd.Backoff
	leases := false
	for _, r := range cfg.Rules() {
		leases = leases || r.Lease != nil
	}
	if cfg.Settings.RLS == nil && len(p.lease.waiters) > 0 {
		// No service to ask any more, and no cluster rule to decide:
		// the waiting requests go on, as the new configuration admits.
		for _, w := range p.lease.waiters {
			if w.s.id == w.id && !w.s.ended && p.caller.SetEffectiveContext(w.id) {
				w.s.proceed(w.pc)
			}
		}
		clear(p.lease.waiters)
		p.lease.waiters = p.lease.waiters[:0]
	}
	// Without callouts nothing can be refilled, and without a timer
	// nothing resumes a request that waits: each request short of
	// allowance makes its own call, or takes on_error.
	p.lease.refill = 0
	if leases && p.caller != nil && p.timer.usable() {
		p.lease.refill = cfg.Settings.RLS.LeaseTickMs
	}
	p.leaseSetPeriod()
}

// leaseOutcome is what an allowance said about one request.
type leaseOutcome int

const (
	leaseAdmitted leaseOutcome = iota
	leaseEmpty                 // the global bucket is known empty
	leaseShort                 // not enough allowance: a refill decides
	leaseDown                  // not enough, and the service is failing
	leaseBroken                // shared data failed
)

// nextClaim is the claim sequence number that follows seq (0 is skipped).
func nextClaim(seq uint32) uint32 {
	if seq++; seq == 0 {
		seq = 1
	}
	return seq
}

// leaseTake debits cost from the allowance under key if it holds that
// much, appending the debit to p.lease.debits. Otherwise it says why
// (leaseDown: a lease call failed after failedSince), and with demand (a
// new request) adds cost to the demand the refill is sized from, and with
// wait to Wait as well, returning the Claimer it was counted under.
//
// A request that waits (counted, with the Claimer seq it was counted
// under) spends first from the tokens of the exact take claimed for it.
func (p *Plugin) leaseTake(key string, cost, now, failedSince float64, demand, wait, counted bool, seq uint32) (leaseOutcome, float64, uint32) {
	out := leaseShort
	var retry float64
	var d leaseDebit
	_, _, err := p.lease.upd.Update(key, func(rec *sharedstate.LeaseRecord) bool {
		if counted && rec.Taken >= cost && rec.TakenSeq == nextClaim(seq) {
			// Taken for this request: counted already.
			out = leaseAdmitted
			d = leaseDebit{key: key, cost: cost, seq: rec.TakenSeq, taken: true}
			rec.Taken -= cost
			return true
		}
		switch {
		case rec.Spendable(now) >= cost:
			out = leaseAdmitted
			d = leaseDebit{key: key, cost: cost, grant: rec.Grant, expiry: rec.Expiry, seq: rec.Claimer}
			rec.Tokens -= cost
			if counted && rec.Claimer == seq {
				// No call counted it yet: no exact take is for it.
				rec.Wait = math.Max(0, rec.Wait-cost)
			}
		case now < rec.Retry:
			out, retry = leaseEmpty, rec.Retry-now
			return false
		case rec.Down > failedSince:
			out = leaseDown
		default:
			out = leaseShort
		}
		if out != leaseAdmitted && !demand {
			return false
		}
		if rec.Used == 0 {
			// The demand window starts at the first request since the
			// last refill, not at the refill: an idle spell must not
			// dilute the rate the next lease is sized from.
			rec.Since = now
		}
		rec.Used += cost
		if out == leaseShort && wait {
			rec.Wait += cost
			seq = rec.Claimer
		}
		return true
	})
	if err != nil {
		return leaseBroken, 0, 0
	}
	if out == leaseAdmitted {
		p.lease.debits = append(p.lease.debits, d)
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
	p.lease.debits = p.lease.debits[:0]
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
		out, retry, seq := p.leaseTake(lr.Key, lr.Cost, now, math.Inf(1), true, canWait && !r.Shadow, false, 0)
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
	pc := &pendingCall{s: s, now: now, idHash: req.identityHash(), local: st.enforce.reqs, lease: p.lease.debits}
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
		st := rlscontract.Status{Code: rlscontract.CodeOverLimit, UntilReset: emptyRetry}
		s.sendClusterRejection(pc, empty, st, retryAfterHash(emptyRetry, pc.idHash), nil)
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
	w := &leaseWaiter{s: s, id: s.id, pc: pc,
		// The refill is asked for at once, or at the end of the refill
		// period, and answered (or failed) within the timeout: past a
		// period more, a call was lost without a callback.
		deadline: now + float64(2*rls.LeaseTickMs+rls.TimeoutMs)/1000}
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
	now := p.Clock()
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

// leaseSetPeriod arms lease mode's timer entry while a lease rule exists:
// the tick every refill period, or, while requests wait, every leasePollMs
// with the entry due at every tick; and stops it when none does. A timer
// the host refuses leaves lease mode without ticks (refill 0).
func (p *Plugin) leaseSetPeriod() {
	e := &p.lease.tick
	if p.lease.refill == 0 {
		if e.armed() {
			p.timer.stop(e, p.Clock())
		}
		return
	}
	every, poll := p.lease.refill, false
	if len(p.lease.waiters) > 0 {
		every, poll = leasePollMs, true
	}
	if e.armed() && e.every == every && e.poll == poll {
		return
	}
	e.every, e.poll, e.owner = every, poll, (*Plugin).leaseOnTick
	if !p.timer.arm(e, p.Clock()) {
		p.lease.refill = 0
	}
}

// leaseServe retries the waiting requests, in arrival order, asks for a
// refill of every bucket some request still waits for (and, with
// periodic, runs the periodic refills), then answers the requests that are
// done waiting.
//
// Every lease call is dispatched before any stream is made effective: in
// Envoy a call belongs to the effective context, and a stream's calls are
// cancelled when it ends (Context::~Context), so a call made after
// proxy_set_effective_context(stream) would die with that stream.
func (p *Plugin) leaseServe(now float64, periodic bool) {
	var done []*leaseWaiter
	p.lease.pass++
	if len(p.lease.waiters) > 0 {
		kept := p.lease.waiters[:0]
		for _, w := range p.lease.waiters {
			if p.leaseRetry(w, now) {
				kept = append(kept, w)
			} else {
				done = append(done, w)
			}
		}
		for i := len(kept); i < len(p.lease.waiters); i++ {
			p.lease.waiters[i] = nil
		}
		p.lease.waiters = kept
	}
	if periodic {
		kept := p.lease.buckets[:0]
		for _, b := range p.lease.buckets {
			if p.leaseTick(b, now, false) {
				kept = append(kept, b)
			}
		}
		for i := len(kept); i < len(p.lease.buckets); i++ {
			p.lease.buckets[i] = nil
		}
		p.lease.buckets = kept
	}
	for _, w := range p.lease.waiters {
		for i := range w.items {
			if b := w.items[i].b; !w.items[i].done && b.mark != p.lease.pass {
				b.mark = p.lease.pass
				p.leaseTick(b, now, true)
			}
		}
	}
	for _, w := range done {
		p.leaseFinish(w)
	}
	p.leaseSetPeriod()
}

// leaseRetry tries a waiting request's allowances again and reports
// whether it still waits; if not, w.outcome says how it ends.
func (p *Plugin) leaseRetry(w *leaseWaiter, now float64) bool {
	if w.s.id != w.id || w.s.ended {
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
		p.lease.debits = p.lease.debits[:0]
		out, retry, _ := p.leaseTake(it.b.key, it.cost, now, w.pc.now, false, false, true, it.seq)
		it.b.seen = 0 // changed: read it again
		switch out {
		case leaseAdmitted:
			it.done = true
			w.pc.lease = append(w.pc.lease, p.lease.debits[0])
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
	default:
		return true
	}
	p.leaseStopWaiting(w)
	return false
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
			reason = "lease: no refill within lease_tick_ms + timeout_ms"
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

// leaseRemember adds a bucket to the ones this worker's ticks refill and
// returns it (nil when the worker already looks after too many).
func (p *Plugin) leaseRemember(r *rule, key, comp string) *leaseBucket {
	for _, b := range p.lease.buckets {
		if b.key == key {
			return b
		}
	}
	if len(p.lease.buckets) >= maxLeaseBuckets {
		return nil // another worker, or a later request, will
	}
	b := &leaseBucket{r: r, key: strings.Clone(key), comp: strings.Clone(comp)}
	p.lease.buckets = append(p.lease.buckets, b)
	return b
}

// leaseKnownEmpty records that the global bucket of a lease rule is empty
// until now+wait (an exact call was rejected).
func (p *Plugin) leaseKnownEmpty(key string, now, wait float64) {
	_, _, _ = p.lease.upd.Update(key, func(rec *sharedstate.LeaseRecord) bool {
		if now+wait <= rec.Retry {
			return false
		}
		rec.Retry = now + wait
		return true
	})
}

// leaseOnTick runs from proxy_on_tick (OnTick), before anything there
// makes a stream effective (see leaseServe): it retries the waiting
// requests and asks for the refills they need, and once a refill period it
// refills or releases the allowances of the lease buckets it has seen.
func (p *Plugin) leaseOnTick(now float64) {
	if p.lease.refill == 0 || p.cfg == nil || p.cfg.Settings.RLS == nil {
		return
	}
	e := &p.lease.tick
	periodic := now >= e.deadline
	if periodic {
		// 0.9: a tick that comes a little early still refills.
		e.deadline = now + 0.9*float64(p.lease.refill)/1000
	}
	p.leaseServe(now, periodic)
}

// leaseSize returns the allowance to aim for: enough for a refill period
// plus a round trip at leaseHeadroom times the local rate observed since
// the last refill (0 without demand), at most lease_max.
func leaseSize(rec *sharedstate.LeaseRecord, l *config.LeaseConfig, tick, timeout, now float64) float64 {
	if rec.Used <= 0 {
		return 0
	}
	rate := rec.Used / math.Max(now-rec.Since, tick)
	return math.Min(ceilTokens(leaseHeadroom*rate*(tick+leaseRTT(rec, timeout))), l.Max)
}

// ceilTokens rounds x up to whole tokens, ignoring float noise (0.1 +
// 0.05 is not quite 0.15).
func ceilTokens(x float64) float64 { return math.Ceil(x - 1e-9) }

// leaseRTT is the round trip a refill is sized for: twice the measured
// one, at most the timeout (the timeout itself before any was measured).
func leaseRTT(rec *sharedstate.LeaseRecord, timeout float64) float64 {
	if rec.RTT <= 0 {
		return timeout
	}
	return math.Min(2*rec.RTT, timeout)
}

// leaseTick looks after one bucket and reports whether to keep it. urgent
// is a call that requests wait for: it is sent at once unless a call is in
// flight, the bucket is known empty, the service failing, or the last call
// was less than a refill period ago and not granted in full.
//
// The process leases only while it shows demand a lease serves. Cold (no
// live grant, and no call granted in full within the refill period), the
// call for the waiting requests is an exact take of their total cost
// (Wait), which leaves nothing held; so is a call for more than lease_max
// could hold. Warm, it is a lease request for at least twice the allowance
// the last full grant or take aimed for, so that calls that follow each
// other within a period are few (the allowance doubles each time, up to
// lease_max). The periodic refill renews only a live grant (or a shadow
// rule's, whose requests never wait).
func (p *Plugin) leaseTick(b *leaseBucket, now float64, urgent bool) bool {
	if b.calling {
		return true
	}
	rls := p.cfg.Settings.RLS
	l := b.r.Lease
	tick := float64(rls.LeaseTickMs) / 1000
	timeout := float64(rls.TimeoutMs) / 1000
	const (
		none = iota
		renew
		release
		forget
		roll
		exact
	)
	act := none
	var want, unspent float64
	var grant uint64
	var seq uint32
	_, wrote, err := p.lease.upd.Update(b.key, func(rec *sharedstate.LeaseRecord) bool {
		act = none
		if rec.Claim > now || now < rec.Retry {
			return false
		}
		// One call per refill period and process: the periodic refill
		// waits for the period's end (less a tenth, for ticks that come
		// a little early), a request's call for all of it, unless the
		// last call was granted in full (a ramp).
		switch {
		case urgent && rec.Ramp > 0:
		case urgent && now < rec.Hold, !urgent && now < rec.Hold-0.1*tick:
			return false
		}
		u := rec.Spendable(now)
		live := rec.Grant != 0 && now < rec.Expiry
		warm := live || rec.Ramp > 0 && now < rec.Hold
		target := leaseSize(rec, l, tick, timeout, now)
		horizon := tick + leaseRTT(rec, timeout)
		demand := rec.Used > 0
		switch {
		case urgent && rec.Wait > 0 && (!warm || rec.Wait > l.Max):
			if rec.Taken > 0 && now < rec.Hold {
				// The last take's tokens are still some waiting
				// requests' (other workers resume them at their next
				// tick): one take at a time.
				return false
			}
			act = exact
			want = ceilTokens(rec.Wait)
		case urgent:
			act = renew
			target = math.Min(math.Max(target, 2*rec.Ramp), l.Max)
			want = math.Max(1, ceilTokens(target-u))
		case !live && !b.r.Shadow:
			// Holding no lease: requests that find nothing wait, and
			// their calls take what they need.
			if now-rec.Since >= leaseIdleForgetFactor*l.TTL {
				act = forget
			}
			return false
		case demand && (u < target || rec.Expiry-now < horizon+tick):
			act = renew
			want = math.Max(0, ceilTokens(target-u))
		case demand && now-rec.Since >= tick:
			// Enough held: the demand window starts again, so that the
			// next refill is sized from recent demand, and an idle
			// bucket is seen idle.
			act = roll
			rec.Used, rec.Since = 0, now
			return true
		case !demand && u > 0 && now-rec.Since >= l.TTL/2:
			act = release
		case !demand && u == 0 && now-rec.Since >= leaseIdleForgetFactor*l.TTL:
			act = forget
			return false
		default:
			return false
		}
		unspent, grant = sharedstateFloor(u), rec.Grant
		rec.Claimer = nextClaim(rec.Claimer)
		seq = rec.Claimer
		rec.Claim = now + timeout + leaseClaimSlack
		rec.Hold = now + tick
		rec.Used, rec.Since, rec.Wait = 0, now, 0
		rec.Tokens = u // expired tokens are worthless
		if act == release {
			// Nobody spends what is being returned, and the bucket is
			// cold again.
			rec.Tokens, rec.Expiry = 0, 0
		}
		return true
	})
	switch {
	case err != nil:
		p.warnf(now, "event=lease_error rule="+b.r.Name+" reason="+strconv.Quote(err.Error()))
		return true
	case act == forget:
		return false
	case !wrote || act == roll:
		return true
	}
	lc := &leaseCall{b: b, seq: seq, sent: now, unspent: unspent, want: want, release: act == release}
	if act == exact {
		lc.unspent, lc.exact, lc.pool = 0, true, seq
	}
	p.leaseDispatch(lc, grant, now)
	return true
}

// leaseDispatch sends lc (its claim is made) and records it in flight; a
// call that cannot be sent fails at once.
func (p *Plugin) leaseDispatch(lc *leaseCall, grant uint64, now float64) {
	b := lc.b
	token, err := p.leaseSend(b, lc, grant)
	if err != nil {
		p.metrics.rlsErrors.inc(p.host, 1)
		p.warnf(now, "event=rls_error rule="+b.r.Name+" reason="+strconv.Quote("lease dispatch: "+err.Error()))
		p.leaseApply(lc, now, nil, 0)
		return
	}
	b.calling = true
	p.callouts.add(token, lc.answered)
	p.metrics.leaseCalls.inc(p.host, 1)
}

// sharedstateFloor floors x to the 6 decimals the service is told.
func sharedstateFloor(x float64) float64 { return math.Floor(x*1e6) / 1e6 }

// leaseSend dispatches a lease request, release or exact take for b.
func (p *Plugin) leaseSend(b *leaseBucket, lc *leaseCall, grant uint64) (uint32, error) {
	caller := p.caller
	if caller == nil {
		return 0, errNoCallouts
	}
	// want is whole (ceilTokens, or an allowance's whole tokens left).
	l := rlscontract.Lease{Rule: b.r.Name, Composite: b.comp, Want: uint64(lc.want)}
	if !lc.exact {
		// An exact take has no holder and its cost in hits_addend, as a
		// request's exact call takes from a lease bucket.
		l.Holder, l.Grant, l.Unspent, l.Release = p.leaseHolder(), grant, lc.unspent, lc.release
	}
	return callRLS(caller, p.cfg.Settings.RLS, []rlscontract.Descriptor{rlscontract.LeaseDescriptor(l)})
}

type constError string

func (e constError) Error() string { return string(e) }

const errNoCallouts = constError("the host has no HTTP callouts")

// leaseHolder returns this process's holder id, creating it in shared data
// on first use; a worker without shared data uses its own.
func (p *Plugin) leaseHolder() string {
	if p.lease.holder != "" {
		return p.lease.holder
	}
	mine := strconv.AppendUint(nil, rand.Uint64()|1<<60, 16)
	v, err := sharedstate.LoadOrCreate(p.store, sharedstate.LeaseHolderKey, mine)
	if err != nil || len(v) == 0 {
		v = mine
	}
	p.lease.holder = string(v)
	return p.lease.holder
}

// leaseAnswer reads the service's answer to a lease call (or its failure),
// applies it, and serves the requests of this worker that wait for it.
func (p *Plugin) leaseAnswer(lc *leaseCall, numHeaders, bodySize int) {
	lc.b.calling = false
	now := p.Clock()
	resp, reason := p.readRLS(numHeaders, bodySize)
	var st *rlscontract.Status
	if reason == "" {
		switch {
		case len(resp.Statuses) != 1:
			reason = "lease answer with " + strconv.Itoa(len(resp.Statuses)) + " statuses"
		case !lc.release && !lc.exact && !resp.Statuses[0].HasQuota:
			reason = "lease answer without a quota"
		default:
			st = &resp.Statuses[0]
		}
	}
	var id uint64
	if st != nil && st.HasQuota && !lc.exact {
		n, err := strconv.ParseUint(st.Quota.ID, 10, 64)
		if err != nil || n == 0 {
			st, reason = nil, "lease grant id "+strconv.Quote(st.Quota.ID)
		}
		id = n
	}
	if st == nil {
		p.metrics.rlsErrors.inc(p.host, 1)
		p.warnf(now, "event=rls_error rule="+lc.b.r.Name+" reason="+strconv.Quote("lease: "+reason))
	}
	if retake := p.leaseApply(lc, now, st, id); retake != nil {
		p.leaseDispatch(retake, 0, now)
	}
	p.leaseServe(now, false)
}

// leaseApply applies the answer st to a lease call (nil: the call failed),
// if the record still names the call's claim (otherwise a later claim
// replaced it, and the answer is dropped: the service keeps counting that
// grant until it expires, which only costs capacity).
//
// The answer's Quota.requests is the new grant's whole amount: what the
// service carried over of the reported unspent tokens plus the new ones.
// The proxy holds that amount less what it spent since it sent the report
// (docs/lease.md): never a token the service does not count, even when it
// carried over less than reported (a report naming a grant that is gone).
//
// An exact take's tokens are the waiting requests' it was claimed for
// (Taken, TakenSeq); a take refused because the bucket had fewer tokens
// than asked, but some, is followed by a take of what it had (returned,
// its claim made: the caller sends it), so that the requests it can cover
// are not turned away.
func (p *Plugin) leaseApply(lc *leaseCall, now float64, st *rlscontract.Status, grant uint64) (retake *leaseCall) {
	l := lc.b.r.Lease
	rtt := math.Max(now-lc.sent, leaseMinRTT)
	_, wrote, _ := p.lease.upd.Update(lc.b.key, func(rec *sharedstate.LeaseRecord) bool {
		retake = nil
		if rec.Claimer != lc.seq || rec.Claim == 0 {
			return false
		}
		rec.Claim = 0
		if st == nil {
			// Failed: the requests waiting for this call meet on_error;
			// the next call goes out once the refill period is over, and
			// those arriving meanwhile wait for it (a blip costs no
			// more than the requests that waited for the failed call).
			rec.Down, rec.Ramp = now, 0
			return true
		}
		if rec.RTT == 0 {
			rec.RTT = rtt
		} else {
			rec.RTT = 0.75*rec.RTT + 0.25*rtt
		}
		rec.Down = 0
		if lc.release {
			rec.Hold, rec.Ramp = 0, 0
			return true
		}
		if lc.exact {
			left := float64(st.LimitRemaining)
			switch {
			case st.Code != rlscontract.CodeOverLimit:
				rec.Taken, rec.TakenSeq = lc.want, lc.pool
				rec.Ramp = lc.want
				if lc.retake {
					// The bucket had less than the waiting requests
					// needed, and now has nothing: the rest get 429 until
					// the period ends.
					rec.Ramp = 0
					retry := rec.Hold
					if retry <= now {
						retry = now + float64(p.cfg.Settings.RLS.LeaseTickMs)/1000
					}
					rec.Retry = math.Max(rec.Retry, retry)
				}
			case !lc.retake && left >= 1 && left < lc.want:
				rec.Ramp = 0
				rec.Claimer = nextClaim(rec.Claimer)
				rec.Claim = now + float64(p.cfg.Settings.RLS.TimeoutMs)/1000 + leaseClaimSlack
				retake = &leaseCall{b: lc.b, seq: rec.Claimer, sent: now, want: left, exact: true, retake: true, pool: lc.pool}
			default:
				rec.Ramp = 0
				rec.Retry = math.Max(rec.Retry, now+st.UntilReset)
			}
			return true
		}
		total := float64(st.Quota.Requests)
		spent := lc.unspent - math.Min(rec.Tokens, lc.unspent) // since the report
		rec.Tokens = math.Max(0, total-spent)
		rec.Expiry = lc.sent + l.TTL
		rec.Grant = grant
		// The new tokens, if all the report was carried over (whole
		// tokens are).
		granted := total - math.Floor(lc.unspent)
		empty := st.Code == rlscontract.CodeOverLimit || lc.want > 0 && granted < lc.want && st.LimitRemaining == 0
		switch {
		case empty:
			// The global bucket is (about) empty: 429 locally until the
			// next refill period, not a call per request.
			rec.Ramp = 0
			retry := rec.Hold
			if st.Code == rlscontract.CodeOverLimit {
				retry = math.Max(retry, now+st.UntilReset)
			}
			rec.Retry = math.Max(rec.Retry, retry)
		case granted >= lc.want:
			rec.Ramp = lc.unspent + lc.want
		default:
			rec.Ramp = 0
		}
		return true
	})
	if !wrote {
		return nil
	}
	return retake
}
