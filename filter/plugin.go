package filter

import (
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
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

	// rc is the state of the callback being run; see reqContext.
	rc reqContext

	// Optional host methods that save a copy; nil when the host lacks them.
	hbs headerBytesSetter
	ps  propertyStringer
	bv  bytesViewer
	bl  bytesLogger
	// free holds released streams for NewStream to reuse.
	free []*Stream
	// calls are the requests paused for the rate-limit service (cluster.go);
	// a slice, not a map: few are pending at once, and a map type costs the
	// module tens of kilobytes.
	calls []*pendingCall
	// lease is the lease-mode state of this worker (lease.go).
	lease leaseState
	// settleCalls are the tokens of the settlement calls in flight
	// (cluster_settle.go).
	settleCalls []uint32
	// delays are the requests held for their reservation (delay.go);
	// noTicks is set once the host refuses a tick period.
	delays  delayQueue
	noTicks bool

	// warn limits warn-level lines on the request path so that a store
	// outage cannot flood the proxy's log; see warnf.
	warn       bucket.State
	suppressed int
}

// warnLimit allows 10 warn lines a second per worker, in bursts of 20.
var warnLimit = bucket.Limit{Rate: 10, Burst: 20}

// reqContext is what the plugin keeps for the callback it is running: the
// request's time, the buckets it takes from, and scratch buffers for keys,
// header values, replies and log lines. A VM runs one callback at a time, so
// one reqContext per plugin serves every stream; begin resets it when a
// request's decision starts. Only the buffers' capacity outlives a request.
//
// Lifetime: bytes and strings the host returns are valid until the callback
// returns (Host). The filter hands the host views of keyBuf, hdrBuf and
// replyBuf (ViewString); it leaves them untouched until the next request,
// and the host copies what it keeps, as Envoy does.
type reqContext struct {
	// now is the time of the request being decided, read once (see time).
	now    float64
	nowSet bool

	enforce, shadow group
	// cluster holds the cluster-scope rules, enforced and shadow, that the
	// rate-limit service decides (cluster.go).
	cluster group
	// lease holds the lease-mode rules (lease.go); a cold one moves to
	// cluster for an exact call.
	lease group
	// inflight holds the concurrency rules, enforced and shadow
	// (concurrency.go).
	inflight group
	keyBuf   []byte
	// vals holds the limit-key values of every applying rule, in order;
	// group.vals locate each rule's.
	vals []string

	// hdrBuf holds the RateLimit value formatted per request; the
	// RateLimit-Remaining and -Reset values are slices of it.
	hdrBuf []byte
	// Scratch for local replies and log lines (reply.go, logDescribe).
	replyBuf, bodyBuf, logBuf []byte
	replyHdrs                 [][2]string
	// quotas is the rejection's scratch for the RateLimit list.
	quotas []ratelimitheader.Quota
	// wait is the seconds an admission by take must be held (delay.go),
	// waitRule the index of the rule whose reservation makes it.
	wait     float64
	waitRule int
}

// begin starts a request's decision.
func (c *reqContext) begin() {
	c.nowSet = false
	c.enforce.reset()
	c.shadow.reset()
	c.cluster.reset()
	c.lease.reset()
	c.inflight.reset()
	c.keyBuf = c.keyBuf[:0]
	c.vals = c.vals[:0]
}

// group is the set of buckets one request takes from in one mode.
type group struct {
	rules []*rule
	reqs  []sharedstate.Request
	res   []bucket.Result
	// vals locate each bucket's limit-key values in reqContext.vals.
	vals [][2]int
	// spans locate each request's Key, Alt and Owner in Plugin.keyBuf
	// until collect turns the buffer into one string.
	spans []keySpans
}

// keySpans are [start, end) offsets in Plugin.keyBuf.
type keySpans struct {
	key, alt, owner [2]int
}

func (g *group) reset() {
	g.rules, g.reqs, g.spans, g.vals = g.rules[:0], g.reqs[:0], g.spans[:0], g.vals[:0]
}

// view returns b as a string: a view of b's bytes where the host offers one
// (b must then stay untouched while the string is in use), otherwise a copy.
func (p *Plugin) view(b []byte) string {
	if p.bv != nil {
		return p.bv.ViewString(b)
	}
	return string(b)
}

// setKeys points every request's Key, Alt and Owner into keys, the string
// of Plugin.keyBuf.
func (g *group) setKeys(keys string) {
	for i := range g.reqs {
		sp, r := &g.spans[i], &g.reqs[i]
		r.Key = keys[sp.key[0]:sp.key[1]]
		r.Alt = keys[sp.alt[0]:sp.alt[1]]
		r.Owner = keys[sp.owner[0]:sp.owner[1]]
	}
}

// NewPlugin returns an unconfigured plugin talking to h.
func NewPlugin(h Host) *Plugin {
	p := &Plugin{host: h, Clock: wallClock}
	p.store = &sharedstate.LocalFallback{Host: h, OnFallback: p.localState}
	p.upd.Store = p.store
	p.hbs, _ = h.(headerBytesSetter)
	p.ps, _ = h.(propertyStringer)
	p.bl, _ = h.(bytesLogger)
	p.bv, _ = h.(bytesViewer)
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
	p.rc.nowSet = false
	p.refreshSeed()
	p.cfg, p.rules = cfg, rules
	p.upd.MaxAttempts = cfg.Settings.MaxAttempts
	p.leaseConfigure(cfg)
	p.host.Log(LogInfo, "tokengate: configured "+strconv.Itoa(len(rules.rules))+" rules in "+
		strconv.Itoa(len(cfg.Policies))+" policies")
	return true
}

// NewStream returns the state of one HTTP request (an HTTP context).
//
// Streams released with Stream.Release are reused, so that a request
// allocates none.
func (p *Plugin) NewStream() *Stream {
	if n := len(p.free); n > 0 {
		s := p.free[n-1]
		p.free = p.free[:n-1]
		*s = Stream{p: p, quotas: s.quotas[:0]}
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
		s.abandon() // a host that skipped proxy_on_done
		s.cancelWait()
		s.finish()
	}
	if p == nil || len(p.free) >= maxFreeStreams {
		return
	}
	*s = Stream{p: p, quotas: s.quotas[:0]}
	p.free = append(p.free, s)
}

// SetID records the host's context id of the stream, so that a paused
// request can be resumed from the root context.
func (s *Stream) SetID(id uint32) { s.id = id }

// Stream is one HTTP request going through the filter.
type Stream struct {
	p  *Plugin
	id uint32 // the host's context id, see SetID
	// call is the token of the rate-limit call the request waits for, 0
	// for none; rlsHeaders are the service's response_headers_to_add for
	// an admitted request.
	call       uint32
	rlsHeaders [][2]string
	// waiter is the request's place in the plugin's timer heap while it
	// is held for its reservation (delay.go); pending is its hold while
	// the rate-limit service or a lease decides its other rules, before
	// it starts. ended is set once the stream has ended (proxy_on_done):
	// nothing resumes it after that.
	waiter  *waiter
	pending *waiter
	ended   bool
	// quotas describe, for the response headers, the bucket of every
	// enforced rule that admitted the request; best indexes the one with
	// the fewest tokens left, which the legacy headers describe.
	quotas []ratelimitheader.Quota
	best   int
	// settle is what the stream settles and releases when it ends
	// (settle.go); nil for a request that needs nothing of the kind.
	settle *settleState
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

// OnRequestHeaders is proxy_on_request_headers: it takes tokens from every
// bucket that applies and either lets the request through or sends a 429.
func (s *Stream) OnRequestHeaders(numHeaders int, endOfStream bool) (act Action) {
	p := s.p
	defer p.recoverTo("proxy_on_request_headers", func() { act = Continue })
	cfg := p.cfg
	if cfg == nil {
		return Continue
	}
	req := request{host: p.host, ps: p.ps, xffHops: cfg.Settings.XFFTrustedHops, xffCIDRs: cfg.Settings.XFFTrustedCIDRs,
		jwtMeta: cfg.Settings.JWTPayloadInMetadata}
	p.rc.begin()
	p.collect(&req)
	if len(p.rc.shadow.reqs) == 0 && len(p.rc.enforce.reqs) == 0 && len(p.rc.cluster.reqs) == 0 && len(p.rc.lease.reqs) == 0 && len(p.rc.inflight.reqs) == 0 {
		return Continue
	}
	now := p.time()
	if len(p.rc.shadow.reqs) > 0 && p.observe(&req, now) {
		s.trackShadow()
	}
	if len(p.rc.inflight.reqs) > 0 {
		// Counted first, released when the stream ends whatever decides.
		if act = s.admitInFlight(&req, now); act != Continue {
			return act
		}
	}
	if len(p.rc.enforce.reqs) > 0 {
		if act = s.decide(&req, now); act != Continue {
			return act
		}
	}
	// Local rules first: a request they reject never reaches the service;
	// one they admit is refunded if a lease or cluster rule rejects it.
	// One they admit into a reservation is held only once those admit it
	// too (s.pending; delay.go).
	if len(p.rc.lease.reqs) > 0 {
		if act = s.leaseAdmit(&req, now); act != Continue {
			return act
		}
	}
	if len(p.rc.cluster.reqs) > 0 {
		if act = s.askCluster(&req, now); act != Continue {
			return act
		}
	}
	if s.pending != nil {
		return s.holdNow(&req, now)
	}
	return Continue
}

// time returns the current request's time, reading the clock once.
func (p *Plugin) time() float64 {
	if !p.rc.nowSet {
		p.rc.now, p.rc.nowSet = p.Clock(), true
	}
	return p.rc.now
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

// collect fills p.rc.enforce and p.rc.shadow with the buckets the request
// takes from: in every policy whose selector matches, every rule whose match
// holds and whose limit keys are all present; the policy's fallback limit
// when none is. It finds the rules first and builds their keys after, so
// that the slot seed is refreshed once, before any slot is chosen, and only
// for a request that has a slotted rule.
func (p *Plugin) collect(req *request) {
	slotted := false
	for i := range p.rules.policies {
		pol := &p.rules.policies[i]
		if !selectorMatches(&pol.Selector, req) {
			continue
		}
		applied := false
		for _, r := range pol.rules {
			if r.matches(req) && p.add(r, req) {
				applied = true
				slotted = slotted || r.MaxKeys > 0
			}
		}
		if !applied && pol.fallback != nil && p.add(pol.fallback, req) {
			slotted = slotted || pol.fallback.MaxKeys > 0
		}
	}
	if len(p.rc.enforce.reqs)+len(p.rc.shadow.reqs)+len(p.rc.cluster.reqs)+len(p.rc.lease.reqs)+len(p.rc.inflight.reqs) == 0 {
		return
	}
	if slotted {
		if seed, ok := p.seeds.Current(p.time()); ok {
			p.seed = seed // refreshSeed's common case, without its calls
		} else {
			p.refreshSeed()
		}
	}
	// Most groups are empty, and a call costs the wasm guest.
	rc := &p.rc
	if len(rc.enforce.rules) > 0 {
		p.buildKeys(&rc.enforce)
	}
	if len(rc.shadow.rules) > 0 {
		p.buildKeys(&rc.shadow)
	}
	if len(rc.cluster.rules) > 0 {
		p.buildKeys(&rc.cluster)
	}
	if len(rc.lease.rules) > 0 {
		p.buildKeys(&rc.lease)
	}
	if len(rc.inflight.rules) > 0 {
		p.buildKeys(&rc.inflight)
	}
	// One string holds every key of the request: keyBuf stays untouched
	// until the next request.
	keys := p.view(rc.keyBuf)
	rc.enforce.setKeys(keys)
	rc.shadow.setKeys(keys)
	rc.cluster.setKeys(keys)
	rc.lease.setKeys(keys)
	rc.inflight.setKeys(keys)
}

func (r *rule) matches(req *request) bool {
	for _, m := range r.Match {
		if v, ok := req.value(m.Descriptor); !ok || v != m.Value {
			return false
		}
	}
	return true
}

// add appends r's bucket for this request to its group, with its limit-key
// values, and reports whether it did; a rule with an absent limit key is
// skipped and counted. buildKeys makes the keys later.
func (p *Plugin) add(r *rule, req *request) bool {
	start := len(p.rc.vals)
	for _, d := range r.Keys {
		v, ok := req.value(d)
		if !ok {
			p.rc.vals = p.rc.vals[:start]
			r.metrics.descriptorMissing.inc(p.host, 1)
			return false
		}
		p.rc.vals = append(p.rc.vals, v)
	}
	g := &p.rc.enforce
	switch {
	case r.Lease != nil:
		g = &p.rc.lease
	case r.InFlight != nil:
		g = &p.rc.inflight
	case r.Cluster:
		g = &p.rc.cluster
	case r.Shadow:
		g = &p.rc.shadow
	}
	g.rules = append(g.rules, r)
	g.reqs = append(g.reqs, sharedstate.Request{Limit: r.Limit, Cost: costOf(&r.Cost, req), Slotted: r.MaxKeys > 0 && r.Lease == nil})
	if r.WindowStart != config.WindowAligned {
		g.reqs[len(g.reqs)-1].Limit.Offset = r.windowOffset(p.rc.vals[start:])
	}
	g.vals = append(g.vals, [2]int{start, len(p.rc.vals)})
	return true
}

// buildKeys appends the keys of g's buckets to keyBuf and records where
// they are; the slot seed must be fresh.
func (p *Plugin) buildKeys(g *group) {
	for i, r := range g.rules {
		vals := p.rc.vals[g.vals[i][0]:g.vals[i][1]]
		var sp keySpans
		if r.Lease != nil {
			// The allowance key, the key of the bucket on_error: local
			// falls back to, and the composite key for the service.
			sp.key[0] = len(p.rc.keyBuf)
			p.rc.keyBuf = sharedstate.AppendLeaseKey(p.rc.keyBuf, r.Name, vals)
			sp.key[1] = len(p.rc.keyBuf)
			sp.alt[0] = len(p.rc.keyBuf)
			p.rc.keyBuf = sharedstate.AppendKey(p.rc.keyBuf, false, r.Name, vals)
			sp.alt[1] = len(p.rc.keyBuf)
			sp.owner[0] = len(p.rc.keyBuf)
			p.rc.keyBuf = sharedstate.AppendComposite(p.rc.keyBuf, vals)
			sp.owner[1] = len(p.rc.keyBuf)
		} else if r.MaxKeys > 0 {
			sp.owner[0] = len(p.rc.keyBuf)
			p.rc.keyBuf = sharedstate.AppendComposite(p.rc.keyBuf, vals)
			sp.owner[1] = len(p.rc.keyBuf)
			a, b := sharedstate.SlotPairBytes(p.seed, p.rc.keyBuf[sp.owner[0]:], uint32(r.MaxKeys))
			sp.key[0] = len(p.rc.keyBuf)
			p.rc.keyBuf = sharedstate.AppendSlotKey(p.rc.keyBuf, r.Shadow, r.Name, a)
			sp.key[1] = len(p.rc.keyBuf)
			if r.MaxKeys > 1 {
				sp.alt[0] = len(p.rc.keyBuf)
				p.rc.keyBuf = sharedstate.AppendSlotKey(p.rc.keyBuf, r.Shadow, r.Name, b)
				sp.alt[1] = len(p.rc.keyBuf)
			}
		} else {
			sp.key[0] = len(p.rc.keyBuf)
			p.rc.keyBuf = sharedstate.AppendKey(p.rc.keyBuf, r.Shadow, r.Name, vals)
			sp.key[1] = len(p.rc.keyBuf)
		}
		if r.InFlight != nil {
			markInFlight(p.rc.keyBuf[sp.key[0]:sp.key[1]], r.Shadow)
			markInFlight(p.rc.keyBuf[sp.alt[0]:sp.alt[1]], r.Shadow)
		}
		g.spans = append(g.spans, sp)
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
	p.rc.wait, p.rc.waitRule = reservationWait(g)
	p.metrics.corrupt.inc(p.host, int64(out.Corrupt))
	if out.Corrupt > 0 {
		p.warnf(now, "event=corrupt_state rules="+ruleNames(g.rules)+" count="+strconv.Itoa(out.Corrupt)+" action=replaced_with_full_bucket")
	}
	for i, r := range g.rules {
		r.metrics.casRetries.inc(p.host, int64(out.CASRetries))
		if g.reqs[i].TookOver {
			r.metrics.slotTakeovers.inc(p.host, 1)
		}
		if g.reqs[i].Collided {
			r.metrics.slotCollisions.inc(p.host, 1)
		}
	}
	return out
}

// observe runs the shadow buckets: what enforcing them would have done is
// counted and logged, and the request is never touched. It reports whether
// the shadow buckets took their cost (they would have admitted it).
func (p *Plugin) observe(req *request, now float64) bool {
	g := &p.rc.shadow
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
		return true
	default:
		i := worst(g.res)
		for j, r := range g.rules {
			if !g.res[j].Allowed {
				r.metrics.shadowRejected.inc(p.host, 1)
			}
		}
		p.logDescribe("tokengate: event=shadow_rejected ", g, i, 0)
	}
	return false
}

// decide runs the enforce buckets and answers the request.
func (s *Stream) decide(req *request, now float64) Action {
	p := s.p
	g := &p.rc.enforce
	out := p.take(g, now)
	switch {
	case out.Err != nil:
		return s.undecided(req, g, now, out.Err)
	case out.Allowed:
		wait := p.rc.wait
		held := false
		if wait > 0 {
			if over := s.unholdable(g, p.rc.waitRule); over >= 0 {
				return s.refuseHold(req, g, now, wait, over)
			}
			s.prepareHold(g, now, wait, p.rc.waitRule)
			if len(p.rc.lease.reqs) == 0 && len(p.rc.cluster.reqs) == 0 {
				// Nothing else to ask: held now.
				if !s.startHold(now) {
					return s.refuseHold(req, g, now, wait, p.rc.waitRule)
				}
				held = true
			}
		}
		s.quotas, s.best = s.quotas[:0], 0
		settles := false
		for i, r := range g.rules {
			r.metrics.allowed.inc(p.host, 1)
			s.quotas = append(s.quotas, quotaOf(r, g.res[i]))
			if g.res[i].Tokens < g.res[s.best].Tokens {
				s.best = i
			}
			settles = settles || r.Settle != nil
		}
		if settles {
			s.track(g)
		}
		if held {
			return Pause // OnTick releases it (delay.go)
		}
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
		retry = retryAfterHash(g.res[i].RetryAfter, req.identityHash())
	}
	p.logDescribe("tokengate: event=rejected ", g, i, retry)
	s.sendRejection(req, g, i, retry)
	return Pause
}

// undecided answers a request whose buckets could not be updated: the
// shared data failed, or (ErrContention) every compare-and-swap attempt
// lost its race. It fails open unless a rule says "on_store_error":
// "deny"; then the 503 names and counts the first such rule.
func (s *Stream) undecided(req *request, g *group, now float64, err error) Action {
	p := s.p
	contention := errors.Is(err, sharedstate.ErrContention)
	denier := -1
	for i, r := range g.rules {
		if contention {
			r.metrics.contention.inc(p.host, 1)
		}
		if r.DenyOnStoreError && denier < 0 {
			denier = i
		}
	}
	if denier < 0 {
		for _, r := range g.rules {
			r.metrics.failOpen.inc(p.host, 1)
		}
		p.failures(g, now, "fail_open", err)
		return Continue
	}
	g.rules[denier].metrics.storeDenied.inc(p.host, 1)
	p.failures(g, now, "store_denied", err)
	reason := ReasonStoreError
	if contention {
		reason = ReasonContention
	}
	s.sendStoreDenied(req, g.rules[denier], reason)
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

// appendDescribe appends the log text of a rejection to dst: rule, a hash
// of the key (never the raw API key or token), tokens, cost, Retry-After (0:
// none) and reason.
func appendDescribe(dst []byte, g *group, i int, retry int64) []byte {
	dst = append(dst, "rule="...)
	dst = append(dst, g.rules[i].Name...)
	dst = append(dst, " key=#"...)
	dst = appendReqHash(dst, &g.reqs[i])
	dst = append(dst, " tokens="...)
	dst = strconv.AppendFloat(dst, g.res[i].Tokens, 'f', 3, 64)
	dst = append(dst, " cost="...)
	dst = strconv.AppendFloat(dst, g.reqs[i].Cost, 'g', -1, 64)
	dst = append(dst, " retry_after="...)
	dst = strconv.AppendInt(dst, retry, 10)
	dst = append(dst, " reason="...)
	return append(dst, reasonOf(g.res[i])...)
}

// logDescribe logs prefix and appendDescribe's text at debug level, without
// building a string when the host takes bytes. Envoy drops debug lines at
// its default level, so this must cost next to nothing.
func (p *Plugin) logDescribe(prefix string, g *group, i int, retry int64) {
	b := appendDescribe(append(p.rc.logBuf[:0], prefix...), g, i, retry)
	p.rc.logBuf = b
	if p.bl != nil {
		p.bl.LogBytes(LogDebug, b)
		return
	}
	p.host.Log(LogDebug, string(b))
}

// reqHash identifies a bucket's identity in logs without revealing it.
func reqHash(r *sharedstate.Request) string { return string(appendReqHash(nil, r)) }

// appendReqHash appends reqHash(r) to dst: the top 32 bits of the FNV-1a
// hash of the owner (slotted rules) or the key, in hex.
func appendReqHash(dst []byte, r *sharedstate.Request) []byte {
	k := r.Key
	if r.Slotted {
		k = r.Owner
	}
	return strconv.AppendUint(dst, fnv64(k)>>32, 16)
}

func ruleNames(rules []*rule) string {
	names := make([]string, len(rules))
	for i, r := range rules {
		names[i] = r.Name
	}
	return strings.Join(names, ",")
}

func fnv64(s string) uint64 {
	return fnv64Add(fnvOffset, s)
}

// fnvOffset is FNV-1a's initial value.
const fnvOffset = 14695981039346656037

// fnv64Add continues an FNV-1a hash h over s: fnv64(a+b) is
// fnv64Add(fnv64(a), b).
func fnv64Add(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// OnResponseHeaders is proxy_on_response_headers: it adds the RateLimit
// headers of an allowed, enforced request (see appendHeaders).
func (s *Stream) OnResponseHeaders(numHeaders int, endOfStream bool) (act Action) {
	defer s.p.recoverTo("proxy_on_response_headers", func() { act = Continue })
	p := s.p
	s.settleHeaders(endOfStream)
	if p.cfg != nil && p.cfg.Settings.RateLimitHeaders {
		for _, h := range s.rlsHeaders {
			p.host.SetResponseHeader(strings.ToLower(h[0]), h[1])
		}
	}
	if len(s.quotas) == 0 || p.cfg == nil || !p.cfg.Settings.RateLimitHeaders {
		return Continue
	}
	p.rc.hdrBuf = p.setRateLimitHeaders(p.rc.hdrBuf[:0], s.quotas, s.best)
	return Continue
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

// windowOffset is where a fixed window's windows start for the key with
// these limit-key values, in seconds after multiples of the window: chosen
// by the key's hash (the same on every worker and after a restart), or at
// random (used only when the key's state is created; the stored window
// start keeps it from then on, for every worker).
func (r *rule) windowOffset(vals []string) float64 {
	w := r.Limit.Window
	if r.WindowStart == config.WindowRandom {
		return rand.Float64() * w
	}
	h := fnv64(r.Name)
	for _, v := range vals {
		h = fnv64Add(fnv64Add(h, "\x00"), v)
	}
	const us = 1e6 // microsecond steps, as stored
	steps := uint64(w * us)
	if steps == 0 { // the parser refuses windows under 1 ms; never divide by 0
		return 0
	}
	return float64(h%steps) / us
}
