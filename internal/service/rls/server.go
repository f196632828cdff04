package rls

import (
	"context"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/ratelimitheader"
	"github.com/tokengate/tokengate/rlscontract"
)

// Runner runs bucket updates; *redisstore.Store is the Redis one.
type Runner interface {
	Run(ctx context.Context, ops []redisstore.Op) []redisstore.Outcome
}

// Server answers ShouldRateLimit. It is safe for concurrent use.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg     atomic.Pointer[Config]
	store   Runner
	metrics *Metrics
	// auth says who may write (trust.go); nil refuses every write.
	auth atomic.Pointer[WriteAuth]
	// lim bounds each call and admit the calls in flight (limits.go).
	lim   Limits
	admit admission
	// now is the clock quota periods are computed for (time.Now unless
	// SetClock).
	now atomic.Pointer[func() time.Time]
}

// SetClock replaces the clock the quota rules' periods are computed for
// (tests); nil restores time.Now. Redis TIME still times token buckets.
func (s *Server) SetClock(now func() time.Time) {
	if now == nil {
		s.now.Store(nil)
		return
	}
	s.now.Store(&now)
}

// clock returns the time quota periods are computed for.
func (s *Server) clock() time.Time {
	if f := s.now.Load(); f != nil {
		return (*f)()
	}
	return time.Now()
}

// NewServer returns a server deciding cfg's rules in store, counting into
// m (which must have been made for cfg).
func NewServer(cfg *Config, store Runner, m *Metrics) *Server {
	s := &Server{store: store, metrics: m, lim: DefaultLimits()}
	s.cfg.Store(cfg)
	return s
}

// SetLimits replaces the limits of each call and of the calls in flight
// (DefaultLimits until then; fields <= 0 take their default). Call it
// before serving.
func (s *Server) SetLimits(l Limits) { s.lim = l.WithDefaults() }

// SetConfig makes c the configuration of the calls that start from now
// on; calls in flight finish with the one they started with. Buckets are
// Redis keys named by rule and descriptor, so a rule that keeps its name
// keeps its buckets' state.
func (s *Server) SetConfig(c *Config) {
	s.metrics.SetRules(c)
	s.cfg.Store(c)
}

// Config returns the configuration in use.
func (s *Server) Config() *Config { return s.cfg.Load() }

// item is one limited descriptor of a request.
type item struct {
	idx  int // descriptor index
	rule *config.Rule
	op   redisstore.Op
	out  redisstore.Outcome
	// retry is the seconds until the request could pass (rejected) and
	// full the seconds until the bucket is full (after the decision).
	retry, full float64
	// quota is a quota rule's period and limit source (quota.go); nil
	// for a token bucket.
	quota *quotaState
}

// ShouldRateLimit decides every descriptor of the request. The descriptors
// limited by enforced rules are all or nothing: if one is over its limit,
// what the others took is given back, and the request takes nothing.
// Shadow rules are decided the same way among themselves, their statuses
// say OVER_LIMIT, and they never change overall_code. A Redis failure on an
// enforced descriptor answers UNAVAILABLE (Envoy treats UNKNOWN as OK).
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		s.metrics.request(reqInvalid)
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		s.metrics.request(reqInvalid)
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	// Bounded before any Redis work: a call past a limit fails alone,
	// and the calls in flight together hold at most lim.InFlight
	// descriptors (docs/rls.md#limits).
	if err := s.lim.check(req); err != nil {
		s.metrics.request(reqInvalid)
		return nil, err
	}
	n := int64(len(req.Descriptors))
	if !s.admit.acquire(n, int64(s.lim.InFlight)) {
		s.metrics.request(reqExhausted)
		return nil, errInFlight(s.lim.InFlight)
	}
	defer s.admit.release(n)
	cfg := s.cfg.Load() // one configuration for the whole call
	return cfg.kind.decide(ctx, s, req)
}

// shouldTokengate answers a call to a tokengate configuration: a lease
// call or a settlement when the filter's contract says it is one, else
// the decision of every descriptor.
func (s *Server) shouldTokengate(ctx context.Context, cfg *Config, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if resp, ok, err := s.shouldLease(ctx, req); ok {
		return resp, err // a lease request or release (lease.go)
	}
	if resp, ok, err := s.shouldSettle(ctx, req); ok {
		return resp, err // settlements after the response (settle.go)
	}
	// Room for the common requests (the filter sends one descriptor per
	// cluster rule) without allocating.
	var itemBuf [2]item
	var entryBuf [4]Entry
	items := s.resolve(cfg, req, itemBuf[:0], entryBuf[:0])
	addReceipts(ctx, items)
	resp, parts := newResponse(len(req.Descriptors))
	if len(items) == 0 {
		s.metrics.request(reqOK)
		return resp, nil
	}

	var opBuf [2]redisstore.Op
	ops := opBuf[:0]
	for i := range items {
		ops = append(ops, items[i].op)
	}
	for i, o := range s.store.Run(ctx, ops) {
		items[i].out = o
	}
	enforceErr, enforceOver := s.refund(ctx, items)

	if enforceErr != nil {
		for i := range items {
			if items[i].out.Err != nil {
				s.metrics.decision(items[i].rule, codeError, items[i].op.Cost)
			}
		}
		s.metrics.request(reqUnavailable)
		return nil, status.Error(codes.Unavailable, "tokengate-rls: redis: "+enforceErr.Error())
	}
	quotas := s.statuses(cfg, items, resp, parts)
	if enforceOver {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		s.metrics.request(reqOver)
	} else {
		s.metrics.request(reqOK)
	}
	if len(quotas) > 0 {
		// Envoy's own ratelimit filter adds these headers to its 429 and
		// writes no Retry-After of its own: on OVER_LIMIT, the wait until
		// the rejecting bucket with the longest wait could admit the
		// request, in whole seconds, at least 1 (our filter replaces it
		// with its jittered one).
		best := bestQuota(quotas, enforceOver)
		resp.ResponseHeadersToAdd = cfg.responseHeaders(quotas, best, cfg.File.Settings.RateLimitHeaders, enforceOver)
	}
	if !enforceOver {
		resp.ResponseHeadersToAdd = s.quotaWarnings(items, resp.ResponseHeadersToAdd)
	}
	return resp, nil
}

// resolve appends to items the bucket update of every descriptor of req
// that names a rule (entries is scratch); the others are counted as
// unmatched and left OK.
func (s *Server) resolve(cfg *Config, req *rlsv3.RateLimitRequest, items []item, entries []Entry) []item {
	for i, d := range req.Descriptors {
		entries = entries[:0]
		for _, e := range d.GetEntries() {
			entries = append(entries, Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		r, key := cfg.Resolve(req.Domain, entries)
		lease := false
		if l, ok, err := rlscontract.ParseLease(rlscontract.Descriptor{Entries: entries, HitsAddend: d.GetHitsAddend().GetValue()}); ok && err == nil {
			// An exact take from a lease-mode bucket (lease.go); a rule
			// this service has in exact mode is still limited, in its
			// token bucket.
			r, key, lease = cfg.leaseTake(req.Domain, l)
		}
		if ov := d.GetLimit(); ov != nil && !lease {
			// Envoy's override of the limit (RateLimitDescriptor.limit):
			// N per unit instead of the rule's, in a domain this
			// configuration has, as envoyproxy/ratelimit applies it.
			r, key = cfg.overrideRule(req.Domain, r, key, entries, ov.GetRequestsPerUnit(), Unit(ov.GetUnit()))
		}
		if r == nil {
			s.metrics.unmatched.Add(1)
			continue
		}
		cost := uint64(req.GetHitsAddend())
		if h := d.GetHitsAddend().GetValue(); h > 0 {
			cost = h
		}
		if cost == 0 {
			cost = 1
		}
		op := redisstore.Op{Key: key, Rate: r.Limit.Rate, Burst: r.Limit.Burst, Cost: float64(cost), MaxDebt: r.Limit.MaxDebt, LimitArgs: cfg.limitArgs[r]}
		if lease {
			op.Lease, op.TTL, op.LeaseShare = true, r.Lease.TTL, r.Lease.Max
		} else if cfg.cluster[r.Name] == r {
			// A cluster rule's key may have an override (admin API),
			// read in the same call.
			op.Override = true
		}
		items = append(items, item{idx: i, rule: r, op: op})
		if r.Quota != nil && !lease {
			cfg.quotaItem(&items[len(items)-1], key, entries, s.clock())
		}
	}
	return items
}

// statuses fills the status of every decided descriptor from its
// bucket's outcome, counts the decisions, and returns what the RateLimit
// headers say of the enforced rules' buckets.
func (s *Server) statuses(cfg *Config, items []item, resp *rlsv3.RateLimitResponse, parts []statusParts) []quota {
	var quotas []quota
	for i := range items {
		it := &items[i]
		st := resp.Statuses[it.idx]
		if it.out.Err != nil { // a shadow rule's failure: not limited
			s.metrics.decision(it.rule, codeError, it.op.Cost)
			continue
		}
		if it.quota != nil && it.out.Quota != nil {
			if q, ok := s.quotaStatus(cfg, it, st, &parts[it.idx]); ok {
				quotas = append(quotas, q)
			}
			continue
		}
		l := it.rule.Limit
		p := &parts[it.idx]
		p.limit = currentLimitOf(it.rule)
		st.CurrentLimit = &p.limit
		st.LimitRemaining = remaining(it.out.Tokens)
		if it.out.Allowed {
			it.full = l.ResetAfter(it.out.Tokens)
			setDuration(&p.untilReset, it.full)
		} else {
			_, res := l.Take(bucket.State{Tokens: it.out.Tokens, Last: 1}, 1, it.op.Cost)
			it.retry, it.full = res.RetryAfter, l.ResetAfter(it.out.Tokens)
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if math.IsInf(it.retry, 1) {
				// A cost above the burst never passes: the status says
				// when the bucket is full, as for an admitted request.
				setDuration(&p.untilReset, it.full)
			} else {
				setDuration(&p.untilReset, it.retry)
			}
		}
		st.DurationUntilReset = &p.untilReset
		switch {
		case it.rule.Shadow && !it.out.Allowed:
			s.metrics.decision(it.rule, codeShadowOver, it.op.Cost)
		case !it.out.Allowed && !it.rule.Shadow:
			s.metrics.decision(it.rule, codeOver, it.op.Cost)
		default:
			s.metrics.decision(it.rule, codeOK, it.op.Cost)
		}
		if it.rule.Shadow {
			continue
		}
		q := quota{rule: it.rule, remaining: int64(st.LimitRemaining), reset: ratelimitheader.Seconds(it.full),
			allowed: it.out.Allowed, retry: it.retry, tokens: it.out.Tokens}
		if !it.out.Allowed && !math.IsInf(it.retry, 1) {
			q.reset = ratelimitheader.Seconds(it.retry)
		}
		quotas = append(quotas, q)
	}
	return quotas
}

// bestQuota returns the index of the bucket the legacy headers describe:
// the one with the fewest tokens left or, on a rejection (over), the
// rejecting bucket with the longest wait.
func bestQuota(quotas []quota, over bool) int {
	best := 0
	for i, q := range quotas {
		b := quotas[best]
		if over && !q.allowed && (b.allowed || q.retry > b.retry) ||
			!over && q.tokens < b.tokens {
			best = i
		}
	}
	return best
}

// refund makes each group (enforced rules, shadow rules) all or nothing:
// when one of its descriptors is over the limit or failed, what the
// others took is refunded (one more pipelined round trip). It returns the
// enforced group's first error and whether it is over the limit.
func (s *Server) refund(ctx context.Context, items []item) (error, bool) {
	var enforceErr error
	var enforceOver, shadowFail bool
	for i := range items {
		it := &items[i]
		fail := it.out.Err != nil || !it.out.Allowed
		if it.rule.Shadow {
			shadowFail = shadowFail || fail
			continue
		}
		if it.out.Err != nil && enforceErr == nil {
			enforceErr = it.out.Err
		}
		enforceOver = enforceOver || (it.out.Err == nil && !it.out.Allowed)
	}
	var refund []int
	for i := range items {
		it := &items[i]
		groupFailed := shadowFail
		if !it.rule.Shadow {
			groupFailed = enforceErr != nil || enforceOver
		}
		if groupFailed && it.out.Err == nil && it.out.Allowed {
			refund = append(refund, i)
		}
	}
	if len(refund) > 0 {
		ops := make([]redisstore.Op, len(refund))
		for j, i := range refund {
			ops[j] = items[i].op
			ops[j].Cost = -ops[j].Cost
			if q := ops[j].Quota; q != nil && items[i].out.Quota != nil {
				// Given back: the thresholds its take crossed were not.
				c := *q
				c.Forget = items[i].out.Quota.Crossed
				ops[j].Quota = &c
			}
		}
		for j, o := range s.store.Run(context.WithoutCancel(ctx), ops) {
			if o.Err != nil {
				// Tokens stay taken for a request that was not admitted:
				// strict, never permissive.
				s.metrics.refundErrors.Add(1)
				continue
			}
			items[refund[j]].out.Tokens = o.Tokens
			if o.Quota != nil {
				items[refund[j]].out.Quota = o.Quota
			}
		}
	}
	return enforceErr, enforceOver
}

// currentLimitOf states a rule's rate as Envoy's RateLimit: whole
// requests per the shortest unit that holds at least one.
func currentLimitOf(r *config.Rule) rlsv3.RateLimitResponse_RateLimit {
	if r.Quota != nil {
		// A quota: its limit per its period (the answer to a decision
		// states the limit that applied, quotaStatus).
		return rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: uint32(min(math.Floor(r.Quota.Limit), math.MaxUint32)),
			Unit: periodUnits[r.Quota.Period]}
	}
	rate := r.Limit.Rate
	u := limitUnits[len(limitUnits)-1]
	for _, c := range limitUnits {
		if rate*c.secs >= 1 {
			u = c
			break
		}
	}
	return rlsv3.RateLimitResponse_RateLimit{
		Name:            r.Name,
		RequestsPerUnit: uint32(min(math.Floor(rate*u.secs), math.MaxUint32)),
		Unit:            u.unit,
	}
}

var limitUnits = [...]struct {
	secs float64
	unit rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{1, rlsv3.RateLimitResponse_RateLimit_SECOND},
	{60, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{3600, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{86400, rlsv3.RateLimitResponse_RateLimit_DAY},
}

// currentLimit is currentLimitOf in a message of its own.
func currentLimit(r *config.Rule) *rlsv3.RateLimitResponse_RateLimit {
	l := new(rlsv3.RateLimitResponse_RateLimit)
	*l = currentLimitOf(r)
	return l
}

// statusParts are the messages of one descriptor's status, allocated
// together (newResponse).
type statusParts struct {
	status     rlsv3.RateLimitResponse_DescriptorStatus
	limit      rlsv3.RateLimitResponse_RateLimit
	untilReset durationpb.Duration
}

// newResponse returns an OK response with n OK statuses, and the messages
// the statuses may point to: three allocations, whatever n.
func newResponse(n int) (*rlsv3.RateLimitResponse, []statusParts) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	parts := make([]statusParts, n)
	resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range parts {
		parts[i].status.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &parts[i].status
	}
	return resp, parts
}

func duration(secs float64) *durationpb.Duration {
	d := new(durationpb.Duration)
	setDuration(d, secs)
	return d
}

// setDuration sets d to secs rounded up to the nanosecond, within [0,
// ratelimitheader.MaxSeconds] (durationpb.New's fields).
func setDuration(d *durationpb.Duration, secs float64) {
	var ns time.Duration
	switch {
	case !(secs > 0):
	case secs >= ratelimitheader.MaxSeconds:
		ns = ratelimitheader.MaxSeconds * time.Second
	default:
		ns = time.Duration(math.Ceil(secs * 1e9))
	}
	d.Seconds, d.Nanos = int64(ns/time.Second), int32(ns%time.Second)
}

// retryAfterSeconds is a wait as Retry-After's whole seconds: as the
// RateLimit headers round it (ratelimitheader.Seconds), and at least 1;
// +Inf (a cost the bucket can never hold) is the cap.
func retryAfterSeconds(secs float64) int64 {
	if math.IsInf(secs, 1) {
		return ratelimitheader.MaxSeconds
	}
	return max(ratelimitheader.Seconds(secs), 1)
}

// quota is what the RateLimit headers say about one enforced bucket.
type quota struct {
	rule *config.Rule
	// plan, when set, replaces the rule's plan: a quota's under a limit
	// that is not the rule's (an override, an identity's).
	plan             *ratelimitheader.Plan
	remaining, reset int64
	allowed          bool
	retry, tokens    float64
}

// responseHeaders are the response_headers_to_add: with rateLimit the
// RateLimit headers the filter sends for the same buckets (package
// ratelimitheader, docs/headers.md), one list member per enforced rule in
// descriptor order and the legacy three describing best; with over,
// retry-after. The header messages and their values come in a few
// allocations.
func (c *Config) responseHeaders(quotas []quota, best int, rateLimit, over bool) []*corev3.HeaderValue {
	n := 0
	if rateLimit {
		n = 5
	}
	// No Retry-After for a cost above the burst: waiting never lets it
	// pass (the filter answers it 413, cost_exceeds_burst, without one).
	retry := over && !math.IsInf(quotas[best].retry, 1)
	if retry {
		n++
	}
	if n == 0 {
		return nil
	}
	// The messages and the slice of pointers to them: one allocation.
	all := new(struct {
		hs   [6]corev3.HeaderValue
		ptrs [6]*corev3.HeaderValue
	})
	hs, ptrs := all.hs[:n], all.ptrs[:n]
	for i := range hs {
		ptrs[i] = &hs[i]
	}
	b := quotas[best]
	if rateLimit {
		// The values that are not constant, written into one buffer (on
		// the stack unless there are many rules) and made one string.
		var qroom [4]ratelimitheader.Quota
		hq := qroom[:0]
		for _, q := range quotas {
			plan := q.plan
			if plan == nil {
				plan = c.planOf(q.rule)
			}
			hq = append(hq, ratelimitheader.Quota{Plan: plan, Remaining: q.remaining, Reset: q.reset})
		}
		var room [256]byte
		buf, f := ratelimitheader.AppendFields(room[:0], hq, best)
		vals := string(buf)
		hs[0].Key, hs[0].Value = "ratelimit-limit", hq[best].Plan.Limit
		hs[1].Key, hs[1].Value = "ratelimit-remaining", vals[f.Remaining[0]:f.Remaining[1]]
		hs[2].Key, hs[2].Value = "ratelimit-reset", vals[f.Reset[0]:f.Reset[1]]
		hs[3].Key, hs[3].Value = "ratelimit", vals[f.List[0]:f.List[1]]
		hs[4].Key, hs[4].Value = "ratelimit-policy", vals[f.Policy[0]:f.Policy[1]]
	}
	if retry {
		hs[n-1].Key, hs[n-1].Value = "retry-after", strconv.FormatInt(retryAfterSeconds(b.retry), 10)
	}
	return ptrs
}
