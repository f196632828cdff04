package filter

import (
	"math"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
	"github.com/tokengate/tokengate/sharedstate"
)

// Estimates from the request body
//
// A response-cost rule with "estimate_source": "request_json:<pointers>"
// (an OpenAI-style "max_tokens") cannot know its estimate when the headers
// arrive: the body comes after them. Admission therefore happens in two
// steps. proxy_on_request_headers decides as for any rule, reserving
// pre_charge (track marks the charge as awaiting its estimate when a body
// follows). proxy_on_request_body then holds the body (Pause: the host
// buffers it, Envoy's StopIterationAndBuffer) until it has ended, reads
// the numbers at the pointers (a scanner of bounded memory, a window of the
// host's buffer at a time), and takes the rest of the estimate from the
// same bucket: min(estimate, burst) - pre_charge, when the estimate is the
// larger. A bucket that cannot pay it rejects the request then, with the
// rejection any rule sends; everything its settling rules took at the
// headers is given back. So the reservations admitted never exceed what
// the bucket holds, as with an estimate in a header. A cluster rule's rest
// is asked of the rate-limit service instead, in one more call once the
// local buckets have taken theirs (cluster_estimate.go).
//
// The scanner reads what lax JSON readers (Python's json, pydantic) read:
// a number held in a string ("500"), a leading UTF-8 byte order mark, NaN
// and Infinity elsewhere in the body; and keys as Go's encoding/json
// matches them, whatever the case of their ASCII letters ("MAX_TOKENS"),
// the largest number when the pointer is met more than once
// (ljson.PointerScanner.Fold). What they may read and it cannot
// reserves the rule's ceiling, its burst (an estimate is capped there): a
// body in UTF-16 or UTF-32, one sent with a Content-Encoding other than
// identity (gzip, br, deflate), nesting deeper than 512 levels, or at a
// pointer a number longer than 40 bytes or a string that holds no number
// (ljson.PointerScanner.Unreadable), and a body larger than
// MaxEstimateBody, which is let go unread as soon as the host has
// buffered more than that, so the host never holds more of it for this
// filter (padding a prompt past it evaded the estimate, issue 30). A body
// that is not JSON otherwise, lacks every pointer or states no valid
// number keeps pre_charge.
//
// The rules awaiting their estimate count the request (allowed, rejected,
// shadow_rejected, fail_open, store_denied) once, when the body has been
// read, not when the headers took pre_charge (deferCount).
//
// The headers were passed on when proxy_on_request_headers returned, as
// Envoy requires for the body to reach the filter at all (a Pause there
// withholds the body too): the upstream may see a request's headers before
// the filter refuses its body, and sees the stream reset then.

// MaxEstimateBody is the largest request body the filter holds to read an
// estimate from (512 KiB); a larger one reserves the rule's burst. Envoy's buffer limit
// (per_connection_buffer_limit_bytes, 1 MiB by default) must exceed it by
// at least one read, or Envoy answers 413 before the filter lets the body
// go.
const MaxEstimateBody = 512 << 10

// BodyEnded is the size OnRequestBody is given by proxy_on_request_trailers:
// the body has ended, at the size its last call saw.
const BodyEnded = -1

// OnRequestBody is proxy_on_request_body (and, with BodyEnded,
// proxy_on_request_trailers): the body of a request that awaits its
// estimate is held until it ends (or passes MaxEstimateBody), then the
// estimate is reserved (reserveEstimate). Any other body goes on.
func (s *Stream) OnRequestBody(size int, endOfStream bool) (act Action) {
	p := s.p
	defer p.recoverTo("proxy_on_request_body", func() { act = Continue })
	st := s.st.settle
	if st == nil || !st.estimating || st.ended {
		return Continue
	}
	if size != BodyEnded {
		st.bodySize = size
	}
	switch {
	case size > MaxEstimateBody:
		st.bodySize, st.encoded = 0, true // not read: the ceiling, as for an unreadable body
	case !endOfStream:
		return Pause
	}
	return s.reserveEstimate()
}

// reserveEstimate reads the estimates in the buffered body and takes what
// they add to the reservations, all or nothing for the enforced rules (the
// shadow ones are observed).
func (s *Stream) reserveEstimate() Action {
	p := s.p
	st := s.st.settle
	st.estimating = false
	s.st.hasBody = false // read: what decides now counts (deferCount)
	if !st.encoded {
		s.readEstimates(st)
	}
	enforce, shadow := &p.est, &p.estShadow
	// The headers' request holds views of what the host returned then:
	// read it again in this callback.
	ask := estimateCall{req: p.newRequest()}
	enforce.reset()
	shadow.reset()
	for i := range st.charges {
		c := &st.charges[i]
		if !c.estimate {
			continue
		}
		c.estimate = false
		e, ok := c.estimated()
		if st.encoded {
			e, ok = math.Inf(1), true // unreadable: the ceiling
		}
		if !ok || min(e, c.r.Limit.Burst) <= c.pre {
			// Nothing more to take: admitted (counted by observe, reject,
			// undecided or below for the others).
			c.r.metrics.allowed.inc(p.host, 1)
			continue
		}
		if c.cluster != nil {
			// Asked of the service once the local rules have admitted
			// it (askEstimate).
			c.ask = math.Ceil(min(e, c.r.Limit.Burst) - c.pre)
			ask.ds = append(ask.ds, clusterDescriptor(&ask.req, c.r, c.cluster.comp, uint64(c.ask)))
			ask.rules = append(ask.rules, c.r)
			continue
		}
		g := enforce
		if c.r.Shadow {
			g = shadow
		}
		req := c.req
		if req.Slotted {
			req.Key, req.Alt = req.Stored, "" // the bucket admission took from
		}
		req.Cost = min(e, c.r.Limit.Burst) - c.pre
		g.rules = append(g.rules, c.r)
		g.reqs = append(g.reqs, req)
		g.vals = append(g.vals, [2]int{i, i}) // the charge's index
	}
	now := p.time()
	if len(shadow.reqs) > 0 && p.observe(shadow, now, false) {
		s.raise(shadow)
	}
	if len(enforce.reqs) == 0 {
		return s.askEstimate(&ask, now)
	}
	req := p.newRequest()
	out, _, _ := p.take(enforce, now)
	switch {
	case out.Err != nil:
		if act := s.undecided(&req, enforce, now, out.Err); act != Continue {
			s.refundCharges()
			return act
		}
		return s.askEstimate(&ask, now)
	case !out.Allowed:
		s.refundCharges()
		return s.reject(&req, enforce)
	}
	s.raise(enforce)
	for i, r := range enforce.rules {
		r.metrics.allowed.inc(p.host, 1)
		for k := range s.st.quotas {
			if s.st.quotas[k].Plan == &r.plan {
				s.st.quotas[k] = quotaOf(r, enforce.res[i])
			}
		}
	}
	return s.askEstimate(&ask, now)
}

// deferCount reports whether r, admitted at the headers of a request
// whose body follows, is counted when the body has been read
// (reserveEstimate) rather than then.
func (s *Stream) deferCount(r *rule) bool { return s.st.hasBody && awaitsEstimate(r) }

// requestEncoded reports whether the request's body is sent with a
// Content-Encoding other than identity, which the estimate scanner cannot
// read. The host gives request headers only in proxy_on_request_headers.
func requestEncoded(h Host) bool {
	enc, _ := h.RequestHeader("content-encoding")
	return enc != "" && enc != "identity"
}

// raise records, for the charges of g (located by g.vals), that admission
// took the estimate: the settlement compares the usage with it.
func (s *Stream) raise(g *group) {
	for i := range g.reqs {
		c := &s.st.settle.charges[g.vals[i][0]]
		c.pre += g.reqs[i].Cost
	}
}

// refundCharges gives back what the enforced settling rules took at the
// headers of a request refused when its body arrived: it never reaches the
// upstream. Shadow rules keep theirs, as on any local reply (dropCharges).
func (s *Stream) refundCharges() {
	for i := range s.st.settle.charges {
		if c := &s.st.settle.charges[i]; !c.r.Shadow && !c.done {
			s.apply(c, sharedstate.SettleRefund, c.pre)
		}
	}
}

// readEstimates feeds the buffered request body, a window at a time, to the
// pointer scanners of every charge awaiting its estimate.
func (s *Stream) readEstimates(st *settleState) {
	for i := range st.charges {
		if c := &st.charges[i]; c.estimate {
			ps := c.r.Settle.EstimatePointers
			c.scans = make([]ljson.PointerScanner, len(ps))
			for k := range ps {
				c.scans[k].Reset(ps[k])
				c.scans[k].Fold = true // keys as Go's encoding/json matches them
			}
		}
	}
	rb := s.p.rbr
	for start := 0; rb != nil && start < st.bodySize; {
		b, ok := rb.RequestBody(start, min(bodyWindow, st.bodySize-start))
		if !ok || len(b) == 0 {
			break
		}
		start += len(b)
		for i := range st.charges {
			if c := &st.charges[i]; c.estimate {
				for k := range c.scans {
					c.scans[k].Write(b)
				}
			}
		}
	}
}

// estimated is the estimate c's scanners found: the sum of the numbers at
// its pointers (a number, or a string holding one: the larger if the
// pointer has both), if any was found and all found are non-negative and
// finite and the sum is a valid cost; +Inf (the ceiling) when a scanner
// found the body unreadable.
func (c *charge) estimated() (float64, bool) {
	sum, any := 0.0, false
	for k := range c.scans {
		sc := &c.scans[k]
		sc.End()
		if sc.Unreadable() {
			c.scans = c.scans[:0]
			return math.Inf(1), true
		}
		v, ok := sc.Found()
		if q, qok := sc.Quoted(); qok && (!ok || q > v) {
			v, ok = q, true
		}
		if !ok {
			continue
		}
		if !(v >= 0) || math.IsInf(v, 0) {
			return 0, false
		}
		sum, any = sum+v, true
	}
	c.scans = c.scans[:0]
	return sum, any && sum >= minCost && !math.IsInf(sum, 0)
}

// awaitsEstimate reports whether r takes its estimate from the request body.
func awaitsEstimate(r *rule) bool { return r.Cost.Estimate == config.CostRequestJSON }
