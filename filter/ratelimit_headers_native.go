//go:build !wasip1

package filter

import "github.com/tokengate/tokengate/ratelimitheader"

// rateLimitHeaderSetter is implemented by native hosts that format an
// admitted request's RateLimit headers themselves, straight into what they
// send the proxy (filter/dynmod: the stream's mailbox), instead of taking
// five values formatted by the filter. They must write the bytes
// setRateLimitHeaders would, through package ratelimitheader:
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset set, then
// RateLimit and RateLimit-Policy added, in that order; and not keep quotas.
// The wasm guest's hosts never do (ratelimit_headers_wasip1.go), so the
// guest carries none of this.
type rateLimitHeaderSetter interface {
	SetRateLimitHeaders(quotas []ratelimitheader.Quota, best int)
}

// rateLimitHeaderHost is the host as a rateLimitHeaderSetter, nil if it is
// not one.
type rateLimitHeaderHost = rateLimitHeaderSetter

func findRateLimitHeaderSetter(h Host) rateLimitHeaderHost {
	s, _ := h.(rateLimitHeaderSetter)
	return s
}

// hostRateLimitHeaders has the host set the headers, if it can, and reports
// whether it did.
func hostRateLimitHeaders(p *Plugin, quotas []ratelimitheader.Quota, best int) bool {
	if p.rlh == nil {
		return false
	}
	p.rlh.SetRateLimitHeaders(quotas, best)
	return true
}
