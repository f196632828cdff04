package filter

import (
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/ratelimitheader"
	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// The paths of ShouldRateLimit in either protocol; the descriptor sent for
// a cluster rule is rlscontract.ClusterDescriptor (docs/rls.md).
const (
	rlsPath     = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	rlsJSONPath = "/json"
)

// pendingCall is a request paused while the rate-limit service decides its
// cluster rules, or while a lease refill decides its lease rules. A
// cluster call's record views the request's state (Stream.st: its local
// buckets, debits and cluster buckets), which stays the request's while the
// call is in flight: the stream's end drops the call (abandon) before the
// state is reused. A lease wait's record owns copies (leaseWait), since it
// may outlive the stream until the next refill.
type pendingCall struct {
	s      *Stream
	now    float64
	grpc   bool
	idHash uint64
	// local are the local buckets that admitted the request: refunded if
	// the cluster rules reject it.
	local []sharedstate.Request
	// rules are the cluster rules asked about, in descriptor order, and
	// buckets the shared-data buckets they fall back to (on_error: local).
	rules   []*rule
	buckets []sharedstate.Request
	// leaseKeys are the allowance keys of cold lease rules, by rule index
	// ("" for others; nil if none): a rejection marks them empty.
	leaseKeys []string
	// lease are the allowances lease rules debited: given back with the
	// local buckets (lease_admit.go).
	lease []leaseDebit
	// body: the call asks for the rest of a request body's estimate
	// (cluster_estimate.go); a refusal gives back what the settling rules
	// took, and there are no shared-data buckets to fall back to.
	body bool
}

// askCluster sends the request's cluster rules, st.cluster, to the
// rate-limit service and pauses the request; the local buckets
// (st.enforce) and the lease allowances (st.debits) already admitted it.
func (s *Stream) askCluster(st *reqState) Action {
	p := s.p
	g, req, now := &st.cluster, &st.req, st.now
	if s.costOverBurst(st, g) {
		return Pause
	}
	pc := &pendingCall{s: s, now: now, idHash: req.identityHash(), grpc: isGRPCRequest(req),
		local: st.enforce.reqs, lease: st.debits, rules: g.rules, buckets: g.reqs}

	if p.caller == nil {
		return s.clusterFailed(pc, "the host has no HTTP callouts", false)
	}
	ds := make([]rlscontract.Descriptor, len(g.rules))
	for i, r := range g.rules {
		vals := st.vals[g.vals[i][0]:g.vals[i][1]]
		comp, hits := string(sharedstate.AppendComposite(nil, vals)), uint64(math.Ceil(g.reqs[i].Cost))
		if r.Lease == nil {
			ds[i] = clusterDescriptor(req, r, comp, hits)
		} else {
			// A cold lease rule: an exact take from its lease bucket.
			ds[i] = rlscontract.LeaseDescriptor(rlscontract.Lease{Rule: r.Name, Composite: comp, Want: hits})
			if pc.leaseKeys == nil {
				pc.leaseKeys = make([]string, len(g.rules))
			}
			pc.leaseKeys[i] = string(sharedstate.AppendLeaseKey(nil, r.Name, vals))
		}
	}
	return s.sendCall(pc, ds, s.trackCluster(g, ds))
}

// sendCall sends the call of pc, with descriptors ds and the stream's
// receipt id ("": none, cluster_settle.go), and pauses the request until
// pc.answered has the answer; a call that cannot be sent is a failure of
// the service (clusterFailed).
func (s *Stream) sendCall(pc *pendingCall, ds []rlscontract.Descriptor, receipt string) Action {
	p := s.p
	rls := p.cfg.Settings.RLS
	token, err := callRLSWith(p.caller, rls, ds, rls.TimeoutMs, nil, receipt)
	if err != nil {
		return s.clusterFailed(pc, "dispatch: "+err.Error(), false)
	}
	p.callouts.add(token, pc.answered)
	s.st.cont.call = token
	return Pause
}

// clusterDescriptor is the descriptor of cluster rule r for composite key
// comp and hits, for request req (read in the current callback), built in
// one place: rlscontract.ClusterDescriptor, and
// for a quota whose identity carries its limit ("limit_source": a header
// or a verified JWT claim, read as limit keys are read) the limit as the
// third entry (rlscontract.QuotaDescriptor). The value is sent as the
// request states it; the service ignores one that is not a number > 0
// and bounds the others by max_limit.
func clusterDescriptor(req *request, r *rule, comp string, hits uint64) rlscontract.Descriptor {
	limit := ""
	if q := r.Quota; q != nil && q.LimitSource != nil {
		limit, _ = req.value(*q.LimitSource)
	}
	return rlscontract.QuotaDescriptor(r.Name, comp, limit, hits)
}

// callRLS sends a RateLimitRequest with descriptors ds to the service, in
// settings.rls.protocol: unary gRPC (HTTP/2 cluster) or JSON over HTTP/1.1
// to the service's /json, as envoyproxy/ratelimit and tokengate-rls serve it.
func callRLS(caller Caller, rls *config.RLSSettings, ds []rlscontract.Descriptor) (uint32, error) {
	return callRLSWith(caller, rls, ds, rls.TimeoutMs, nil, "")
}

// callRLSWith is callRLS with its own timeout, extra request headers (a
// settlement's mark) and the stream's receipt id ("": none): either
// protocol carries them as HTTP headers, which gRPC delivers to the
// service as metadata.
func callRLSWith(caller Caller, rls *config.RLSSettings, ds []rlscontract.Descriptor, timeoutMs uint32, extra [][2]string, receipt string) (uint32, error) {
	var body []byte
	var headers [][2]string
	if rls.Protocol == config.RLSProtocolJSON {
		body = rlscontract.AppendRequestJSON(nil, rls.Domain, ds, 0)
		headers = [][2]string{
			{":method", "POST"}, {":path", rlsJSONPath}, {":authority", rls.Authority},
			{"content-type", "application/json"}, {rlscontract.ReceiptHeader, receipt},
		}
	} else {
		body = rlscontract.Frame(nil, rlscontract.AppendRequest(nil, rls.Domain, ds, 0))
		headers = [][2]string{
			{":method", "POST"}, {":path", rlsPath}, {":authority", rls.Authority},
			{"content-type", "application/grpc"}, {"te", "trailers"}, {rlscontract.ReceiptHeader, receipt},
		}
	}
	if receipt == "" {
		headers = headers[:len(headers)-1] // no receipt header
	}
	if rls.Credential != "" {
		// Settlements and lease calls need it (docs/rls.md#trust-model).
		headers = append(headers, [2]string{"authorization", "Bearer " + rls.Credential})
	}
	return caller.HTTPCall(rls.Cluster, append(headers, extra...), body, timeoutMs)
}

func cloneReqs(reqs []sharedstate.Request) []sharedstate.Request {
	out := make([]sharedstate.Request, len(reqs))
	for i, r := range reqs {
		r.Key, r.Alt, r.Owner, r.Stored = strings.Clone(r.Key), strings.Clone(r.Alt), strings.Clone(r.Owner), strings.Clone(r.Stored)
		out[i] = r
	}
	return out
}

// answered is the rate-limit service's answer for a paused request, or its
// failure (no headers): the request goes on or is answered as the decision
// or settings.rls.on_error says.
func (pc *pendingCall) answered(p *Plugin, numHeaders, bodySize int) {
	pc.s.st.cont.call = 0
	if !p.caller.SetEffectiveContext(pc.s.id) {
		pc.s.dropHold(true) // gone: never continued
		return
	}
	resp, reason := p.readRLS(numHeaders, bodySize)
	if reason != "" {
		pc.s.clusterFailed(pc, reason, true)
		return
	}
	pc.s.clusterAnswer(pc, &resp)
}

// readRLS reads the call response. gRPC: HTTP 200, gRPC status 0 (in the
// trailers, or in the headers of a trailers-only answer), one uncompressed
// message. JSON: HTTP 200 (OK) or 429 (OVER_LIMIT) with the response in
// the body, as envoyproxy/ratelimit's /json answers; any other status (its
// 400 for a failed decision or a bad request, 500 for UNKNOWN; tokengate-rls's
// 503 when Redis fails) is an error.
func (p *Plugin) readRLS(numHeaders, bodySize int) (rlscontract.Response, string) {
	var none rlscontract.Response
	c := p.caller
	if numHeaders == 0 {
		return none, "no response (timeout or connection failure)"
	}
	st, _ := c.CallResponseHeader(":status")
	if p.cfg.Settings.RLS.Protocol == config.RLSProtocolJSON {
		if st != "200" && st != "429" {
			return none, "HTTP status " + st
		}
		b, ok := c.CallResponseBody(bodySize)
		if !ok {
			return none, "unreadable body"
		}
		resp, err := rlscontract.ParseResponseJSON(b)
		if err != nil {
			return none, err.Error()
		}
		return resp, ""
	}
	if st != "200" {
		return none, "HTTP status " + st
	}
	gs, ok := c.CallResponseTrailer("grpc-status")
	if !ok {
		gs, ok = c.CallResponseHeader("grpc-status")
	}
	if !ok || gs != "0" {
		return none, "gRPC status " + gs
	}
	b, ok := c.CallResponseBody(bodySize)
	if !ok {
		return none, "unreadable body"
	}
	msg, err := rlscontract.Unframe(b)
	if err != nil {
		return none, err.Error()
	}
	resp, err := rlscontract.ParseResponse(msg)
	if err != nil {
		return none, err.Error()
	}
	return resp, ""
}

// clusterAnswer applies the service's decision: the request passes unless
// an enforced rule's status is OVER_LIMIT (or, without statuses, the
// overall code is), in which case the local buckets are refunded and the
// request gets the rejection with the service's headers.
func (s *Stream) clusterAnswer(pc *pendingCall, resp *rlscontract.Response) {
	p := s.p
	worst := -1
	if len(resp.Statuses) == len(pc.rules) {
		for i, st := range resp.Statuses {
			r := pc.rules[i]
			switch {
			case st.Code != rlscontract.CodeOverLimit:
				if !s.deferCount(r) {
					r.metrics.allowed.inc(p.host, 1)
				}
			case r.Shadow:
				r.metrics.shadowRejected.inc(p.host, 1)
			default:
				r.metrics.rejected.inc(p.host, 1)
				if worst < 0 || st.UntilReset > resp.Statuses[worst].UntilReset {
					worst = i
				}
			}
			if st.Code == rlscontract.CodeOverLimit && pc.leaseKeys != nil && pc.leaseKeys[i] != "" {
				p.leaseKnownEmpty(pc.leaseKeys[i], pc.now, st.UntilReset)
			}
		}
	} else if resp.OverallCode == rlscontract.CodeOverLimit {
		// No status per rule: the overall code is the enforced rules'
		// (servers leave shadow rules out of it). Shadow rules count a
		// would-be rejection and never reject; without an enforced rule
		// the request passes.
		for i, r := range pc.rules {
			if r.Shadow {
				r.metrics.shadowRejected.inc(p.host, 1)
				continue
			}
			r.metrics.rejected.inc(p.host, 1)
			if worst < 0 {
				worst = i
			}
		}
	} else if resp.OverallCode != rlscontract.CodeOK {
		s.clusterFailed(pc, "overall code "+strconv.Itoa(resp.OverallCode), true)
		return
	}
	if worst < 0 {
		s.admitCluster(pc, resp)
		s.st.rlsHeaders = resp.Headers
		s.proceed(pc)
		return
	}
	s.refundLocal(pc)
	var st rlscontract.Status
	if worst < len(resp.Statuses) {
		st = resp.Statuses[worst]
	}
	retry := retryAfterHash(st.UntilReset, pc.idHash)
	s.sendClusterRejection(pc, pc.rules[worst], st, retry, resp.Headers)
}

// clusterFailed applies settings.rls.on_error. resumed says whether the
// request is paused (the call was sent) rather than still in
// proxy_on_request_headers, where the answer is the returned Action.
func (s *Stream) clusterFailed(pc *pendingCall, reason string, resumed bool) Action {
	p := s.p
	p.metrics.rlsErrors.inc(p.host, 1)
	p.warnf(pc.now, "event=rls_error reason="+strconv.Quote(reason))
	act := Continue
	switch p.cfg.Settings.RLS.OnError {
	case config.OnErrorAllow:
		for _, r := range pc.rules {
			r.metrics.failOpen.inc(p.host, 1)
		}
	case config.OnErrorDeny:
		// Only an enforced rule fails closed; shadow rules fail open, as
		// a local shadow rule does on a store error (observe). The 503
		// names and counts the first enforced rule.
		denier := -1
		for i, r := range pc.rules {
			if r.Shadow {
				r.metrics.failOpen.inc(p.host, 1)
			} else if denier < 0 {
				denier = i
			}
		}
		if denier < 0 {
			break
		}
		s.refundLocal(pc)
		r := pc.rules[denier]
		r.metrics.storeDenied.inc(p.host, 1)
		s.sendUnavailable(pc, r)
		act = Pause
	case config.OnErrorLocal:
		act = s.clusterLocally(pc)
	}
	s.dropAwaiting() // the service took nothing (on_error: local settles in shared data)
	if resumed && act == Continue {
		s.proceed(pc)
	}
	return act
}

// clusterLocally decides the cluster rules with shared-data buckets of
// their own, as local rules (on_error: local).
func (s *Stream) clusterLocally(pc *pendingCall) Action {
	p := s.p
	res := make([]bucket.Result, len(pc.buckets))
	var enforce, shadow []sharedstate.Request
	var rules, shadows []*rule
	for i, r := range pc.rules {
		if i >= len(pc.buckets) || r.Quota != nil {
			// Nothing to decide it with here: a quota's consumption is
			// counted in the service only, and a body's estimate has no
			// shared-data bucket (cluster_estimate.go). Fails open.
			r.metrics.failOpen.inc(p.host, 1)
			continue
		}
		if r.Shadow {
			shadow = append(shadow, pc.buckets[i])
			shadows = append(shadows, r)
		} else {
			enforce = append(enforce, pc.buckets[i])
			rules = append(rules, r)
		}
	}
	if len(shadow) > 0 {
		// Shadow rules observe in shared data too (their keys carry the
		// shadow prefix), as local shadow rules do: counted, never
		// rejecting, failing open.
		out := p.upd.TakeAll(shadow, pc.now, res[:len(shadow)])
		for i, r := range shadows {
			switch {
			case out.Err != nil:
				r.metrics.failOpen.inc(p.host, 1)
			case out.Allowed:
				r.metrics.allowed.inc(p.host, 1)
			case !out.Results[i].Allowed:
				r.metrics.shadowRejected.inc(p.host, 1)
			}
		}
	}
	if len(enforce) == 0 {
		return Continue
	}
	out := p.upd.TakeAll(enforce, pc.now, res[:len(enforce)])
	switch {
	case out.Err != nil:
		// The rules are local now: their on_store_error decides, as in
		// undecided.
		for _, r := range rules {
			if r.DenyOnStoreError {
				s.refundLocal(pc)
				r.metrics.storeDenied.inc(p.host, 1)
				p.warnf(pc.now, "event=store_denied rule="+r.Name+" reason="+quote(out.Err))
				s.sendStoreDenied(pc.grpc, r, out.Err)
				return Pause
			}
		}
		for _, r := range rules {
			r.metrics.failOpen.inc(p.host, 1)
		}
		return Continue
	case out.Allowed:
		for _, r := range rules {
			r.metrics.allowed.inc(p.host, 1)
		}
		s.settleClusterLocally(rules, enforce)
		return Continue
	}
	w := worst(out.Results)
	for i, r := range rules {
		if !out.Results[i].Allowed {
			r.metrics.rejected.inc(p.host, 1)
		}
	}
	s.refundLocal(pc)
	st := rlscontract.Status{Code: rlscontract.CodeOverLimit, UntilReset: out.Results[w].RetryAfter,
		LimitRemaining: uint32(min(quotaOf(rules[w], out.Results[w]).Remaining, math.MaxUint32))}
	s.sendClusterRejection(pc, rules[w], st, retryAfterHash(st.UntilReset, pc.idHash), nil)
	return Pause
}

// refundLocal gives back what the local buckets took for a request the
// cluster rules turned down.
func (s *Stream) refundLocal(pc *pendingCall) {
	p := s.p
	if pc.body {
		s.refundCharges() // what the headers took, the service's included
	}
	s.dropHold(false) // refunded below with the rest
	s.dropCharges()   // refunded whole: nothing is left to settle
	p.leaseRefund(pc.lease)
	if len(pc.local) == 0 {
		return
	}
	if _, err := p.upd.Refund(pc.local, pc.now); err != nil {
		p.warnf(pc.now, "event=refund_error reason="+strconv.Quote(err.Error()))
	}
}

// resume continues the paused request (the effective context is set).
func (s *Stream) resume() {
	if err := s.p.caller.ContinueRequest(); err != nil {
		s.p.host.Log(LogError, "tokengate: continue stream: "+err.Error())
	}
}

// sendClusterRejection answers a request a cluster rule rejected: the
// rule's status, the service's response headers (its RateLimit headers)
// or, without them, RateLimit headers built from the status: r its
// remaining tokens, t its duration until reset, without the jitter of
// Retry-After (retry), as for a local rejection.
func (s *Stream) sendClusterRejection(pc *pendingCall, r *rule, st rlscontract.Status, retry int64, rlsHeaders [][2]string) {
	p := s.p
	rep := localReply{reason: ReasonExceeded, details: "tokengate_rate_limited", rule: r, retry: retry}
	if p.cfg.Settings.RateLimitHeaders {
		hs := p.buf.rlHdrs[:0]
		if len(rlsHeaders) > 0 {
			for _, h := range rlsHeaders {
				// Our Retry-After (jittered per identity) stands; a
				// service's own (tokengate-rls sends one for Envoy's
				// ratelimit filter) would be a second value.
				if !lite.EqualFoldASCII(h[0], "retry-after") {
					hs = append(hs, h)
				}
			}
		} else {
			hs = append(hs,
				[2]string{"ratelimit", r.plan.Quoted + ";r=" + strconv.FormatUint(uint64(st.LimitRemaining), 10) + ";t=" + strconv.FormatInt(ratelimitheader.Seconds(st.UntilReset), 10)},
				[2]string{"ratelimit-policy", r.plan.Policy})
		}
		p.buf.rlHdrs, rep.rateLimit = hs, hs
	}
	s.send(pc.grpc, &rep)
}

// costOverBurst answers a request that costs more than the burst of an
// enforced rule of g (cluster or lease rules) and reports whether it did:
// no bucket of the rule can ever hold that cost, so it is answered here, as
// a local rule answers it (413), without asking the service, and the local
// buckets that admitted the request are refunded. Shadow rules are left to
// the service, which counts them as would-be rejections.
func (s *Stream) costOverBurst(st *reqState, g *group) bool {
	for i, r := range g.rules {
		if !r.Shadow && g.reqs[i].Cost > r.Limit.Burst {
			pc := &pendingCall{s: s, now: st.now, local: st.enforce.reqs, grpc: isGRPCRequest(&st.req)}
			s.refundLocal(pc)
			s.sendCostExceedsBurst(pc, r)
			return true
		}
	}
	return false
}

// sendCostExceedsBurst answers a request that costs more than cluster rule
// r's bucket can ever hold as sendRejection answers it for a local rule:
// 413 (gRPC OUT_OF_RANGE), reason cost_exceeds_burst, no Retry-After. The
// RateLimit header that states what remains is left out (the service was
// not asked, so this proxy does not know); RateLimit-Policy is sent.
func (s *Stream) sendCostExceedsBurst(pc *pendingCall, r *rule) {
	p := s.p
	r.metrics.rejected.inc(p.host, 1)
	rep := localReply{reason: ReasonCostExceedsBurst, details: "tokengate_rate_limited", rule: r}
	if p.cfg.Settings.RateLimitHeaders {
		rep.rateLimit = append(p.buf.rlHdrs[:0], [2]string{"ratelimit-policy", r.plan.Policy})
		p.buf.rlHdrs = rep.rateLimit
	}
	s.send(pc.grpc, &rep)
}

// sendUnavailable is the 503 of on_error: deny.
func (s *Stream) sendUnavailable(pc *pendingCall, r *rule) {
	s.send(pc.grpc, &localReply{unavailable: true, reason: "rls_error", details: "tokengate_rls_error", rule: r})
}
