package filter

import (
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/ratelimitheader"
	"github.com/tokengate/tokengate/sharedstate"
)

// Plugin is one configured instance of the filter: a proxy-wasm root
// context. A VM runs one callback at a time, so a Plugin and its streams are
// used by one goroutine; the scratch space below is reused across requests.
type Plugin struct {
	host Host
	// Clock returns the current time in seconds since the Unix epoch. It
	// defaults to the wall clock (WASI clock_time_get inside the guest).
	Clock func() float64

	cfg *config.Config
	// rules is the runtime state of cfg's rules (rules.go).
	rules   ruleSet
	metrics pluginMetrics
	upd     sharedstate.Updater
	seed    uint64 // slot seed shared by every worker; see sharedstate.SlotPair
	seeds   sharedstate.SeedKeeper

	store *sharedstate.LocalFallback

	// buf is the scratch of the callback being run; a request's own
	// state is its stream's (Stream.st).
	buf scratch
	// est and estShadow are the buckets a request's body estimate takes
	// from (estimate.go), reused from one request to the next.
	est, estShadow group

	// The host's optional capabilities, found once by NewPlugin (host.go);
	// nil when the host lacks them. caller: callouts and stream resumption
	// (cluster and lease rules, held requests); br: the response body
	// (response_json and response_sse costs); rhs: request headers
	// (strip_accept_encoding); rbr: the request body (request_json
	// estimates); hbs, rlh, ps, bv, bl save copies.
	caller Caller
	br     bodyReader
	rbr    requestBodyReader
	rhs    requestHeaderSetter
	hbs    headerBytesSetter
	rlh    rateLimitHeaderHost
	ps     propertyStringer
	bv     bytesViewer
	bl     bytesLogger
	// free holds released streams for NewStream to reuse.
	free []*Stream
	// callouts are the calls in flight and the owners of their answers
	// (callouts.go); settling counts the settlements among them
	// (cluster_settle.go).
	callouts calloutTable
	settling int
	// lease is the lease-mode state of this worker (lease_tick.go).
	lease leaseState
	// timer is the worker's one timer (timer.go): held requests
	// (delay.go) and lease mode's refills arm entries in it; held counts
	// the held requests.
	timer timer
	held  int

	// warn limits warn-level lines on the request path so that a store
	// outage cannot flood the proxy's log; see warnf.
	warn       bucket.State
	suppressed int
}

// warnLimit allows 10 warn lines a second per worker, in bursts of 20.
var warnLimit = bucket.Limit{Rate: 10, Burst: 20}

// scratch is what the plugin keeps for the callback it is running: its
// time, read once, and buffers for header values, local replies and log
// lines. A VM runs one callback at a time, so one scratch per plugin serves
// every stream. Only the buffers' capacity outlives a callback.
//
// Lifetime: the filter hands the host views of hdrBuf and of the reply
// buffers (ViewString); it leaves them untouched until the next response
// or reply, and the host copies what it keeps, as Envoy does.
type scratch struct {
	// now is the time of the callback being run (see Plugin.time).
	now    float64
	nowSet bool
	// hdrBuf holds the RateLimit values formatted for a response; the
	// RateLimit-Remaining and -Reset values are slices of it.
	hdrBuf []byte
	// The local reply's buffers (reply.go): its Retry-After, its RateLimit
	// values and headers, all its headers, its body; quotas is a
	// rejection's scratch for the RateLimit list.
	retryBuf, rlBuf, bodyBuf []byte
	rlHdrs, replyHdrs        [][2]string
	quotas                   []ratelimitheader.Quota
	// logBuf holds a debug line (logDescribe).
	logBuf []byte
}

// NewPlugin returns an unconfigured plugin talking to h.
func NewPlugin(h Host) *Plugin {
	p := &Plugin{host: h, Clock: wallClock}
	p.store = &sharedstate.LocalFallback{Host: h, OnFallback: p.localState}
	p.upd.Store = p.store
	p.findCapabilities(h)
	// Workers that collide on a key must not retry in lockstep; seed each
	// plugin instance (one per worker VM) differently.
	p.upd.Backoff = sharedstate.SpinBackoff(rand.Uint64())
	p.metrics = pluginMetrics{
		panics:         define(h, MetricPanics),
		configRejected: define(h, MetricConfigRejected),
		corrupt:        define(h, MetricCorruptState),
		seedErrors:     define(h, MetricSeedErrors),
		localState:     define(h, MetricLocalState),
		rlsErrors:      define(h, MetricRLSErrors),
		leaseCalls:     define(h, MetricLeaseCalls),
		settleCalls:    define(h, MetricRLSSettleCalls),
		settleErrors:   define(h, MetricRLSSettleErrors),
	}
	return p
}

// Config returns the configuration in force, or nil before the first
// successful OnConfigure.
func (p *Plugin) Config() *config.Config { return p.cfg }

// OnVMStart is proxy_on_vm_start. The VM configuration is not used.
func (p *Plugin) OnVMStart(vmConfig []byte) bool { return true }

// OnConfigure is proxy_on_configure: it parses data and, if it is valid,
// puts it in force. An invalid configuration is logged at error level with
// the field's path, counted, and refused (false); the previous
// configuration, if any, stays in force.
func (p *Plugin) OnConfigure(data []byte) (ok bool) {
	defer p.recoverTo("proxy_on_configure", func() { ok = false })
	cfg, err := config.Parse(data)
	if err != nil {
		p.metrics.configRejected.inc(p.host, 1)
		p.host.Log(LogError, "tokengate: invalid configuration: "+err.Error())
		return false
	}
	rules := newRules(cfg, p.host)
	p.refreshSeed()
	p.cfg, p.rules = cfg, rules
	p.upd.MaxAttempts = cfg.Settings.MaxAttempts
	p.leaseConfigure(cfg)
	p.checkCapabilities()
	p.host.Log(LogInfo, "tokengate: configured "+strconv.Itoa(len(rules.rules))+" rules in "+
		strconv.Itoa(len(cfg.Policies))+" policies")
	return true
}

// NewStream returns the state of one HTTP request (an HTTP context).
//
// Streams released with Stream.Release are reused, their request state
// (Stream.st) with its buffers, so that a request allocates none.
func (p *Plugin) NewStream() *Stream {
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free = p.free[:n-1]
		s.id = 0
		return s
	}
	return &Stream{p: p}
}

// maxFreeStreams bounds the released streams a plugin keeps.
const maxFreeStreams = 64

// Release hands s back to its plugin for reuse once the host has deleted the
// HTTP context (proxy_on_delete); s must not be used afterwards.
func (s *Stream) Release() {
	p := s.p
	if p != nil {
		s.end()              // a host that skipped proxy_on_done
		p.buf.nowSet = false // as recoverTo does for the other callbacks
	}
	if p == nil || len(p.free) >= maxFreeStreams {
		return
	}
	s.id = 0
	s.st.clear()
	p.free = append(p.free, s)
}

// SetID records the host's context id of the stream, so that a paused
// request can be resumed from the root context.
func (s *Stream) SetID(id uint32) { s.id = id }

// Stream is one HTTP request going through the filter: the host's id of
// its context, and its state (reqState, pipeline.go), the one value every
// stage and every continuation of the request reads and writes.
type Stream struct {
	p  *Plugin
	id uint32 // the host's context id, see SetID
	st reqState
}

// quotaOf is what the RateLimit headers say about r's bucket after a
// decision res; the rest is in the rule's plan.
func quotaOf(r *rule, res bucket.Result) ratelimitheader.Quota {
	return ratelimitheader.Quota{
		Plan:      &r.plan,
		Remaining: max(0, int64(math.Floor(res.Tokens))), // 0 while in debt
		Reset:     ratelimitheader.Seconds(res.FullIn),
	}
}

// time returns the current callback's time, reading the clock once. Not
// inlined: it is called from a dozen places, and each inlined copy costs
// the module bytes.
//
//go:noinline
func (p *Plugin) time() float64 {
	if !p.buf.nowSet {
		p.buf.now, p.buf.nowSet = p.Clock(), true
	}
	return p.buf.now
}

// refreshSeed brings p.seed in step with the slot seed in shared data, at
// most once a second (sharedstate.SeedKeeper): every worker must use the
// same seed, and a worker that failed to read it, or a seed key the host
// evicted, must not leave workers disagreeing.
func (p *Plugin) refreshSeed() {
	seed, err := p.seeds.Seed(p.store, p.time(), rand.Uint64)
	p.seed = seed
	if err != nil {
		p.metrics.seedErrors.inc(p.host, 1)
		p.warnf(p.time(), "event=seed_error reason="+strconv.Quote(err.Error()))
	}
}

// localState is called once if the host turns out to have no shared data.
func (p *Plugin) localState() {
	p.metrics.localState.inc(p.host, 1)
	p.host.Log(LogWarn, "tokengate: the host does not implement shared data (e.g. APISIX): "+
		"buckets are kept in this worker's VM, so each worker enforces the full limit")
}

// warnf logs a request-path warning, at most warnLimit lines a second; the
// next line that gets through says how many were suppressed.
func (p *Plugin) warnf(now float64, msg string) {
	var res bucket.Result
	p.warn, res = warnLimit.Take(p.warn, now, 1)
	if !res.Allowed {
		p.suppressed++
		return
	}
	if p.suppressed > 0 {
		msg += " suppressed=" + strconv.Itoa(p.suppressed)
		p.suppressed = 0
	}
	p.host.Log(LogWarn, "tokengate: "+msg)
}

// OnResponseHeaders is proxy_on_response_headers: it adds the RateLimit
// headers of an allowed, enforced request (see setRateLimitHeaders).
func (s *Stream) OnResponseHeaders(numHeaders int, endOfStream bool) (act Action) {
	defer s.p.recoverTo("proxy_on_response_headers", func() { act = Continue })
	p := s.p
	s.settleHeaders(endOfStream)
	if p.cfg != nil && p.cfg.Settings.RateLimitHeaders {
		for _, h := range s.st.rlsHeaders {
			p.host.SetResponseHeader(lite.ToLowerASCII(h[0]), h[1])
		}
	}
	if len(s.st.quotas) == 0 || p.cfg == nil || !p.cfg.Settings.RateLimitHeaders {
		return Continue
	}
	p.buf.hdrBuf = p.setRateLimitHeaders(p.buf.hdrBuf[:0], s.st.quotas, s.st.best)
	return Continue
}

// recoverTo turns a panic in a callback into a critical log, a count, and
// the fail-open answer set by fail; nil for a callback that answers
// nothing (a func literal that does nothing would cost the module a
// function).
//
// It is also the one hook that sets the callback clock: every callback the
// host calls into (the On* methods, Release) defers it, and it forgets the
// callback's time as the callback ends, so that the next callback reads the
// clock afresh, once, on its first use (time).
func (p *Plugin) recoverTo(callback string, fail func()) {
	p.buf.nowSet = false
	v := recover()
	if v == nil {
		return
	}
	if fail != nil {
		fail()
	}
	msg := "unknown value"
	switch x := v.(type) {
	case string:
		msg = x
	case error:
		msg = x.Error()
	}
	p.metrics.panics.inc(p.host, 1)
	p.host.Log(LogCritical, "tokengate: recovered panic in "+callback+", failing open: "+msg)
}
