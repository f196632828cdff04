package filter

import (
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/ratelimitheader"
)

// Rejection reasons, sent in X-Tokengate-Reason.
const (
	// ReasonExceeded: the bucket lacks the tokens the request costs.
	ReasonExceeded = "token_bucket_exceeded"
	// ReasonCostExceedsBurst: the request costs more than the bucket can
	// ever hold, so retrying cannot help; no Retry-After is sent.
	ReasonCostExceedsBurst = "cost_exceeds_burst"
	// ReasonStoreError: the shared data failed and the rule fails closed.
	ReasonStoreError = "store_error"
	// ReasonContention: every compare-and-swap attempt lost its race
	// (settings.cas_max_attempts) and the rule fails closed.
	ReasonContention = "contention"
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

func reasonOf(res bucket.Result) string {
	if math.IsInf(res.RetryAfter, 1) {
		return ReasonCostExceedsBurst
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

// sendRejection sends the local reply of a request rejected by the buckets
// of g: 429 (settings.rejection_status) or gRPC RESOURCE_EXHAUSTED when
// bucket w (the worst) lacks tokens, 413 or gRPC OUT_OF_RANGE when the
// request costs more than it can ever hold. retry is the Retry-After
// seconds, 0 for none. The RateLimit headers list every enforced rule: r
// is the whole tokens each bucket holds, t the seconds until this request
// could pass it (or, for a bucket that admitted it, until it is full).
func (s *Stream) sendRejection(req *request, g *group, w int, retry int64) {
	p := s.p
	st := &p.cfg.Settings
	r, res := g.rules[w], g.res[w]
	reason := reasonOf(res)
	status, grpc := st.RejectionStatus, grpcResourceExhausted
	if reason == ReasonCostExceedsBurst {
		status, grpc = statusCostExceedsBurst, grpcOutOfRange
	}
	// The values that vary go into one buffer, viewed as one string
	// (replyBuf stays untouched until the next rejection; the host copies
	// the headers); the others were built at configuration time.
	b := strconv.AppendInt(p.rc.replyBuf[:0], retry, 10)
	retryEnd := len(b)
	headers := p.rc.replyHdrs[:0]
	var f ratelimitheader.Fields
	if st.RateLimitHeaders {
		quotas := p.rc.quotas[:0]
		for i, rr := range g.rules {
			q := quotaOf(rr, g.res[i])
			if !g.res[i].Allowed && !math.IsInf(g.res[i].RetryAfter, 1) {
				q.Reset = ratelimitheader.Seconds(g.res[i].RetryAfter)
			}
			quotas = append(quotas, q)
		}
		p.rc.quotas = quotas
		b, f = ratelimitheader.AppendFields(b, quotas, w)
	}
	p.rc.replyBuf = b
	vals := p.view(b)
	if retry > 0 {
		headers = append(headers, [2]string{"retry-after", vals[:retryEnd]})
	}
	if st.RateLimitHeaders {
		headers = append(headers,
			[2]string{"ratelimit-limit", r.plan.Limit},
			[2]string{"ratelimit-remaining", vals[f.Remaining[0]:f.Remaining[1]]},
			[2]string{"ratelimit-reset", vals[f.Reset[0]:f.Reset[1]]},
			[2]string{"ratelimit", vals[f.List[0]:f.List[1]]},
			[2]string{"ratelimit-policy", vals[f.Policy[0]:f.Policy[1]]},
		)
	}
	if st.RuleHeaders {
		headers = append(headers,
			[2]string{"x-tokengate-reason", reason},
			[2]string{"x-tokengate-rule", r.Name},
		)
	}
	body := p.rc.bodyBuf[:0]
	if st.RejectionBody != nil {
		body = append(body, st.RejectionBody...)
	} else {
		body = append(body, `{"error":"rate_limited","reason":"`...)
		body = append(body, reason...)
		if st.RuleHeaders {
			body = append(body, `","rule":"`...)
			body = append(body, r.Name...)
		}
		body = append(body, '"')
		if retry > 0 {
			body = append(body, `,"retry_after":`...)
			body = strconv.AppendInt(body, retry, 10)
		}
		body = append(body, "}\n"...)
	}
	p.rc.bodyBuf = body
	p.rc.replyHdrs = s.reply(req, status, grpc, "tokengate_rate_limited", body, headers)
}

// sendStoreDenied sends the 503 reply of a rule that fails closed when its
// bucket could not be updated; reason says why.
func (s *Stream) sendStoreDenied(req *request, r *rule, reason string) {
	var headers [][2]string
	body := `{"error":"rate_limiter_unavailable","reason":"` + reason + `"}` + "\n"
	if s.p.cfg.Settings.RuleHeaders {
		headers = [][2]string{{"x-tokengate-reason", reason}, {"x-tokengate-rule", r.Name}}
		body = `{"error":"rate_limiter_unavailable","reason":"` + reason + `","rule":"` + r.Name + `"}` + "\n"
	}
	s.reply(req, 503, grpcUnavailable, "tokengate_"+reason, []byte(body), headers)
}

// reply sends a local reply; a gRPC request gets grpcCode, with the details
// as grpc-message, instead of a JSON body. It returns headers, as extended,
// for reuse.
func (s *Stream) reply(req *request, status uint32, grpcCode int32, details string, body []byte, headers [][2]string) [][2]string {
	ct, ok := req.header("content-type")
	return s.replyAs(ok && IsGRPC(ct), status, grpcCode, details, body, headers)
}

// replyAs is reply for a request already known to be gRPC or not.
func (s *Stream) replyAs(isGRPC bool, status uint32, grpcCode int32, details string, body []byte, headers [][2]string) [][2]string {
	s.dropCharges() // the upstream never answers this request: nothing to settle
	grpc := NoGRPCStatus
	if isGRPC {
		grpc = grpcCode
		body = []byte("tokengate: " + details)
	} else {
		headers = append(headers, [2]string{"content-type", s.p.cfg.Settings.RejectionContentType})
	}
	if err := s.p.host.SendLocalResponse(status, details, body, headers, grpc); err != nil {
		s.p.host.Log(LogError, "tokengate: send local response: "+err.Error())
	}
	return headers
}

// IsGRPC reports whether a request with this content-type is gRPC, by
// Envoy's rule (Grpc::Common::hasGrpcContentType): "application/grpc"
// followed by nothing, '+' or ';', here case-insensitively. gRPC-Web
// ("application/grpc-web...") is not: such a request gets the HTTP reply,
// unless Envoy's grpc_web filter runs before tokengate and has turned it
// into gRPC.
func IsGRPC(contentType string) bool {
	const g = "application/grpc"
	if len(contentType) < len(g) || !strings.EqualFold(contentType[:len(g)], g) {
		return false
	}
	return len(contentType) == len(g) || contentType[len(g)] == '+' || contentType[len(g)] == ';'
}
