package filter

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/filter/rlswire"
	"github.com/tokengate/tokengate/sharedstate"
)

// Lease mode (docs/lease.md): a cluster rule with "mode": "lease" is
// decided from this process's allowance of tokens leased from the global
// bucket, kept in shared data; the allowance is refilled from
// proxy_on_tick by one worker per bucket at a time.

// Descriptor entries of a lease request; see docs/lease.md.
const (
	DescriptorModeKey     = "tokengate_mode"
	DescriptorHolderKey   = "tokengate_holder"
	DescriptorGrantKey    = "tokengate_grant"
	DescriptorUnspentKey  = "tokengate_unspent"
	DescriptorWantKey     = "tokengate_want"
	DescriptorReleaseKey  = "tokengate_release"
	descriptorModeLease   = "lease"
	maxLeaseBuckets       = 4096
	leaseClaimSlack       = 1.0 // seconds a claim outlives its call's timeout
	leaseIdleForgetFactor = 2   // forget an empty, idle bucket after this many TTLs
)

// leaseBucket is a bucket this worker has seen and whose allowance its ticks
// look after (shared data cannot be listed).
type leaseBucket struct {
	r    *Rule
	key  string // the allowance key, tl:{rule}:{composite}
	comp string // the composite key sent to the service
	// calling is set while this worker's lease call for it is in flight.
	calling bool
}

// leaseCall is a lease request in flight.
type leaseCall struct {
	token   uint32
	b       *leaseBucket
	nonce   uint32
	sent    float64
	unspent float64
	release bool
}

// leaseState is a plugin's lease-mode state.
type leaseState struct {
	holder  string
	buckets []*leaseBucket
	calls   []*leaseCall
	upd     sharedstate.LeaseUpdater
	// period is the refill period in ms (0: no lease rule); the tick runs
	// at least this often (setTick), and next is when the refill is due.
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
	t, ok := p.host.(Ticker)
	if !ok || !leases && p.lease.period == 0 {
		return
	}
	p.lease.period = 0
	if leases {
		p.lease.period = cfg.Settings.RLS.LeaseTickMs
	}
	// The delay queue's period, combined with the refill's (setTick).
	p.setTick(t, p.delays.period)
}

// leaseOutcome is what the allowance said about one lease bucket.
type leaseOutcome int

const (
	leaseAdmitted leaseOutcome = iota
	leaseEmpty                 // the global bucket is known empty
	leaseSpent                 // the live allowance is spent: wait for the refill
	leaseCold                  // no allowance: an exact call decides
)

// leaseAdmit debits the request's lease buckets (p.rc.lease). A bucket with
// no allowance moves to the cluster group for an exact call; a bucket known
// empty rejects the request at once (the local buckets are refunded).
func (s *Stream) leaseAdmit(req *request, now float64) Action {
	p := s.p
	g := &p.rc.lease
	if s.costOverBurst(req, now, g) {
		return Pause
	}
	for i, r := range g.rules {
		lr := &g.reqs[i]
		cost := lr.Cost
		out := leaseCold
		var retry float64
		tick := float64(p.cfg.Settings.RLS.LeaseTickMs) / 1000
		_, _, err := p.lease.upd.Update(lr.Key, func(rec *sharedstate.LeaseRecord) bool {
			if rec.Used == 0 {
				// The demand window starts at the first request since the
				// last refill, not at the refill: an idle spell must not
				// dilute the rate the next lease is sized from.
				rec.Since = now
			}
			switch {
			case rec.Spendable(now) >= cost:
				rec.Tokens -= cost
				rec.Used += cost
				out = leaseAdmitted
			case now < rec.Retry:
				out, retry = leaseEmpty, rec.Retry-now
				return false
			case now < rec.Expiry && now >= rec.Down:
				// A warm bucket: a lease is live, spent, and the refill
				// comes within a tick (sized from this demand too): no
				// call per request, whatever the request rate. While the
				// service fails (Down), the request goes cold instead, to
				// on_error.
				rec.Used += cost
				out, retry = leaseSpent, tick
			default:
				rec.Used += cost // demand the refiller will see
				out = leaseCold
			}
			return true
		})
		if err != nil {
			out = leaseCold // shared data failed: the service decides
		}
		switch out {
		case leaseAdmitted:
			r.metrics.allowed.inc(p.host, 1)
		case leaseEmpty, leaseSpent:
			r.metrics.rejected.inc(p.host, 1)
			p.leaseRemember(r, lr.Key, lr.Owner)
			pc := &pendingCall{s: s, now: now, idHash: req.identityHash()}
			if ct, ok := req.header("content-type"); ok && IsGRPC(ct) {
				pc.grpc = true
			}
			pc.local = p.rc.enforce.reqs
			s.refundLocal(pc)
			st := rlswire.Status{Code: rlswire.CodeOverLimit, UntilReset: retry}
			s.sendClusterRejection(pc, r, st, retryAfterHash(retry, pc.idHash), nil)
			return Pause
		case leaseCold:
			p.leaseRemember(r, lr.Key, lr.Owner)
			c := &p.rc.cluster
			c.rules = append(c.rules, r)
			cr := *lr
			cr.Key, cr.Alt, cr.Owner = lr.Alt, "", ""
			c.reqs = append(c.reqs, cr)
			c.vals = append(c.vals, g.vals[i])
		}
	}
	return Continue
}

// leaseRemember adds a bucket to the ones this worker's ticks refill.
func (p *Plugin) leaseRemember(r *Rule, key, comp string) {
	for _, b := range p.lease.buckets {
		if b.key == key {
			return
		}
	}
	if len(p.lease.buckets) >= maxLeaseBuckets {
		return // another worker, or a later cold request, will
	}
	p.lease.buckets = append(p.lease.buckets, &leaseBucket{r: r, key: strings.Clone(key), comp: strings.Clone(comp)})
}

// leaseKnownEmpty records that the global bucket of a lease rule is empty
// until now+wait (an exact call was rejected).
func (p *Plugin) leaseKnownEmpty(key string, now, wait float64) {
	p.lease.upd.Update(key, func(rec *sharedstate.LeaseRecord) bool {
		if now+wait <= rec.Retry {
			return false
		}
		rec.Retry = now + wait
		return true
	})
}

// leaseOnTick runs from proxy_on_tick (OnTick): once a refill period, the
// worker refills or releases the allowances of the lease buckets it has
// seen, one lease call per bucket and process.
func (p *Plugin) leaseOnTick(now float64) {
	if p.lease.period == 0 || now < p.lease.next || p.cfg == nil || p.cfg.Settings.RLS == nil {
		return
	}
	// 0.9: a tick that comes a little early still refills.
	p.lease.next = now + 0.9*float64(p.lease.period)/1000
	kept := p.lease.buckets[:0]
	for _, b := range p.lease.buckets {
		if p.leaseTick(b, now) {
			kept = append(kept, b)
		}
	}
	for i := len(kept); i < len(p.lease.buckets); i++ {
		p.lease.buckets[i] = nil
	}
	p.lease.buckets = kept
}

// leaseTick looks after one bucket and reports whether to keep it.
func (p *Plugin) leaseTick(b *leaseBucket, now float64) bool {
	if b.calling {
		return true
	}
	rls := p.cfg.Settings.RLS
	l := b.r.Lease
	tick := float64(rls.LeaseTickMs) / 1000
	horizon := tick + float64(rls.TimeoutMs)/1000
	nonce := rand.Uint32() | 1
	const (
		none = iota
		renew
		release
		forget
	)
	act := none
	var want, unspent float64
	var grant uint64
	_, wrote, err := p.lease.upd.Update(b.key, func(rec *sharedstate.LeaseRecord) bool {
		act = none
		if rec.Claim > now || now < rec.Retry {
			return false
		}
		u := rec.Spendable(now)
		elapsed := now - rec.Since
		demand := rec.Used > 0
		target := 0.0
		if demand {
			rate := rec.Used / math.Max(elapsed, tick)
			target = math.Min(math.Ceil(rate*horizon), l.Max)
		}
		switch {
		case demand && (u < target || rec.Expiry-now < horizon+tick):
			act = renew
			want = math.Max(0, math.Ceil(target-u))
		case !demand && u > 0 && elapsed >= l.TTL/2:
			act = release
		case !demand && u == 0 && elapsed >= leaseIdleForgetFactor*l.TTL:
			act = forget
			return false
		default:
			return false
		}
		unspent, grant = u, rec.Grant
		rec.Claim = now + float64(rls.TimeoutMs)/1000 + leaseClaimSlack
		rec.Claimer = nonce
		rec.Used, rec.Since = 0, now
		if act == release {
			// Nobody spends what is being returned, and the bucket is
			// cold again: its next request makes an exact call rather
			// than wait for a refill that idleness will not bring.
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
	case !wrote:
		return true
	}
	lc := &leaseCall{b: b, nonce: nonce, sent: now, unspent: sharedstateFloor(unspent), release: act == release}
	token, err := p.leaseSend(b, lc, want, grant)
	if err != nil {
		p.metrics.rlsErrors.inc(p.host, 1)
		p.warnf(now, "event=rls_error rule="+b.r.Name+" reason="+strconv.Quote("lease dispatch: "+err.Error()))
		p.leaseUnclaim(b.key, nonce)
		return true
	}
	lc.token = token
	b.calling = true
	p.lease.calls = append(p.lease.calls, lc)
	p.metrics.leaseCalls.inc(p.host, 1)
	return true
}

// sharedstateFloor floors x to the 6 decimals the service is told.
func sharedstateFloor(x float64) float64 { return math.Floor(x*1e6) / 1e6 }

// leaseSend dispatches a lease request (or release) for b.
func (p *Plugin) leaseSend(b *leaseBucket, lc *leaseCall, want float64, grant uint64) (uint32, error) {
	caller, ok := p.host.(Caller)
	if !ok {
		return 0, errNoCallouts
	}
	rls := p.cfg.Settings.RLS
	entries := []rlswire.Entry{
		{Key: DescriptorRuleKey, Value: b.r.Name},
		{Key: DescriptorKeyKey, Value: strings.ToValidUTF8(b.comp, "\uFFFD")},
		{Key: DescriptorModeKey, Value: descriptorModeLease},
		{Key: DescriptorHolderKey, Value: p.leaseHolder()},
		{Key: DescriptorGrantKey, Value: strconv.FormatUint(grant, 10)},
		{Key: DescriptorUnspentKey, Value: strconv.FormatFloat(lc.unspent, 'f', -1, 64)},
		{Key: DescriptorWantKey, Value: strconv.FormatFloat(want, 'f', 0, 64)},
	}
	if lc.release {
		entries = append(entries, rlswire.Entry{Key: DescriptorReleaseKey, Value: "1"})
	}
	return callRLS(caller, rls, []rlswire.Descriptor{{Entries: entries}})
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

// leaseUnclaim clears this worker's claim on a bucket.
func (p *Plugin) leaseUnclaim(key string, nonce uint32) {
	p.lease.upd.Update(key, func(rec *sharedstate.LeaseRecord) bool {
		if rec.Claimer != nonce || rec.Claim == 0 {
			return false
		}
		rec.Claim = 0
		return true
	})
}

// takeLeaseCall removes and returns the lease call with this token, or nil.
func (p *Plugin) takeLeaseCall(token uint32) *leaseCall {
	for i, lc := range p.lease.calls {
		if lc.token == token {
			last := len(p.lease.calls) - 1
			p.lease.calls[i] = p.lease.calls[last]
			p.lease.calls[last] = nil
			p.lease.calls = p.lease.calls[:last]
			return lc
		}
	}
	return nil
}

// leaseAnswer applies the service's answer to a lease call: the grant is
// added to the allowance if this worker's claim still stands (otherwise it
// is dropped: only capacity is lost), a rejection marks the bucket empty
// until its retry time, a failure only clears the claim.
func (p *Plugin) leaseAnswer(lc *leaseCall, numHeaders, bodySize int) {
	lc.b.calling = false
	now := p.Clock()
	resp, reason := p.readRLS(p.host.(Caller), numHeaders, bodySize)
	var st rlswire.Status
	var id uint64
	ok := reason == ""
	if ok {
		if len(resp.Statuses) != 1 {
			ok, reason = false, "lease answer with "+strconv.Itoa(len(resp.Statuses))+" statuses"
		} else {
			st = resp.Statuses[0]
			if st.HasQuota {
				n, err := strconv.ParseUint(st.Quota.ID, 10, 64)
				if err != nil || n == 0 {
					ok, reason = false, "lease grant id "+strconv.Quote(st.Quota.ID)
				}
				id = n
			}
		}
	}
	if !ok {
		p.metrics.rlsErrors.inc(p.host, 1)
		p.warnf(now, "event=rls_error rule="+lc.b.r.Name+" reason="+strconv.Quote("lease: "+reason))
	}
	ttl := lc.b.r.Lease.TTL
	// The claim stays until a tick after the dispatch, so that the other
	// workers, whose ticks run at other phases, do not refill again within
	// the same period: one call per tick per process.
	hold := lc.sent + 0.9*float64(p.cfg.Settings.RLS.LeaseTickMs)/1000
	p.lease.upd.Update(lc.b.key, func(rec *sharedstate.LeaseRecord) bool {
		if rec.Claimer != lc.nonce || rec.Claim == 0 {
			return false
		}
		rec.Claim = 0
		if hold > now {
			rec.Claim = hold
		}
		if !ok {
			rec.Down = now + ttl
			return true
		}
		rec.Down = 0
		if lc.release {
			return true
		}
		if st.HasQuota {
			// The service now covers what was reported plus the grant,
			// until its own expiry: what is left of the report is kept
			// under the new expiry.
			rec.Tokens = math.Min(rec.Tokens, lc.unspent) + float64(st.Quota.Requests)
			rec.Expiry = lc.sent + ttl
			rec.Grant = id
		}
		if st.Code == rlswire.CodeOverLimit {
			rec.Retry = now + st.UntilReset
		}
		return true
	})
}
