package filter

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/sharedstate"
)

// This file is the local stage: the request's local buckets and windows
// (and, for the shadow stage, the shadow ones) taken from in shared data,
// all or nothing, and what is logged about them.

// failures logs one line per rule of a group whose update failed.
func (p *Plugin) failures(g *group, now float64, event string, err error) {
	for i, r := range g.rules {
		p.warnf(now, "event="+event+" rule="+r.Name+" key=#"+reqHash(&g.reqs[i])+" reason="+strconv.Quote(err.Error()))
	}
}

// take runs g's buckets (sharedstate.Updater.TakeAll), all or nothing, and
// counts what it saw. It also returns the seconds an admission into a
// reservation must wait (0: none) and the index of the rule whose
// reservation makes the wait (reservationWait).
func (p *Plugin) take(g *group, now float64) (out sharedstate.Outcome, wait float64, by int) {
	if cap(g.res) < len(g.reqs) {
		g.res = make([]bucket.Result, len(g.reqs))
	}
	g.res = g.res[:len(g.reqs)]
	out = p.upd.TakeAll(g.reqs, now, g.res)
	wait, by = reservationWait(g)
	// Counters move only when something happened (inc ignores a delta of
	// 0): an uneventful decision, the common case, calls none.
	if out.Corrupt > 0 {
		p.metrics.corrupt.inc(p.host, int64(out.Corrupt))
		p.warnf(now, "event=corrupt_state rules="+ruleNames(g.rules)+" count="+strconv.Itoa(out.Corrupt)+" action=replaced_with_full_bucket")
	}
	for i, r := range g.rules {
		if out.CASRetries == 0 && out.Takeovers == 0 && out.Collisions == 0 {
			break
		}
		r.metrics.casRetries.inc(p.host, int64(out.CASRetries))
		if g.reqs[i].TookOver {
			r.metrics.slotTakeovers.inc(p.host, 1)
		}
		if g.reqs[i].Collided {
			r.metrics.slotCollisions.inc(p.host, 1)
		}
	}
	return out, wait, by
}

// observe runs the shadow buckets g: what enforcing them would have done is
// counted and logged, and the request is never touched. It reports whether
// the shadow buckets took their cost (they would have admitted it). With
// body, the request's body follows: a rule awaiting its estimate from it
// is counted allowed when it has been read (estimate.go).
func (p *Plugin) observe(g *group, now float64, body bool) bool {
	out, _, _ := p.take(g, now)
	switch {
	case out.Err != nil:
		for _, r := range g.rules {
			r.metrics.failOpen.inc(p.host, 1)
		}
		p.failures(g, now, "shadow_fail_open", out.Err)
	case out.Allowed:
		for _, r := range g.rules {
			if !body || !awaitsEstimate(r) {
				r.metrics.allowed.inc(p.host, 1)
			}
		}
		return true
	default:
		i := worst(g.res)
		for j, r := range g.rules {
			if !g.res[j].Allowed {
				r.metrics.shadowRejected.inc(p.host, 1)
			}
		}
		p.logDescribe("tokengate: event=shadow_rejected ", g, i, 0)
	}
	return false
}

// decide runs the local buckets, st.enforce, and answers the request when
// they reject it. An admission into a reservation that can be held sets
// st.wait, st.waitRule and st.hold, the hold the hold stage starts; one that
// cannot be held is rejected here (refuseHold).
func (s *Stream) decide(st *reqState) Action {
	p := s.p
	g, now := &st.enforce, st.now
	out, wait, by := p.take(g, now)
	switch {
	case out.Err != nil:
		return s.undecided(&st.req, g, now, out.Err)
	case !out.Allowed:
		return s.reject(&st.req, g)
	}
	if wait > 0 {
		if over := s.unholdable(g, by); over >= 0 {
			return s.refuseHold(&st.req, g, now, wait, over)
		}
		st.wait, st.waitRule = wait, by
		st.hold = s.prepareHold(g, now, wait, by)
	}
	s.st.quotas, s.st.best = s.st.quotas[:0], 0
	settles := false
	for i, r := range g.rules {
		if !s.deferCount(r) {
			r.metrics.allowed.inc(p.host, 1)
		}
		s.st.quotas = append(s.st.quotas, quotaOf(r, g.res[i]))
		if g.res[i].Tokens < g.res[s.st.best].Tokens {
			s.st.best = i
		}
		settles = settles || r.Settle != nil
	}
	if settles {
		s.track(g)
	}
	return Continue
}

// reject answers a request the buckets of g turned down: counted, logged
// and sent the rejection of the worst bucket.
func (s *Stream) reject(req *request, g *group) Action {
	p := s.p
	i := worst(g.res)
	for j, r := range g.rules {
		if !g.res[j].Allowed {
			r.metrics.rejected.inc(p.host, 1)
		}
	}
	retry := int64(0)
	if !math.IsInf(g.res[i].RetryAfter, 1) { // a retry can pass: not cost_exceeds_burst
		retry = retryAfterHash(g.res[i].RetryAfter, req.identityHash())
	}
	p.logDescribe("tokengate: event=rejected ", g, i, retry)
	s.sendRejection(req, g, i, retry)
	return Pause
}

// undecided answers a request whose buckets could not be updated: the
// shared data failed, or (ErrContention) every compare-and-swap attempt
// lost its race. It fails open unless a rule says "on_store_error":
// "deny"; then the 503 names and counts the first such rule.
func (s *Stream) undecided(req *request, g *group, now float64, err error) Action {
	p := s.p
	contention := errors.Is(err, sharedstate.ErrContention)
	denier := -1
	for i, r := range g.rules {
		if contention {
			r.metrics.contention.inc(p.host, 1)
		}
		if r.DenyOnStoreError && denier < 0 {
			denier = i
		}
	}
	if denier < 0 {
		for _, r := range g.rules {
			r.metrics.failOpen.inc(p.host, 1)
		}
		p.failures(g, now, "fail_open", err)
		return Continue
	}
	g.rules[denier].metrics.storeDenied.inc(p.host, 1)
	p.failures(g, now, "store_denied", err)
	s.sendStoreDenied(isGRPCRequest(req), g.rules[denier], err)
	return Pause
}

// worst returns the index of the rejecting bucket with the longest wait.
func worst(res []bucket.Result) int {
	w := -1
	for i := range res {
		if !res[i].Allowed && (w < 0 || res[i].RetryAfter > res[w].RetryAfter) {
			w = i
		}
	}
	if w < 0 {
		return 0
	}
	return w
}

// appendDescribe appends the log text of a rejection to dst: rule, a hash
// of the key (never the raw API key or token), tokens, cost, Retry-After (0:
// none) and reason.
func appendDescribe(dst []byte, g *group, i int, retry int64) []byte {
	dst = append(dst, "rule="...)
	dst = append(dst, g.rules[i].Name...)
	dst = append(dst, " key=#"...)
	dst = appendReqHash(dst, &g.reqs[i])
	dst = append(dst, " tokens="...)
	dst = strconv.AppendFloat(dst, g.res[i].Tokens, 'f', 3, 64)
	dst = append(dst, " cost="...)
	dst = strconv.AppendFloat(dst, g.reqs[i].Cost, 'g', -1, 64)
	dst = append(dst, " retry_after="...)
	dst = strconv.AppendInt(dst, retry, 10)
	dst = append(dst, " reason="...)
	return append(dst, reasonOf(g.rules[i], g.res[i])...)
}

// logDescribe logs prefix and appendDescribe's text at debug level, without
// building a string when the host takes bytes. Envoy drops debug lines at
// its default level, so this must cost next to nothing.
func (p *Plugin) logDescribe(prefix string, g *group, i int, retry int64) {
	b := appendDescribe(append(p.buf.logBuf[:0], prefix...), g, i, retry)
	p.buf.logBuf = b
	if p.bl != nil {
		p.bl.LogBytes(LogDebug, b)
		return
	}
	p.host.Log(LogDebug, string(b))
}

// reqHash identifies a bucket's identity in logs without revealing it.
func reqHash(r *sharedstate.Request) string { return string(appendReqHash(nil, r)) }

// appendReqHash appends reqHash(r) to dst: the top 32 bits of the FNV-1a
// hash of the owner (slotted rules) or the key, in hex.
func appendReqHash(dst []byte, r *sharedstate.Request) []byte {
	k := r.Key
	if r.Slotted {
		k = r.Owner
	}
	return strconv.AppendUint(dst, fnv64(k)>>32, 16)
}

func ruleNames(rules []*rule) string {
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.Name
	}
	return strings.Join(names, ",")
}

func fnv64(s string) uint64 {
	return fnv64Add(fnvOffset, s)
}

// fnvOffset is FNV-1a's initial value.
const fnvOffset = 14695981039346656037

// fnv64Add continues an FNV-1a hash h over s: fnv64(a+b) is
// fnv64Add(fnv64(a), b).
func fnv64Add(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
