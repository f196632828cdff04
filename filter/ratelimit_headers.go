package filter

import "strconv"

// The RateLimit response headers, after draft-ietf-httpapi-ratelimit-headers-09:
//
//	RateLimit: "per-ip";r=9;t=1, "per-key";r=99;t=1
//	RateLimit-Policy: "per-ip";q=10;w=2, "per-key";q=100;w=1
//
// one list member per enforced rule that applied, in configuration order
// (shadow rules never show). r is the whole tokens left in that rule's
// bucket; t is, on an admitted request, the seconds until the bucket is
// full again and, on a rejected one, the seconds until this request could
// pass that bucket. The legacy RateLimit-Limit, RateLimit-Remaining and
// RateLimit-Reset describe one rule: the one with the fewest tokens left,
// or on a rejection the rule that rejected. An upstream's own RateLimit and
// RateLimit-Policy lines are kept, ours added after them as lines of their
// own.

// rateLimitFields locates the values of the RateLimit headers in the buffer
// they were formatted into.
type rateLimitFields struct {
	list, policy [2]int // RateLimit and RateLimit-Policy: buf[from:to]
	best         rateLimitValue
	bestRule     *Rule
}

// rateLimitValue locates the numbers of one RateLimit list member in the
// buffer it was appended to: they are also the RateLimit-Remaining and
// RateLimit-Reset values, formatted once.
type rateLimitValue struct {
	remaining, remainingEnd int // buf[remaining:remainingEnd]
	reset, resetEnd         int // buf[reset:resetEnd]
}

// appendRateLimit appends one RateLimit list member,
// "<rule>";r=<remaining>;t=<reset>, to dst, and says where its numbers are.
func (q *quota) appendRateLimit(dst []byte, quoted string) ([]byte, rateLimitValue) {
	var n rateLimitValue
	dst = append(dst, quoted...)
	dst = append(dst, ";r="...)
	n.remaining = len(dst)
	dst = appendCount(dst, q.remaining)
	n.remainingEnd = len(dst)
	dst = append(dst, ";t="...)
	n.reset = len(dst)
	dst = appendCount(dst, q.reset)
	n.resetEnd = len(dst)
	return dst, n
}

// appendCount appends v in decimal, as strconv.AppendInt(dst, v, 10) does.
// Values in [0, 2^32), every count a header states but a burst beyond
// four billion, are written in place with 32-bit divisions: in the wasm
// guest strconv's path costs several calls and a copy through memmove.
func appendCount(dst []byte, v int64) []byte {
	if v < 0 || v >= 1<<32 {
		return strconv.AppendInt(dst, v, 10)
	}
	u := uint32(v)
	n := 1
	for x := u; x >= 10; x /= 10 {
		n++
	}
	l := len(dst)
	if cap(dst)-l < n {
		dst = append(dst, "0000000000"[:n]...)
	}
	dst = dst[:l+n]
	for i := l + n - 1; i > l; i-- {
		dst[i] = byte('0' + u%10)
		u /= 10
	}
	dst[l] = byte('0' + u)
	return dst
}

// appendRateLimitFields formats the RateLimit and RateLimit-Policy values
// of quotas into b; best indexes the quota the legacy headers describe.
func appendRateLimitFields(b []byte, quotas []quota, best int) ([]byte, rateLimitFields) {
	var f rateLimitFields
	f.list[0] = len(b)
	for i := range quotas {
		if i > 0 {
			b = append(b, ", "...)
		}
		var n rateLimitValue
		b, n = quotas[i].appendRateLimit(b, quotas[i].r.planOf().quoted)
		if i == best {
			f.best, f.bestRule = n, quotas[i].r
		}
	}
	f.list[1] = len(b)
	f.policy[0] = len(b)
	for i := range quotas {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, quotas[i].r.planOf().policy...)
	}
	f.policy[1] = len(b)
	return b, f
}

// setRateLimitHeaders sets the RateLimit headers of an admitted request on
// its response and returns buf for reuse. The values are views of buf,
// which stays untouched until the next request. RateLimit and
// RateLimit-Policy are added as lines of their own after any the upstream
// sent (Structured Field Lists: several lines are one list, RFC 9110
// section 5.3), so the upstream's are neither read nor replaced; the legacy
// three are replaced.
func (p *Plugin) setRateLimitHeaders(buf []byte, quotas []quota, best int) []byte {
	b, f := appendRateLimitFields(buf, quotas, best)
	p.host.SetResponseHeader("ratelimit-limit", f.bestRule.planOf().limit)
	if h := p.hbs; h != nil { // no string conversions, no call a header
		h.SetResponseHeaderBytes("ratelimit-remaining", b[f.best.remaining:f.best.remainingEnd])
		h.SetResponseHeaderBytes("ratelimit-reset", b[f.best.reset:f.best.resetEnd])
		h.AddResponseHeaderBytes("ratelimit", b[f.list[0]:f.list[1]])
		h.AddResponseHeaderBytes("ratelimit-policy", b[f.policy[0]:f.policy[1]])
		return b
	}
	p.setHeader("ratelimit-remaining", b[f.best.remaining:f.best.remainingEnd])
	p.setHeader("ratelimit-reset", b[f.best.reset:f.best.resetEnd])
	p.host.AddResponseHeader("ratelimit", string(b[f.list[0]:f.list[1]]))
	p.host.AddResponseHeader("ratelimit-policy", string(b[f.policy[0]:f.policy[1]]))
	return b
}
