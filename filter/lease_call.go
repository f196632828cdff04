package filter

import (
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// Tuning of lease calls; a lease call's descriptor is
// rlscontract.LeaseDescriptor (docs/lease.md, "Wire protocol").
const (
	leaseClaimSlack = 1.0 // seconds a claim outlives its call's timeout
	// leaseMinRTT is the smallest round trip sample kept (a clock that
	// did not move between the call and its answer).
	leaseMinRTT = 1e-4
)

// leaseCall is a lease request in flight.
type leaseCall struct {
	_ incomparable
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

// nextClaim is the claim sequence number that follows seq (0 is skipped).
func nextClaim(seq uint32) uint32 {
	if seq++; seq == 0 {
		seq = 1
	}
	return seq
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

// leaseDispatch sends lc (its claim is made) and records it in flight; a
// call that cannot be sent fails at once.
func (p *Plugin) leaseDispatch(lc *leaseCall, grant uint64, now float64) {
	b := lc.b
	token, err := p.leaseSend(b, lc, grant)
	if err != nil {
		p.metrics.rlsErrors.inc(p.host, 1)
		p.warnf(now, "event=rls_error rule="+b.r.Name+" reason="+strconv.Quote("lease dispatch: "+err.Error()))
		p.leaseApply(lc, now, nil)
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
// applies it, and serves the requests of this worker that wait for it. An
// answer that arrives after a configuration without a rate-limit service
// was put in force is dropped.
func (p *Plugin) leaseAnswer(lc *leaseCall, numHeaders, bodySize int) {
	lc.b.calling = false
	if p.cfg == nil || p.cfg.Settings.RLS == nil {
		// A configuration without a service was put in force while the
		// call was out: its waiting requests went on then (leaseConfigure),
		// and its claim expires by itself.
		return
	}
	now := p.time()
	resp, reason := p.readRLS(numHeaders, bodySize)
	var a *rlscontract.LeaseAnswer
	if reason == "" {
		if ans, err := rlscontract.ParseLeaseAnswer(&resp, !lc.release && !lc.exact, lc.exact); err != nil {
			reason = err.Error()
		} else {
			a = &ans
		}
	}
	if a == nil {
		p.metrics.rlsErrors.inc(p.host, 1)
		p.warnf(now, "event=rls_error rule="+lc.b.r.Name+" reason="+strconv.Quote("lease: "+reason))
	}
	if retake := p.leaseApply(lc, now, a); retake != nil {
		p.leaseDispatch(retake, 0, now)
	}
	p.leaseServe(now, false)
}

// leaseApply applies the answer a to a lease call (nil: the call failed),
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
func (p *Plugin) leaseApply(lc *leaseCall, now float64, a *rlscontract.LeaseAnswer) (retake *leaseCall) {
	l := lc.b.r.Lease
	rtt := math.Max(now-lc.sent, leaseMinRTT)
	_, wrote, _ := p.lease.upd.Update(lc.b.key, func(rec *sharedstate.LeaseRecord) bool {
		retake = nil
		if rec.Claimer != lc.seq || rec.Claim == 0 {
			return false
		}
		rec.Claim = 0
		if a == nil {
			// Failed: the next call goes out once the refill period is
			// over, and the requests waiting for this one wait for it
			// (leaseTake counts them again) until the calls have failed
			// for lease_fallback_ms: then they meet on_error. Down is
			// when this run of failures began.
			if rec.Down == 0 {
				rec.Down = now
			}
			rec.Ramp = 0
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
			left := float64(a.Remaining)
			switch {
			case !a.OverLimit:
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
				rec.Retry = math.Max(rec.Retry, now+a.Retry)
			}
			return true
		}
		total := float64(a.Tokens)
		spent := lc.unspent - math.Min(rec.Tokens, lc.unspent) // since the report
		rec.Tokens = math.Max(0, total-spent)
		rec.Expiry = lc.sent + l.TTL
		rec.Grant = a.Grant
		// The new tokens, if all the report was carried over (whole
		// tokens are).
		granted := total - math.Floor(lc.unspent)
		empty := a.OverLimit || lc.want > 0 && granted < lc.want && a.Remaining == 0
		switch {
		case empty:
			// The global bucket is (about) empty: 429 locally until the
			// next refill period, not a call per request.
			rec.Ramp = 0
			retry := rec.Hold
			if a.OverLimit {
				retry = math.Max(retry, now+a.Retry)
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
