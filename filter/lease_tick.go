package filter

import (
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/config"
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

const (
	maxLeaseBuckets       = 4096
	leaseIdleForgetFactor = 2 // forget an empty, idle bucket after this many TTLs
	// leasePollMs is the tick period while requests wait for a refill:
	// they are resumed by the worker that applies it, or by their own
	// worker's next tick.
	leasePollMs = 1
	// leaseHeadroom: an allowance is sized for a tick plus a round trip at
	// this many times the observed rate, so that a rate that grows within
	// a tick does not run it dry before the next refill.
	leaseHeadroom = 2
)

// leaseBucket is a bucket this worker has seen and whose allowance its ticks
// look after (shared data cannot be listed).
type leaseBucket struct {
	_    incomparable
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

// leaseState is a plugin's lease-mode state.
type leaseState struct {
	holder  string
	buckets []*leaseBucket
	waiters []*leaseWaiter
	pass    uint64
	upd     sharedstate.LeaseUpdater
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
			if w.s.id == w.id && !w.s.st.ended && p.caller.SetEffectiveContext(w.id) {
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

// leaseSetPeriod arms lease mode's timer entry while a lease rule exists:
// the tick every refill period, or, while requests wait, every leasePollMs
// with the entry due at every tick; and stops it when none does. A timer
// the host refuses leaves lease mode without ticks (refill 0).
func (p *Plugin) leaseSetPeriod() {
	e := &p.lease.tick
	if p.lease.refill == 0 {
		if e.armed() {
			p.timer.stop(e, p.time())
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
	if !p.timer.arm(e, p.time()) {
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

// leaseParams is what a refill decision needs of a lease rule and the
// service settings.
type leaseParams struct {
	tick    float64 // the refill period (settings.rls.lease_tick_ms), seconds
	timeout float64 // settings.rls.timeout_ms, seconds
	max     float64 // lease_max, tokens
	ttl     float64 // lease_ttl_ms, seconds
	// fallback is settings.rls.lease_fallback_ms, seconds: how long calls
	// must have failed before waiting requests get on_error.
	fallback float64
	shadow   bool // a rule of a shadow policy: its requests never wait
}

// leaseParamsOf returns the refill parameters of rule r under rls (nil:
// a configuration without a service, which an answer to a call made
// under the previous one may meet: tick and timeout 0).
func leaseParamsOf(r *rule, rls *config.RLSSettings) leaseParams {
	pp := leaseParams{max: r.Lease.Max, ttl: r.Lease.TTL, shadow: r.Shadow}
	if rls != nil {
		pp.tick = float64(rls.LeaseTickMs) / 1000
		pp.timeout = float64(rls.TimeoutMs) / 1000
		pp.fallback = float64(rls.LeaseFallbackMs) / 1000
	}
	return pp
}

// leaseSize returns the allowance to aim for: enough for a refill period
// plus a round trip at leaseHeadroom times the local rate observed since
// the last refill (0 without demand), at most lease_max.
func leaseSize(rec *sharedstate.LeaseRecord, pp leaseParams, now float64) float64 {
	if rec.Used <= 0 {
		return 0
	}
	rate := rec.Used / math.Max(now-rec.Since, pp.tick)
	return math.Min(ceilTokens(leaseHeadroom*rate*(pp.tick+leaseRTT(rec, pp.timeout))), pp.max)
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

// leaseAction is what a tick does for one lease bucket (leaseDecide).
type leaseAction uint8

const (
	leaseKeep    leaseAction = iota // nothing now: keep the bucket, record unchanged
	leaseRenew                      // claim a call: a lease request for want new tokens (0: renew the expiry)
	leaseExact                      // claim a call: an exact take of want tokens for the waiting requests
	leaseRelease                    // claim a call: give the unspent tokens back
	leaseRoll                       // restart the demand window: record written, no call
	leaseForget                     // forget the bucket (empty and idle): record unchanged
)

// calls reports whether a claims a lease call.
func (a leaseAction) calls() bool { return a == leaseRenew || a == leaseExact || a == leaseRelease }

// leaseDecide is the refill decision for one bucket at now, a pure function
// of its record: it returns what to do, the tokens to ask for (want) and
// the record to write (the same record for leaseKeep and leaseForget).
// urgent is a call that requests wait for: it is made at once unless a
// call is in flight, the bucket is known empty, or the last call was less
// than a refill period ago and not granted in full (a failed one is not).
//
// The process leases only while it shows demand a lease serves. Cold (no
// live grant, and no call granted in full within the refill period), the
// call for the waiting requests is an exact take of their total cost
// (Wait), which leaves nothing held; so is a call for more than lease_max
// could hold. Warm, it is a lease request for at least twice the allowance
// the last full grant or take aimed for, so that calls that follow each
// other within a period are few (the allowance doubles each time, up to
// lease_max). The periodic refill renews only a live grant (or a shadow
// rule's, whose requests never wait). A claim's record names the call
// (Claimer, Claim, Hold) and starts a new demand window.
func leaseDecide(rec sharedstate.LeaseRecord, pp leaseParams, now float64, urgent bool) (leaseAction, float64, sharedstate.LeaseRecord) {
	if rec.Claim > now || now < rec.Retry {
		return leaseKeep, 0, rec
	}
	// One call per refill period and process: the periodic refill waits
	// for the period's end (less a tenth, for ticks that come a little
	// early), a request's call for all of it, unless the last call was
	// granted in full (a ramp).
	switch {
	case urgent && rec.Ramp > 0:
	case urgent && now < rec.Hold, !urgent && now < rec.Hold-0.1*pp.tick:
		return leaseKeep, 0, rec
	}
	u := rec.Spendable(now)
	live := rec.Grant != 0 && now < rec.Expiry
	// Contended: the service refused the last call, or it asked for more
	// than the bucket had (Retry set since its claim, at Hold - tick),
	// and requests kept coming since, about one a refill period or more,
	// besides those waiting now (leaseTake counts those the empty bucket
	// turned away). The free
	// tokens then go to the holders, in shares (lease.lua): a process
	// that only takes exactly would get none, so it asks as a holder.
	contended := rec.Retry > 0 && rec.Retry > rec.Hold-pp.tick && rec.Used > rec.Wait && now-rec.Since <= (rec.Used+1)*pp.tick
	warm := live || rec.Ramp > 0 && now < rec.Hold || contended
	target := leaseSize(&rec, pp, now)
	horizon := pp.tick + leaseRTT(&rec, pp.timeout)
	demand := rec.Used > 0
	idle := now - rec.Since
	act, want := leaseKeep, 0.0
	switch {
	case urgent && rec.Wait > 0 && !contended && (!warm || rec.Wait > pp.max):
		if rec.Taken > 0 && now < rec.Hold {
			// The last take's tokens are still some waiting requests'
			// (other workers resume them at their next tick): one take
			// at a time.
			return leaseKeep, 0, rec
		}
		act, want = leaseExact, ceilTokens(rec.Wait)
	case urgent:
		target = math.Min(math.Max(target, 2*rec.Ramp), pp.max)
		act, want = leaseRenew, math.Max(1, ceilTokens(target-u))
	case !live && !pp.shadow:
		// Holding no lease: requests that find nothing wait, and their
		// calls take what they need.
		if idle >= leaseIdleForgetFactor*pp.ttl {
			act = leaseForget
		}
		return act, 0, rec
	case demand && (u < target || rec.Expiry-now < horizon+pp.tick):
		// Demand the allowance will not cover, or an allowance that would
		// expire before the next call could renew it.
		act, want = leaseRenew, math.Max(0, ceilTokens(target-u))
	case demand && idle >= pp.tick:
		// Enough held: the demand window starts again, so that the next
		// refill is sized from recent demand, and an idle bucket is seen
		// idle.
		rec.Used, rec.Since = 0, now
		return leaseRoll, 0, rec
	case !demand && u > 0 && idle >= pp.ttl/2:
		act = leaseRelease
	case !demand && u == 0 && idle >= leaseIdleForgetFactor*pp.ttl:
		return leaseForget, 0, rec
	default:
		return leaseKeep, 0, rec
	}
	if rec.Down > 0 && now-rec.Hold > pp.fallback {
		// No call for longer than lease_fallback_ms since the last
		// failed one: the service has not been seen failing all along,
		// and its failures start counting again.
		rec.Down = 0
	}
	rec.Claimer = nextClaim(rec.Claimer)
	rec.Claim = now + pp.timeout + leaseClaimSlack
	rec.Hold = now + pp.tick
	rec.Used, rec.Since, rec.Wait = 0, now, 0
	rec.Tokens = u // expired tokens are worthless
	if act == leaseRelease {
		// Nobody spends what is being returned, and the bucket is cold
		// again.
		rec.Tokens, rec.Expiry = 0, 0
	}
	return act, want, rec
}

// leaseTick looks after one bucket (leaseDecide) and reports whether to
// keep it: it writes the decision's record and sends the call it claims.
func (p *Plugin) leaseTick(b *leaseBucket, now float64, urgent bool) bool {
	if b.calling {
		return true
	}
	pp := leaseParamsOf(b.r, p.cfg.Settings.RLS)
	act := leaseKeep
	var want, unspent float64
	rec, wrote, err := p.lease.upd.Update(b.key, func(rec *sharedstate.LeaseRecord) bool {
		unspent = sharedstateFloor(rec.Spendable(now))
		act, want, *rec = leaseDecide(*rec, pp, now, urgent)
		return act.calls() || act == leaseRoll
	})
	switch {
	case err != nil:
		p.warnf(now, "event=lease_error rule="+b.r.Name+" reason="+strconv.Quote(err.Error()))
		return true
	case act == leaseForget:
		return false
	case !wrote || !act.calls():
		return true
	}
	lc := &leaseCall{b: b, seq: rec.Claimer, sent: now, unspent: unspent, want: want, release: act == leaseRelease}
	if act == leaseExact {
		lc.unspent, lc.exact, lc.pool = 0, true, rec.Claimer
	}
	p.leaseDispatch(lc, rec.Grant, now)
	return true
}
