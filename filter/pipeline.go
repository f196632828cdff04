package filter

import "github.com/tokengate/tokengate/ratelimitheader"

// The request path: proxy_on_request_headers runs the stages below, in
// order, over one reqState.

// reqState is one request's state, owned by its stream (Stream.st): what
// collect found and what each stage of OnRequestHeaders hands to the next,
// each in a named field, and what the request needs after that callback:
// its continuation while it is paused (cont), the RateLimit headers of its
// response (quotas, rlsHeaders), what it settles when it ends (settle).
// Every stage is passed the state and reads and writes only it (and the
// plugin's shared tables); nothing passes between stages any other way, and
// a continuation (a rate-limit call's answer, a hold's release) finds the
// request's buckets here, not in a copy. The stream and its state are
// reused from one request to the next (Plugin.NewStream, Stream.Release):
// only the buffers' capacity outlives a request, so that a request
// allocates none.
//
// Lifetime: bytes and strings the host returns are valid until the callback
// returns (Host). The keys of the request's buckets are views of keyBuf
// (ViewString), which stays untouched until the stream's next request; the
// host copies what it keeps, as Envoy does.
type reqState struct {
	// req is the request's descriptors, read from the host on demand.
	req request
	// now is the request's time, read once before the first stage.
	now float64

	// The buckets the request takes from, by the stage that decides them:
	// inputs, filled by collect. shadow: the shadow policies' token
	// buckets and windows; inflight: the concurrency rules, enforced and
	// shadow; enforce: the local token buckets and windows; lease: the
	// lease-mode rules; cluster: the exact-mode cluster rules, enforced
	// and shadow.
	shadow, inflight, enforce, lease, cluster group

	// wait, waitRule: output of the local stage. The seconds an admission
	// into a reservation (delay.go) must be held before it goes on, 0 for
	// none, and the index in enforce of the rule whose reservation makes
	// that wait.
	wait     float64
	waitRule int
	// hold: output of the local stage, input of the hold stage. The
	// prepared hold of a request the local buckets admitted into their
	// reservation; nil for none. The lease and cluster stages, which may
	// answer after this callback, hand it to the continuation (cont)
	// while they ask: whoever answers then starts or drops it.
	hold *waiter
	// debits: output of the lease stage. The allowances it debited, given
	// back if a later stage turns the request down (empty: none). Its
	// storage is the request state's, reused from one request to the next.
	debits []leaseDebit
	// exact: output of the lease stage, input of the cluster stage. The
	// lease rules the allowance cannot serve (cold, or their shared data
	// failed) that the cluster stage asks the service about exactly, in
	// the same call as the cluster rules and after them.
	exact group

	// keyBuf holds every key of the request; vals the limit-key values of
	// every applying rule, in order (group.vals locate each rule's);
	// keyed, for a host without views, every bucket collect added, in
	// order, and where its keys are in keyBuf. seeded: collect has brought
	// the slot seed up to date.
	keyBuf []byte
	vals   []string
	keyed  []keyed
	seeded bool

	// denied: output of collect. The first enforced rule with
	// "on_missing_key": "deny" whose limit key the request lacks; nil if
	// none. Such a request is answered before any stage charges a bucket.
	denied *rule

	// What the request needs after the stages, until its stream ends.
	//
	// hasBody: proxy_on_request_headers said a body follows.
	hasBody bool
	// cont is what the request needs to go on once paused (continuation).
	// ended is set once the stream has ended (Stream.end): nothing resumes
	// it after that.
	cont  continuation
	ended bool
	// quotas describe, for the response headers, the bucket of every
	// enforced rule that admitted the request; best indexes the one with
	// the fewest tokens left, which the legacy headers describe.
	quotas []ratelimitheader.Quota
	best   int
	// rlsHeaders are the service's response_headers_to_add for an
	// admitted request.
	rlsHeaders [][2]string
	// settle is what the stream settles and releases when it ends
	// (settle.go); nil for a request that needs nothing of the kind.
	settle *settleState
}

// clear empties the state of a released stream for its next request,
// keeping its buffers' capacity. It resets what begin does not, field by
// field: the state is large, and rebuilding it whole costs a request more
// than the rest of its bookkeeping.
func (st *reqState) clear() {
	st.hasBody, st.ended, st.best = false, false, 0
	st.cont = continuation{}
	st.quotas, st.rlsHeaders, st.settle = st.quotas[:0], nil, nil
	st.hold, st.denied = nil, nil
}

// Idle reports whether the stream's later callbacks have nothing to do but
// add the response headers: its request went on (it is neither paused nor
// ended), it settles nothing after the response and holds no place in
// flight, and the rate-limit service added no response headers. A host
// whose response headers can be set without calling the filter again (the
// dynamic module) may then run OnResponseHeaders at once, keep the headers
// it sets for the response, and end and release the stream (OnDone,
// Release): later callbacks would have done nothing.
func (s *Stream) Idle() bool {
	st := &s.st
	return st.settle == nil && st.cont == (continuation{}) && !st.ended && len(st.rlsHeaders) == 0
}

// begin starts a request's decision, its request read from p's host.
func (st *reqState) begin(p *Plugin) {
	p.initRequest(&st.req)
	st.now, st.wait, st.waitRule, st.hold, st.denied = 0, 0, -1, nil, nil
	st.debits = st.debits[:0]
	st.shadow.reset()
	st.inflight.reset()
	st.enforce.reset()
	st.lease.reset()
	st.cluster.reset()
	st.exact.reset()
	st.keyBuf, st.vals, st.keyed, st.seeded = st.keyBuf[:0], st.vals[:0], st.keyed[:0], false
}

// applies reports whether any bucket applies to the request.
func (st *reqState) applies() bool {
	return len(st.shadow.reqs)+len(st.inflight.reqs)+len(st.enforce.reqs)+len(st.lease.reqs)+len(st.cluster.reqs) > 0
}

// stage is one step of proxy_on_request_headers. run returns Continue to
// go on to the next stage; anything else ends the callback with that
// answer: a local reply was sent (Pause), or the request is paused until an
// answer or a tick resumes it.
type stage struct {
	name string
	run  func(s *Stream, st *reqState) Action
}

// stages are the steps of OnRequestHeaders, in the order they run; each
// does nothing for a request without buckets of its kind. The order is
// load-bearing:
//
//   - shadow first: shadow rules observe every request, whatever the
//     enforced rules then decide.
//   - in-flight before any bucket: a request is counted in flight when its
//     headers arrive and released when its stream ends, whatever decides
//     it (concurrency.go).
//   - local before lease and cluster: a request the local buckets reject
//     never spends an allowance nor reaches the service; one they admit is
//     refunded if a lease or cluster rule rejects it (all-or-nothing).
//   - lease before cluster: the lease rules the allowance cannot serve are
//     asked about in the cluster stage's call (reqState.exact).
//   - hold last: a request admitted into a reservation is held only once
//     every other rule has admitted it too, so that nothing turns away a
//     request that waited (delay.go).
var stages = [...]stage{
	{"shadow", (*Stream).shadowStage},
	{"in-flight", (*Stream).inFlightStage},
	{"local", (*Stream).localStage},
	{"lease", (*Stream).leaseStage},
	{"cluster", (*Stream).clusterStage},
	{"hold", (*Stream).holdStage},
}

// newRequest is a request of this plugin's host and settings, its
// properties read lazily.
func (p *Plugin) newRequest() (r request) {
	p.initRequest(&r)
	return r
}

// initRequest makes r newRequest's request in place, r a zero request or
// one a previous request used: the request is large, and building it aside
// to copy it in costs more than the fields. Natively (fastPaths) it is not
// zeroed whole either: forget resets what the lookups need.
func (p *Plugin) initRequest(r *request) {
	if fastPaths {
		r.forget()
	} else {
		*r = request{}
	}
	set := &p.cfg.Settings
	r.host, r.ps, r.xffHops, r.v6Prefix, r.xffCIDRs = p.host, p.ps, set.XFFTrustedHops, set.IPv6Prefix, set.XFFTrustedCIDRs
	r.jwtMeta = set.JWTPayloadInMetadata
}

// OnRequestHeaders is proxy_on_request_headers: it finds the buckets that
// apply (collect) and runs the stages over them: the request goes on, is
// answered with a local reply, or is paused.
func (s *Stream) OnRequestHeaders(numHeaders int, endOfStream bool) (act Action) {
	p := s.p
	defer p.recoverTo("proxy_on_request_headers", func() { act = Continue })
	cfg := p.cfg
	if cfg == nil {
		return Continue
	}
	st := &s.st
	st.hasBody = !endOfStream
	st.begin(p)
	applies := p.collect(st)
	if st.denied != nil {
		return s.denyMissingKey(&st.req, st.denied)
	}
	if !applies {
		return Continue
	}
	st.now = p.time()
	if fastPaths && st.localOnly() {
		// The common case, without the loop's calls through function
		// values: every stage but local and hold does nothing for it
		// (TestLocalOnlySkipsNoWork).
		if act = s.localStage(st); act != Continue {
			return act
		}
		return s.holdStage(st)
	}
	for i := range stages {
		if act = stages[i].run(s, st); act != Continue {
			return act
		}
	}
	return Continue
}

// localOnly reports whether the request's buckets are all local ones
// (enforce): the shadow, in-flight, lease and cluster stages, which begin
// with a check that their group is not empty, then have nothing to do.
func (st *reqState) localOnly() bool {
	return len(st.shadow.reqs)+len(st.inflight.reqs)+len(st.lease.reqs)+len(st.cluster.reqs)+len(st.exact.reqs) == 0
}

// shadowStage runs the shadow buckets (observe): counted and logged, never
// answering the request; those that took their cost settle as enforced
// ones would.
func (s *Stream) shadowStage(st *reqState) Action {
	if len(st.shadow.reqs) > 0 && s.p.observe(&st.shadow, st.now, s.st.hasBody) {
		s.trackShadow(&st.shadow)
	}
	return Continue
}

// inFlightStage counts the request in flight under its concurrency rules
// (admitInFlight).
func (s *Stream) inFlightStage(st *reqState) Action {
	if len(st.inflight.reqs) == 0 {
		return Continue
	}
	return s.admitInFlight(&st.req, &st.inflight, st.now)
}

// localStage runs the local buckets (decide); it sets st.wait, st.waitRule
// and st.hold for an admission into a reservation.
func (s *Stream) localStage(st *reqState) Action {
	if len(st.enforce.reqs) == 0 {
		return Continue
	}
	return s.decide(st)
}

// leaseStage debits the lease rules' allowances (leaseAdmit); it sets
// st.debits, and st.exact for the rules the cluster stage must ask about.
func (s *Stream) leaseStage(st *reqState) Action {
	if len(st.lease.reqs) == 0 {
		return Continue
	}
	st.cont.await(st.hold) // the request may wait for a lease
	return s.leaseAdmit(st)
}

// clusterStage asks the rate-limit service about the cluster rules and
// st.exact, in one call (askCluster), and pauses the request.
func (s *Stream) clusterStage(st *reqState) Action {
	if len(st.cluster.reqs)+len(st.exact.reqs) == 0 {
		return Continue
	}
	st.cluster.extend(&st.exact)
	st.cont.await(st.hold) // proceed starts it when the service admits the request
	return s.askCluster(st)
}

// holdStage holds a request every rule admitted, if the local stage
// admitted it into a reservation (holdNow).
func (s *Stream) holdStage(st *reqState) Action {
	if st.hold == nil {
		return Continue
	}
	st.cont.await(nil) // back from the lease stage: no one else will start it
	return s.holdNow(st)
}
