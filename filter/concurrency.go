package filter

import (
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/sharedstate"
)

// Requests in flight ("algorithm": "concurrency")
//
// A concurrency rule counts, per key, the requests admitted and not yet
// ended, in shared data (sharedstate.Updater.Acquire): a request is
// counted when its headers arrive, before the token buckets decide, and
// released exactly once when its stream ends by any path (settle.go's
// finish: end of the response, trailers, proxy_on_done, proxy_on_delete),
// including a request that a bucket or this filter then rejects. A full
// key answers 429 with reason concurrency_limit. A count that a VM never
// released (it died) is dropped after between one and two expiry periods
// (the in-flight rule's "lease" setting, sharedstate.InFlight.Lease: not
// lease mode).

// ReasonConcurrency: the key already has max_in_flight requests in flight.
const ReasonConcurrency = "concurrency_limit"

// slot is a place in flight a stream holds until it ends.
type slot struct {
	_ incomparable
	r *rule
	f sharedstate.InFlight
}

// markInFlight turns a bucket key just appended ("tb:..." or
// "shadow:tb:...") into the concurrency key of the same identity
// ("cc:..."), in place: the values differ in format, so the prefixes must.
func markInFlight(key []byte, shadow bool) {
	off := 0
	if shadow {
		off = len("shadow:")
	}
	if len(key) >= off+2 {
		key[off], key[off+1] = 'c', 'c'
	}
}

// admitInFlight counts the request in flight under every concurrency rule
// of g: shadow rules observe (and are released like the others); enforced
// ones admit it all or nothing, or answer 429.
func (s *Stream) admitInFlight(req *request, g *group, now float64) Action {
	p := s.p
	var enforce []sharedstate.InFlight
	var rules []*rule
	for i, r := range g.rules {
		f := sharedstate.InFlight{Key: g.reqs[i].Key, Alt: g.reqs[i].Alt, Owner: g.reqs[i].Owner,
			Slotted: g.reqs[i].Slotted, Max: r.InFlight.Max, Lease: r.InFlight.Lease}
		if !r.Shadow {
			enforce, rules = append(enforce, f), append(rules, r)
			continue
		}
		one := []sharedstate.InFlight{f}
		rej, n, err := p.upd.Acquire(one, now)
		r.metrics.casRetries.inc(p.host, int64(n))
		switch {
		case err != nil:
			r.metrics.failOpen.inc(p.host, 1)
			p.warnf(now, "event=shadow_fail_open rule="+r.Name+" reason="+quote(err))
		case rej >= 0:
			r.metrics.shadowRejected.inc(p.host, 1)
			s.logInFlight("tokengate: event=shadow_rejected ", r, &one[0])
		default:
			r.metrics.allowed.inc(p.host, 1)
			s.holdInFlight(r, &one[0])
		}
	}
	if len(enforce) == 0 {
		return Continue
	}
	rej, n, err := p.upd.Acquire(enforce, now)
	for _, r := range rules {
		r.metrics.casRetries.inc(p.host, int64(n))
	}
	if err != nil {
		for i, r := range rules {
			if r.DenyOnStoreError {
				r.metrics.storeDenied.inc(p.host, 1)
				p.warnf(now, "event=store_denied rule="+r.Name+" reason="+quote(err))
				s.sendStoreDenied(isGRPCRequest(req), rules[i], err)
				return Pause
			}
		}
		for _, r := range rules {
			r.metrics.failOpen.inc(p.host, 1)
			p.warnf(now, "event=fail_open rule="+r.Name+" reason="+quote(err))
		}
		return Continue
	}
	if rej >= 0 {
		r := rules[rej]
		r.metrics.rejected.inc(p.host, 1)
		s.logInFlight("tokengate: event=rejected ", r, &enforce[rej])
		s.sendInFlightRejection(req, r)
		return Pause
	}
	for i, r := range rules {
		r.metrics.allowed.inc(p.host, 1)
		s.holdInFlight(r, &enforce[i])
	}
	return Continue
}

func quote(err error) string { return `"` + lite.ReplaceByte(err.Error(), '"', '\'') + `"` }

// holdInFlight keeps a place in flight for release when the stream ends; the keys
// are copied, since the request's key buffer is reused.
func (s *Stream) holdInFlight(r *rule, f *sharedstate.InFlight) {
	l := slot{r: r, f: *f}
	l.f.Key, l.f.Alt, l.f.Owner, l.f.Stored = "", "", strings.Clone(f.Owner), strings.Clone(f.Stored)
	st := s.settleOf()
	st.slots = append(st.slots, l)
}

// releaseAll gives back the stream's places in flight.
func (s *Stream) releaseAll() {
	st := s.st.settle
	if st == nil {
		return
	}
	p := s.p
	for i := range st.slots {
		l := &st.slots[i]
		now := p.time()
		n, err := p.upd.Release(&l.f, now)
		l.r.metrics.casRetries.inc(p.host, int64(n))
		if err != nil {
			p.warnf(now, "event=release_error rule="+l.r.Name+" reason="+quote(err))
		}
	}
	st.slots = st.slots[:0]
}

// logInFlight logs a concurrency rejection at debug level.
func (s *Stream) logInFlight(prefix string, r *rule, f *sharedstate.InFlight) {
	k := f.Key
	if f.Slotted {
		k = f.Owner
	}
	msg := prefix + "rule=" + r.Name + " key=#" + strconv.FormatUint(fnv64(k)>>32, 16) + " in_flight=" + strconv.FormatInt(f.InFlight, 10) +
		" max_in_flight=" + strconv.FormatInt(r.InFlight.Max, 10) + " reason=" + ReasonConcurrency
	s.p.host.Log(LogDebug, msg)
}

// sendInFlightRejection answers a request whose key has max_in_flight
// requests in flight: 429 (settings.rejection_status) with Retry-After: 1,
// a hint, since no one knows when a request in flight will end.
func (s *Stream) sendInFlightRejection(req *request, r *rule) {
	p := s.p
	rep := localReply{reason: ReasonConcurrency, details: "tokengate_concurrency_limited", rule: r, retry: 1}
	if p.cfg.Settings.RateLimitHeaders {
		rep.rateLimit = append(p.buf.rlHdrs[:0],
			[2]string{"ratelimit", r.plan.Quoted + ";r=0;t=1"},
			[2]string{"ratelimit-policy", r.plan.Quoted + ";q=" + strconv.FormatInt(r.InFlight.Max, 10)})
		p.buf.rlHdrs = rep.rateLimit
	}
	s.send(isGRPCRequest(req), &rep)
}
