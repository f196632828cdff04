package filter

import (
	"errors"
	"math"
	"strconv"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/ratelimitheader"
	"github.com/tokengate/tokengate/sharedstate"
)

// Rejection reasons, sent in X-Tokengate-Reason.
const (
	// ReasonExceeded: the bucket lacks the tokens the request costs.
	ReasonExceeded = "token_bucket_exceeded"
	// ReasonWindowExceeded: a fixed window lacks the tokens the request
	// costs (its limit, and what rolled over, are spent until a later
	// window starts).
	ReasonWindowExceeded = "fixed_window_exceeded"
	// ReasonCostExceedsBurst: the request costs more than the bucket can
	// ever hold, so retrying cannot help; no Retry-After is sent.
	ReasonCostExceedsBurst = "cost_exceeds_burst"
	// ReasonStoreError: the shared data failed and the rule fails closed.
	ReasonStoreError = "store_error"
	// ReasonContention: every compare-and-swap attempt lost its race
	// (settings.cas_max_attempts) and the rule fails closed.
	ReasonContention = "contention"
	// ReasonMissingKey: the request lacks a limit key of a rule with
	// "on_missing_key": "deny".
	ReasonMissingKey = "missing_key"
)

// gRPC status codes of local replies to gRPC requests.
const (
	grpcResourceExhausted int32 = 8
	grpcOutOfRange        int32 = 11
	grpcUnavailable       int32 = 14
)

// statusCostExceedsBurst answers a request that costs more than its bucket
// can ever hold: retrying cannot help, so it is not a 429 (which clients
// retry) but 413, as for content larger than the server will process.
const statusCostExceedsBurst = 413

// reasonOf is the reason a rejection by r's bucket, with result res, states.
func reasonOf(r *rule, res bucket.Result) string {
	switch {
	case math.IsInf(res.RetryAfter, 1):
		return ReasonCostExceedsBurst
	case r.Limit.Window > 0:
		return ReasonWindowExceeded
	}
	return ReasonExceeded
}

// retryAfterHash returns the Retry-After seconds for a bucket that needs
// wait seconds more: ceil(wait), at least 1, plus a jitter of 0 to 50% of
// that chosen by h, the hash of the client's identity, so that one client
// always gets the same offset and different clients spread out. The sum
// never exceeds ratelimitheader.MaxSeconds, like every seconds value a
// header states.
func retryAfterHash(wait float64, h uint64) int64 {
	base := max(ratelimitheader.Seconds(wait), 1)
	return min(base+int64(h%uint64(base/2+1)), ratelimitheader.MaxSeconds)
}

// localReply describes one local reply: a rate-limited request (429, or
// 413 for a cost no bucket can ever hold) or one the rate limiter could not
// decide (503). Stream.send is the one place that turns it into bytes.
type localReply struct {
	// unavailable makes it a 503 with gRPC status UNAVAILABLE and the body
	// error "rate_limiter_unavailable"; settings.rejection_body never
	// replaces that body.
	unavailable bool
	// reason is the X-Tokengate-Reason value and the body's reason;
	// ReasonCostExceedsBurst makes a 413 (gRPC OUT_OF_RANGE).
	reason string
	// details is the response code details; a gRPC reply's message is
	// "tokengate: " followed by it.
	details string
	// rule is the rule named in X-Tokengate-Rule and the body when
	// settings.rule_headers is on.
	rule *rule
	// retry is the Retry-After seconds; 0 sends none.
	retry int64
	// rateLimit are the RateLimit headers, sent after Retry-After when
	// settings.ratelimit_headers is on (the caller leaves them out
	// otherwise).
	rateLimit [][2]string
}

// status returns the HTTP status and the gRPC status of rep.
func (rep *localReply) status(set *config.Settings) (uint32, int32) {
	switch {
	case rep.unavailable:
		return 503, grpcUnavailable
	case rep.reason == ReasonCostExceedsBurst:
		return statusCostExceedsBurst, grpcOutOfRange
	}
	return set.RejectionStatus, grpcResourceExhausted
}

// send sends rep as the stream's local reply. Headers, in order:
// Retry-After, the RateLimit headers, X-Tokengate-Reason and -Rule
// (settings.rule_headers), Content-Type (not for gRPC). Body: for gRPC the
// host's status message ("tokengate: <details>"); else
// settings.rejection_body for a rate-limited reply that has one, else
//
//	{"error":"rate_limited","reason":"<reason>","rule":"<rule>","retry_after":<retry>}
//
// ("rate_limiter_unavailable" for a 503; "rule" only with rule headers,
// "retry_after" only with a Retry-After), and a newline. Values are views
// of the plugin's reply buffers, untouched until the next reply; the host
// copies them. The upstream never answers the request, so nothing is left
// to settle.
func (s *Stream) send(isGRPC bool, rep *localReply) {
	p := s.p
	set := &p.cfg.Settings
	buf := &p.buf
	s.dropCharges()
	hs := buf.replyHdrs[:0]
	if rep.retry > 0 {
		buf.retryBuf = strconv.AppendInt(buf.retryBuf[:0], rep.retry, 10)
		hs = append(hs, [2]string{"retry-after", p.view(buf.retryBuf)})
	}
	hs = append(hs, rep.rateLimit...)
	if set.RuleHeaders {
		hs = append(hs, [2]string{"x-tokengate-reason", rep.reason}, [2]string{"x-tokengate-rule", rep.rule.Name})
	}
	status, grpc := rep.status(set)
	body := buf.bodyBuf[:0]
	switch {
	case isGRPC:
		body = append(append(body, "tokengate: "...), rep.details...)
	case !rep.unavailable && set.RejectionBody != nil:
		body = append(body, set.RejectionBody...)
	default:
		body = rep.appendJSON(body, set.RuleHeaders)
	}
	if !isGRPC {
		grpc = NoGRPCStatus
		hs = append(hs, [2]string{"content-type", set.RejectionContentType})
	}
	buf.replyHdrs, buf.bodyBuf = hs, body
	if err := p.host.SendLocalResponse(status, rep.details, body, hs, grpc); err != nil {
		p.host.Log(LogError, "tokengate: send local response: "+err.Error())
	}
}

// appendJSON appends rep's JSON body to dst.
func (rep *localReply) appendJSON(dst []byte, ruleHeaders bool) []byte {
	dst = append(dst, `{"error":"`...)
	if rep.unavailable {
		dst = append(dst, "rate_limiter_unavailable"...)
	} else {
		dst = append(dst, "rate_limited"...)
	}
	dst = append(dst, `","reason":"`...)
	dst = append(dst, rep.reason...)
	if ruleHeaders {
		dst = append(dst, `","rule":"`...)
		dst = append(dst, rep.rule.Name...)
	}
	dst = append(dst, '"')
	if rep.retry > 0 {
		dst = append(dst, `,"retry_after":`...)
		dst = strconv.AppendInt(dst, rep.retry, 10)
	}
	return append(dst, "}\n"...)
}

// isGRPCRequest reports whether req is gRPC (IsGRPC of its content-type).
func isGRPCRequest(req *request) bool {
	ct, ok := req.header("content-type")
	return ok && IsGRPC(ct)
}

// sendRejection sends the local reply of a request rejected by the buckets
// of g: 429 (settings.rejection_status) or gRPC RESOURCE_EXHAUSTED when
// bucket w (the worst) lacks tokens, 413 or gRPC OUT_OF_RANGE when the
// request costs more than it can ever hold. retry is the Retry-After
// seconds, 0 for none. The RateLimit headers list every enforced rule: r
// is the whole tokens each bucket holds, t the seconds until this request
// could pass it (or, for a bucket that admitted it, until it is full).
func (s *Stream) sendRejection(req *request, g *group, w int, retry int64) {
	p := s.p
	rep := localReply{reason: reasonOf(g.rules[w], g.res[w]), details: "tokengate_rate_limited", rule: g.rules[w], retry: retry}
	if p.cfg.Settings.RateLimitHeaders {
		quotas := p.buf.quotas[:0]
		for i, rr := range g.rules {
			q := quotaOf(rr, g.res[i])
			if !g.res[i].Allowed && !math.IsInf(g.res[i].RetryAfter, 1) {
				q.Reset = ratelimitheader.Seconds(g.res[i].RetryAfter)
			}
			quotas = append(quotas, q)
		}
		p.buf.quotas = quotas
		// The values that vary go into one buffer, viewed as one string;
		// the others were built at configuration time.
		b, f := ratelimitheader.AppendFields(p.buf.rlBuf[:0], quotas, w)
		p.buf.rlBuf = b
		vals := p.view(b)
		rep.rateLimit = append(p.buf.rlHdrs[:0],
			[2]string{"ratelimit-limit", rep.rule.plan.Limit},
			[2]string{"ratelimit-remaining", vals[f.Remaining[0]:f.Remaining[1]]},
			[2]string{"ratelimit-reset", vals[f.Reset[0]:f.Reset[1]]},
			[2]string{"ratelimit", vals[f.List[0]:f.List[1]]},
			[2]string{"ratelimit-policy", vals[f.Policy[0]:f.Policy[1]]},
		)
		p.buf.rlHdrs = rep.rateLimit
	}
	s.send(isGRPCRequest(req), &rep)
}

// denyMissingKey answers a request that lacks a limit key of r, a rule
// with "on_missing_key": "deny": settings.rejection_status (gRPC
// RESOURCE_EXHAUSTED), no Retry-After, since waiting cannot help.
func (s *Stream) denyMissingKey(req *request, r *rule) Action {
	r.metrics.rejected.inc(s.p.host, 1)
	s.send(isGRPCRequest(req), &localReply{reason: ReasonMissingKey, details: "tokengate_missing_key", rule: r})
	return Pause
}

// sendStoreDenied sends the 503 reply of rule r, which fails closed when
// its bucket could not be updated: err says why (storeReason).
func (s *Stream) sendStoreDenied(isGRPC bool, r *rule, err error) {
	reason := storeReason(err)
	s.send(isGRPC, &localReply{unavailable: true, reason: reason, details: "tokengate_" + reason, rule: r})
}

// storeReason is the reason of a 503 for a store failure err: contention
// when every compare-and-swap attempt lost its race.
func storeReason(err error) string {
	if errors.Is(err, sharedstate.ErrContention) {
		return ReasonContention
	}
	return ReasonStoreError
}

// IsGRPC reports whether a request with this content-type is gRPC, by
// Envoy's rule (Grpc::Common::hasGrpcContentType): "application/grpc"
// followed by nothing, '+' or ';', here case-insensitively. gRPC-Web
// ("application/grpc-web...") is not: such a request gets the HTTP reply,
// unless Envoy's grpc_web filter runs before tokengate and has turned it
// into gRPC.
func IsGRPC(contentType string) bool {
	const g = "application/grpc"
	if len(contentType) < len(g) || !lite.EqualFoldASCII(contentType[:len(g)], g) {
		return false
	}
	return len(contentType) == len(g) || contentType[len(g)] == '+' || contentType[len(g)] == ';'
}
