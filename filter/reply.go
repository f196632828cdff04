package filter

import (
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/bucket"
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
)

// gRPC status codes of local replies to gRPC requests.
const (
	grpcResourceExhausted int32 = 8
	grpcUnavailable       int32 = 14
)

func reasonOf(res bucket.Result) string {
	if math.IsInf(res.RetryAfter, 1) {
		return ReasonCostExceedsBurst
	}
	return ReasonExceeded
}

// retryAfterHash returns the Retry-After seconds for a bucket that needs
// wait seconds more: ceil(wait), at least 1, plus a jitter of 0 to 50% of
// that chosen by h, the hash of the client's identity, so that one client
// always gets the same offset and different clients spread out.
func retryAfterHash(wait float64, h uint64) int64 {
	base := max(seconds(wait), 1)
	return base + int64(h%uint64(base/2+1))
}

// sendRejection sends the 429 (or gRPC RESOURCE_EXHAUSTED) local reply for
// rule r whose bucket answered res; retry is the Retry-After seconds, 0 for
// none.
func (s *Stream) sendRejection(req *request, r *Rule, res bucket.Result, retry int64) {
	p := s.p
	q := quotaOf(r, res.Tokens)
	q.remaining = 0
	reason := reasonOf(res)
	plan := r.planOf()
	// The values that vary go into one buffer, viewed as one string
	// (replyBuf stays untouched until the next rejection; the host copies
	// the headers); the others were built at configuration time.
	b := strconv.AppendInt(p.rc.replyBuf[:0], retry, 10)
	start := len(b)
	b, n := q.appendRateLimit(b, plan.quoted)
	p.rc.replyBuf = b
	vals := p.view(b)
	headers := p.rc.replyHdrs[:0]
	if retry > 0 {
		headers = append(headers, [2]string{"retry-after", vals[:start]})
	}
	headers = append(headers,
		[2]string{"ratelimit-limit", plan.limit},
		[2]string{"ratelimit-remaining", "0"},
		[2]string{"ratelimit-reset", vals[n.reset:]},
		[2]string{"ratelimit", vals[start:]},
		[2]string{"ratelimit-policy", plan.policy},
		[2]string{"x-tokengate-reason", reason},
		[2]string{"x-tokengate-rule", r.Name},
	)
	body := append(p.rc.bodyBuf[:0], `{"error":"rate_limited","reason":"`...)
	body = append(body, reason...)
	body = append(body, `","rule":"`...)
	body = append(body, r.Name...)
	body = append(body, '"')
	if retry > 0 {
		body = append(body, `,"retry_after":`...)
		body = strconv.AppendInt(body, retry, 10)
	}
	body = append(body, "}\n"...)
	p.rc.bodyBuf = body
	p.rc.replyHdrs = s.reply(req, 429, grpcResourceExhausted, "tokengate_rate_limited", body, headers)
}

// sendStoreDenied sends the 503 reply of a rule that fails closed.
func (s *Stream) sendStoreDenied(req *request, r *Rule) {
	headers := [][2]string{
		{"x-tokengate-reason", ReasonStoreError},
		{"x-tokengate-rule", r.Name},
	}
	body := `{"error":"rate_limiter_unavailable","reason":"` + ReasonStoreError + `","rule":"` + r.Name + `"}` + "\n"
	s.reply(req, 503, grpcUnavailable, "tokengate_store_error", []byte(body), headers)
}

// reply sends a local reply; a gRPC request gets grpcCode, with the details
// as grpc-message, instead of a JSON body. It returns headers, as extended,
// for reuse.
func (s *Stream) reply(req *request, status uint32, grpcCode int32, details string, body []byte, headers [][2]string) [][2]string {
	grpc := NoGRPCStatus
	if ct, ok := req.header("content-type"); ok && strings.HasPrefix(strings.ToLower(ct), "application/grpc") {
		grpc = grpcCode
		body = []byte("tokengate: " + details)
	} else {
		headers = append(headers, [2]string{"content-type", "application/json"})
	}
	if err := s.p.host.SendLocalResponse(status, details, body, headers, grpc); err != nil {
		s.p.host.Log(LogError, "tokengate: send local response: "+err.Error())
	}
	return headers
}
