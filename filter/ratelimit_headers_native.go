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

// IdleResponseHeaders is OnResponseHeaders(0, false) for an idle stream
// (Idle, which the caller checked) of a host that sets the RateLimit
// headers itself (a rateLimitHeaderSetter), without OnResponseHeaders'
// deferred recover: for a host that finishes an idle stream in the
// callback that decided it (filter/dynmod's one crossing), under its own
// recover, which hands a panic to RecoverResponseHeaders. For an idle
// stream OnResponseHeaders has nothing else to do: no charge to settle, no
// rate-limit service headers. It reports false, doing nothing, for another
// host: the caller then calls OnResponseHeaders.
func (s *Stream) IdleResponseHeaders() bool {
	p := s.p
	if p.rlh == nil {
		return false
	}
	if len(s.st.quotas) > 0 && p.cfg != nil && p.cfg.Settings.RateLimitHeaders {
		p.buf.hdrBuf = p.buf.hdrBuf[:0]
		p.rlh.SetRateLimitHeaders(s.st.quotas, s.st.best)
	}
	p.buf.nowSet = false // the callback ends, as recoverTo ends it
	return true
}

// RecoverResponseHeaders is what OnResponseHeaders' deferred recover does
// with v, a panic recovered from IdleResponseHeaders: the callback ends,
// and the panic is counted and logged as one in proxy_on_response_headers
// (recoverTo's log line and count; TestIdleResponseHeaders compares them).
func (s *Stream) RecoverResponseHeaders(v any) {
	p := s.p
	p.buf.nowSet = false
	msg := "unknown value"
	switch x := v.(type) {
	case string:
		msg = x
	case error:
		msg = x.Error()
	}
	p.metrics.panics.inc(p.host, 1)
	p.host.Log(LogCritical, "tokengate: recovered panic in proxy_on_response_headers, failing open: "+msg)
}

// ReleaseIdle is Release for a stream finished through
// IdleResponseHeaders: while the stream is idle its end (Stream.end: no
// wait to abandon, no hold, nothing to settle) would change nothing, so
// only the release itself is left; a stream that is not idle any more is
// released in full.
func (s *Stream) ReleaseIdle() {
	p := s.p
	if p == nil || !s.Idle() {
		s.Release()
		return
	}
	p.buf.nowSet = false // as Release
	if len(p.free) >= maxFreeStreams {
		return
	}
	s.id = 0
	s.st.clear()
	p.free = append(p.free, s)
}
