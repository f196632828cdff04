package filter

import "github.com/tokengate/tokengate/ratelimitheader"

// The RateLimit response headers are formatted by package ratelimitheader,
// which the rate-limit service shares. An upstream's own RateLimit and
// RateLimit-Policy lines are kept, ours added after them as lines of their
// own.

// setRateLimitHeaders sets the RateLimit headers of an admitted request on
// its response and returns buf for reuse. The values are views of buf,
// which stays untouched until the next request. RateLimit and
// RateLimit-Policy are added as lines of their own after any the upstream
// sent (Structured Field Lists: several lines are one list, RFC 9110
// section 5.3), so the upstream's are neither read nor replaced; the legacy
// three are replaced.
func (p *Plugin) setRateLimitHeaders(buf []byte, quotas []ratelimitheader.Quota, best int) []byte {
	if hostRateLimitHeaders(p, quotas, best) { // the host formats them
		return buf
	}
	b, f := ratelimitheader.AppendFields(buf, quotas, best)
	p.host.SetResponseHeader("ratelimit-limit", quotas[best].Plan.Limit)
	if h := p.hbs; h != nil { // no string conversions, no call a header
		h.SetResponseHeaderBytes("ratelimit-remaining", b[f.Remaining[0]:f.Remaining[1]])
		h.SetResponseHeaderBytes("ratelimit-reset", b[f.Reset[0]:f.Reset[1]])
		h.AddResponseHeaderBytes("ratelimit", b[f.List[0]:f.List[1]])
		h.AddResponseHeaderBytes("ratelimit-policy", b[f.Policy[0]:f.Policy[1]])
		return b
	}
	p.setHeader("ratelimit-remaining", b[f.Remaining[0]:f.Remaining[1]])
	p.setHeader("ratelimit-reset", b[f.Reset[0]:f.Reset[1]])
	p.host.AddResponseHeader("ratelimit", string(b[f.List[0]:f.List[1]]))
	p.host.AddResponseHeader("ratelimit-policy", string(b[f.Policy[0]:f.Policy[1]]))
	return b
}
