package filter

import (
	"math"
	"strconv"
	"strings"

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
	r    *Rule
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
	calls   []*leaseCall
	waiters []*leaseWaiter
	// debits are the current request's debits (scratch).
	debits []leaseDebit
	pass   uint64
	upd    sharedstate.LeaseUpdater
	// refill is the refill period in ms (0: no lease rule, or a host
	// without ticks); period is the tick period lease mode needs: refill,
	// or leasePollMs while requests wait (setTick never lets the timer run
	// slower); next is when the periodic refill is due.
	refill uint32
	period uint32
	next   float64
}

// leaseConfigure resets the worker's lease state for a new configuration
// and starts ticks if a rule is in lease mode.
func (p *Plugin) leaseConfigure(cfg *Config) {
	p.lease.buckets = p.lease.buckets[:0]
	p.lease.upd.Store = p.store
	p.lease.upd.MaxAttempts = cfg.Settings.MaxAttempts
	p.lease.upd.Backoff = p.upd.Backoff
	leases := false
	for _, r := range cfg.rules {
		leases = leases || r.Lease != nil
	}
	if cfg.Settings.RLS == nil && len(p.lease.waiters) > 0 {
		// No service to ask any more, and no cluster rule to decide:
		// the waiting requests go on, as the new configuration admits.
		for _, w := range p.lease.waiters {
			if w.s.id == w.id && !w.s.ended && p.host.(Caller).SetEffectiveContext(w.id) {
				w.s.proceed(w.pc)
			}
		}
		clear(p.lease.waiters)
		p.lease.waiters = p.lease.waiters[:0]
	}
	t, ok := p.host.(Ticker)
	if !ok || !leases && p.lease.period == 0 {
		return
	}
	p.lease.refill, p.lease.period = 0, 0
	if leases {
		p.lease.refill = cfg.Settings.RLS.LeaseTickMs
		p.lease.period = p.lease.refill
		if len(p.lease.waiters) > 0 {
			p.lease.period = leasePollMs
		}
	}
	// The delay queue's period, combined with the refill's (setTick).
	p.setTick(t, p.delays.period)
}

// leaseRemember adds a bucket to the ones this worker's ticks refill and
// returns it (nil when the worker already looks after too many).
func (p *Plugin) leaseRemember(r *Rule, key, comp string) *leaseBucket {
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
	periodic := now >= p.lease.next
	if periodic {
		// 0.9: a tick that comes a little early still refills.
		p.lease.next = now + 0.9*float64(p.lease.refill)/1000
	}
	p.leaseServe(now, periodic)
}

// leaseSetPeriod keeps the tick at leasePollMs while requests wait, and
// lets it go back to the refill period (at the next arm) when none does.
func (p *Plugin) leaseSetPeriod() {
	if p.lease.refill == 0 {
		return
	}
	want := p.lease.refill
	if len(p.lease.waiters) > 0 {
		want = leasePollMs
	}
	if want == p.lease.period {
		return
	}
	p.lease.period = want
	if t, ok := p.host.(Ticker); ok && want < p.delays.period {
		p.setTick(t, p.delays.period)
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

// leaseSize returns the allowance to aim for: enough for a refill period
// plus a round trip at leaseHeadroom times the local rate observed since
// the last refill (0 without demand), at most lease_max.
func leaseSize(rec *sharedstate.LeaseRecord, l *LeaseConfig, tick, timeout, now float64) float64 {
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
		case !live && !b.r.shadow:
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
