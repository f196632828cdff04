package filter

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/tokengate/tokengate/bucket"
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

	cfg     *Config
	metrics pluginMetrics
	upd     sharedstate.Updater
	seed    uint64 // slot seed shared by every worker; see sharedstate.SlotPair

	enforce, shadow group
	keyBuf          []byte
	vals            []string

	// warn limits warn-level lines on the request path so that a store
	// outage cannot flood the proxy's log; see warnf.
	warn       bucket.State
	suppressed int
}

// warnLimit allows 10 warn lines a second per worker, in bursts of 20.
var warnLimit = bucket.Limit{Rate: 10, Burst: 20}

// group is the set of buckets one request takes from in one mode.
type group struct {
	rules []*Rule
	reqs  []sharedstate.Request
	res   []bucket.Result
}

func (g *group) reset() {
	g.rules, g.reqs = g.rules[:0], g.reqs[:0]
}

// NewPlugin returns an unconfigured plugin talking to h.
func NewPlugin(h Host) *Plugin {
	p := &Plugin{host: h, Clock: wallClock}
	p.upd.Store = h
	// Workers that collide on a key must not retry in lockstep; seed each
	// plugin instance (one per worker VM) differently.
	p.upd.Backoff = sharedstate.SpinBackoff(uint64(time.Now().UnixNano()))
	p.metrics = pluginMetrics{
		panics:         define(h, MetricPanics),
		configRejected: define(h, MetricConfigRejected),
		corrupt:        define(h, MetricCorruptState),
		seedErrors:     define(h, MetricSeedErrors),
	}
	return p
}

func wallClock() float64 {
	return float64(time.Now().UnixNano()) / 1e9
}

// Config returns the configuration in force, or nil before the first
// successful OnConfigure.
func (p *Plugin) Config() *Config { return p.cfg }

// OnVMStart is proxy_on_vm_start. The VM configuration is not used.
func (p *Plugin) OnVMStart(vmConfig []byte) bool { return true }

// OnConfigure is proxy_on_configure: it parses data and, if it is valid,
// puts it in force. An invalid configuration is logged at error level with
// the field's path, counted, and refused (false); the previous
// configuration, if any, stays in force.
func (p *Plugin) OnConfigure(data []byte) (ok bool) {
	defer p.recoverTo("proxy_on_configure", func() { ok = false })
	cfg, err := ParseConfig(data)
	if err != nil {
		p.metrics.configRejected.inc(p.host, 1)
		p.host.Log(LogError, "tokengate: invalid configuration: "+err.Error())
		return false
	}
	for _, r := range cfg.rules {
		r.defineMetrics(p.host)
	}
	seed, err := sharedstate.LoadSeed(p.host, rand.Uint64())
	if err != nil {
		// Every worker falls back to the same seed, so they still agree on
		// slots; only the seed's secrecy is lost.
		p.metrics.seedErrors.inc(p.host, 1)
		p.host.Log(LogWarn, "tokengate: cannot load the slot seed, using 0: "+err.Error())
	}
	p.seed = seed
	p.cfg = cfg
	p.upd.MaxAttempts = cfg.Settings.MaxAttempts
	p.host.Log(LogInfo, "tokengate: configured "+strconv.Itoa(len(cfg.rules))+" rules in "+
		strconv.Itoa(len(cfg.Policies))+" policies")
	return true
}

// NewStream returns the state of one HTTP request (an HTTP context).
func (p *Plugin) NewStream() *Stream { return &Stream{p: p} }

// Stream is one HTTP request going through the filter.
type Stream struct {
	p      *Plugin
	hdr    quota // headers to add to the response
	hasHdr bool
}

// quota is what the RateLimit headers say about one bucket.
type quota struct {
	rule      string
	limit     int64 // whole tokens the bucket holds when full
	remaining int64 // whole tokens left
	reset     int64 // seconds until full
	window    int64 // seconds to refill from empty
}

func quotaOf(r *Rule, tokens float64) quota {
	return quota{
		rule:      r.Name,
		limit:     int64(r.Limit.Burst),
		remaining: int64(math.Floor(tokens)),
		reset:     int64(math.Ceil(r.Limit.ResetAfter(tokens))),
		window:    int64(math.Ceil(r.Limit.FillTime())),
	}
}

// OnRequestHeaders is proxy_on_request_headers: it takes tokens from every
// bucket that applies and either lets the request through or sends a 429.
func (s *Stream) OnRequestHeaders(numHeaders int, endOfStream bool) (act Action) {
	p := s.p
	defer p.recoverTo("proxy_on_request_headers", func() { act = Continue })
	cfg := p.cfg
	if cfg == nil {
		return Continue
	}
	req := request{host: p.host, xffHops: cfg.Settings.XFFTrustedHops}
	p.collect(cfg, &req)
	if len(p.shadow.reqs) == 0 && len(p.enforce.reqs) == 0 {
		return Continue
	}
	now := p.Clock()
	if len(p.shadow.reqs) > 0 {
		p.observe(&req, now)
	}
	if len(p.enforce.reqs) == 0 {
		return Continue
	}
	return s.decide(&req, now)
}

// collect fills p.enforce and p.shadow with the buckets the request takes
// from: in every policy whose selector matches, every rule whose match
// holds and whose limit keys are all present; the policy's fallback limit
// when none is.
func (p *Plugin) collect(cfg *Config, req *request) {
	p.enforce.reset()
	p.shadow.reset()
	for _, pol := range cfg.Policies {
		if !pol.Selector.matches(req) {
			continue
		}
		applied := false
		for _, r := range pol.Rules {
			if r.matches(req) && p.add(r, req) {
				applied = true
			}
		}
		if !applied && pol.Fallback != nil {
			p.add(pol.Fallback, req)
		}
	}
}

func (r *Rule) matches(req *request) bool {
	for _, m := range r.Match {
		if v, ok := req.value(m.Descriptor); !ok || v != m.Value {
			return false
		}
	}
	return true
}

// add appends r's bucket for this request to its group and reports whether
// it did; a rule with an absent limit key is skipped and counted.
func (p *Plugin) add(r *Rule, req *request) bool {
	p.vals = p.vals[:0]
	for _, d := range r.Keys {
		v, ok := req.value(d)
		if !ok {
			r.metrics.descriptorMissing.inc(p.host, 1)
			return false
		}
		p.vals = append(p.vals, v)
	}
	g := &p.enforce
	if r.shadow {
		g = &p.shadow
	}
	sr := sharedstate.Request{Limit: r.Limit, Cost: r.Cost.cost(req)}
	if r.MaxKeys > 0 {
		p.keyBuf = sharedstate.AppendComposite(p.keyBuf[:0], p.vals)
		sr.Slotted, sr.Owner = true, string(p.keyBuf)
		a, b := sharedstate.SlotPair(p.seed, sr.Owner, uint32(r.MaxKeys))
		sr.Key = string(sharedstate.AppendSlotKey(p.keyBuf[:0], r.shadow, r.Name, a))
		if r.MaxKeys > 1 {
			sr.Alt = string(sharedstate.AppendSlotKey(p.keyBuf[:0], r.shadow, r.Name, b))
		}
	} else {
		p.keyBuf = sharedstate.AppendKey(p.keyBuf[:0], r.shadow, r.Name, p.vals)
		sr.Key = string(p.keyBuf)
	}
	g.rules = append(g.rules, r)
	g.reqs = append(g.reqs, sr)
	return true
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

// failures logs one line per rule of a group whose update failed.
func (p *Plugin) failures(g *group, now float64, event string, err error) {
	for i, r := range g.rules {
		p.warnf(now, "event="+event+" rule="+r.Name+" key=#"+reqHash(&g.reqs[i])+" reason="+strconv.Quote(err.Error()))
	}
}

func (p *Plugin) take(g *group, now float64) sharedstate.Outcome {
	if cap(g.res) < len(g.reqs) {
		g.res = make([]bucket.Result, len(g.reqs))
	}
	g.res = g.res[:len(g.reqs)]
	out := p.upd.TakeAll(g.reqs, now, g.res)
	p.metrics.corrupt.inc(p.host, int64(out.Corrupt))
	if out.Corrupt > 0 {
		p.warnf(now, "event=corrupt_state rules="+ruleNames(g.rules)+" count="+strconv.Itoa(out.Corrupt)+" action=replaced_with_full_bucket")
	}
	for i, r := range g.rules {
		r.metrics.casRetries.inc(p.host, int64(out.CASRetries))
		if i < 64 && out.TakeoverMask&(1<<i) != 0 {
			r.metrics.slotTakeovers.inc(p.host, 1)
		}
		if i < 64 && out.CollidedMask&(1<<i) != 0 {
			r.metrics.slotCollisions.inc(p.host, 1)
		}
	}
	return out
}

// observe runs the shadow buckets: what enforcing them would have done is
// counted and logged, and the request is never touched.
func (p *Plugin) observe(req *request, now float64) {
	g := &p.shadow
	out := p.take(g, now)
	switch {
	case out.Err != nil:
		for _, r := range g.rules {
			r.metrics.failOpen.inc(p.host, 1)
		}
		p.failures(g, now, "shadow_fail_open", out.Err)
	case out.Allowed:
		for _, r := range g.rules {
			r.metrics.allowed.inc(p.host, 1)
		}
	default:
		i := worst(g.res)
		for j, r := range g.rules {
			if !g.res[j].Allowed {
				r.metrics.shadowRejected.inc(p.host, 1)
			}
		}
		p.host.Log(LogDebug, "tokengate: event=shadow_rejected "+describe(g, i, 0))
	}
}

// decide runs the enforce buckets and answers the request.
func (s *Stream) decide(req *request, now float64) Action {
	p := s.p
	g := &p.enforce
	out := p.take(g, now)
	switch {
	case out.Err != nil:
		deny := false
		for _, r := range g.rules {
			deny = deny || r.DenyOnStoreError
		}
		for _, r := range g.rules {
			if deny {
				r.metrics.storeDenied.inc(p.host, 1)
			} else {
				r.metrics.failOpen.inc(p.host, 1)
			}
		}
		if !deny {
			p.failures(g, now, "fail_open", out.Err)
			return Continue
		}
		p.failures(g, now, "store_denied", out.Err)
		s.sendStoreDenied(req, g.rules[0])
		return Pause
	case out.Allowed:
		best := 0
		for i, r := range g.rules {
			r.metrics.allowed.inc(p.host, 1)
			if g.res[i].Tokens < g.res[best].Tokens {
				best = i
			}
		}
		s.hdr, s.hasHdr = quotaOf(g.rules[best], g.res[best].Tokens), true
		return Continue
	}
	i := worst(g.res)
	for j, r := range g.rules {
		if !g.res[j].Allowed {
			r.metrics.rejected.inc(p.host, 1)
		}
	}
	retry := int64(0)
	if reasonOf(g.res[i]) == ReasonExceeded {
		retry = RetryAfter(g.res[i].RetryAfter, req.identity())
	}
	p.host.Log(LogDebug, "tokengate: event=rejected "+describe(g, i, retry))
	s.sendRejection(req, g.rules[i], g.res[i], retry)
	return Pause
}

// worst returns the index of the rejecting bucket with the longest wait.
func worst(res []bucket.Result) int {
	w := -1
	for i := range res {
		if !res[i].Allowed && (w < 0 || res[i].RetryAfter > res[w].RetryAfter) {
			w = i
		}
	}
	if w < 0 {
		return 0
	}
	return w
}

// describe is the log text for a rejection: rule, a hash of the key (never
// the raw API key or token), tokens, cost, Retry-After (0: none) and reason.
func describe(g *group, i int, retry int64) string {
	return "rule=" + g.rules[i].Name + " key=#" + reqHash(&g.reqs[i]) +
		" tokens=" + strconv.FormatFloat(g.res[i].Tokens, 'f', 3, 64) +
		" cost=" + num(g.reqs[i].Cost) + " retry_after=" + strconv.FormatInt(retry, 10) +
		" reason=" + reasonOf(g.res[i])
}

// reqHash identifies a bucket's identity in logs without revealing it.
func reqHash(r *sharedstate.Request) string {
	if r.Slotted {
		return keyHash(r.Owner)
	}
	return keyHash(r.Key)
}

func ruleNames(rules []*Rule) string {
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.Name
	}
	return strings.Join(names, ",")
}

// keyHash is a short, stable FNV-1a hash of a shared-data key for logs.
func keyHash(key string) string {
	h := fnv64(key)
	return strconv.FormatUint(h>>32, 16)
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// OnResponseHeaders is proxy_on_response_headers: it adds the RateLimit
// headers of an allowed, enforced request.
func (s *Stream) OnResponseHeaders(numHeaders int, endOfStream bool) (act Action) {
	defer s.p.recoverTo("proxy_on_response_headers", func() { act = Continue })
	if !s.hasHdr {
		return Continue
	}
	h := s.p.host
	q := &s.hdr
	h.SetResponseHeader("ratelimit-limit", strconv.FormatInt(q.limit, 10))
	h.SetResponseHeader("ratelimit-remaining", strconv.FormatInt(q.remaining, 10))
	h.SetResponseHeader("ratelimit-reset", strconv.FormatInt(q.reset, 10))
	h.SetResponseHeader("ratelimit", q.rateLimit())
	h.SetResponseHeader("ratelimit-policy", q.policy())
	return Continue
}

// rateLimit is the RateLimit header: "<rule>";r=<remaining>;t=<reset>.
func (q *quota) rateLimit() string {
	return strconv.Quote(q.rule) + ";r=" + strconv.FormatInt(q.remaining, 10) + ";t=" + strconv.FormatInt(q.reset, 10)
}

// policy is the RateLimit-Policy header: "<rule>";q=<burst>;w=<window>.
func (q *quota) policy() string {
	return strconv.Quote(q.rule) + ";q=" + strconv.FormatInt(q.limit, 10) + ";w=" + strconv.FormatInt(q.window, 10)
}

// recoverTo turns a panic in a callback into a critical log, a count, and
// the fail-open answer set by fail.
func (p *Plugin) recoverTo(callback string, fail func()) {
	v := recover()
	if v == nil {
		return
	}
	fail()
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
