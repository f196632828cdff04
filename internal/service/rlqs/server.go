// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas)
// beside tokengate-rls's RLS v3: each Envoy process reporting a bucket gets
// a token-bucket share of the rule's rate and burst, in proportion to its
// reported demand, debited from the rule's bucket in Redis before it is
// granted (redisstore.Store.Share), so that all Envoys together never
// admit more than the rule. docs/rlqs.md describes the mapping, the shares and the
// bound.
package rlqs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/rlscontract"
	"github.com/tokengate/tokengate/sharedstate"
)

// RuleKey is the bucket id entry that names the rule; the other entries,
// in key order, are the bucket's composite key.
const RuleKey = rlscontract.RuleKey

// Sharer runs share batches (one script call each); *redisstore.Store is
// the Redis one.
type Sharer interface {
	Share(ctx context.Context, batches []redisstore.ShareBatch) [][]redisstore.ShareResult
}

// Options tune a Server; the zero value is the defaults.
type Options struct {
	// Now, when set, is the clock, and its time is passed to Redis in
	// place of Redis TIME (tests driving simulated time).
	Now func() time.Time
	// Grace is how long a replaced or released share stays held: the bound
	// on an answer's way to its Envoy (default 1 s).
	Grace time.Duration
	// Domain is the only domain whose buckets get shares (settings.rls.domain,
	// as RLS v3 serves cluster rules); a stream naming another ends with
	// InvalidArgument. Empty: any domain (SetDomain changes it).
	Domain string
	// Metrics, when set, count the streams, reports and actions (else
	// they are counted in series registered nowhere).
	Metrics *Metrics
	// MaxBuckets is the most buckets one stream may report (limit.go;
	// <= 0: DefaultMaxBuckets).
	MaxBuckets int
}

// Server answers StreamRateLimitQuotas. It is safe for concurrent use.
type Server struct {
	rlqsv3.UnimplementedRateLimitQuotaServiceServer
	rules  atomic.Pointer[map[string]*config.Rule]
	domain atomic.Pointer[string]
	store  Sharer
	stop   context.Context
	opt    Options
	queue  shareQueue
	// Reports counts the bucket usages received; Ops the share requests
	// sent to Redis; Errors those that failed.
	Reports, Ops, Errors atomic.Uint64
}

// New returns a server splitting rules among Envoys in store (the
// service's rules: rls.Config.Rules; shadow rules are left out). When
// stop is done every stream expires its Envoy's assignments (TTL 0, as the
// protocol suggests before a restart), releases its shares and ends.
func New(stop context.Context, rules []*config.Rule, store Sharer, opt Options) *Server {
	if opt.Grace <= 0 {
		opt.Grace = time.Second
	}
	if opt.Metrics == nil {
		opt.Metrics = NewMetrics(nil)
	}
	s := &Server{store: store, stop: stop, opt: opt}
	s.queue.s = s
	s.SetRules(rules)
	s.SetDomain(opt.Domain)
	return s
}

// Register registers a new server on gs (the gRPC server of RLS v3), its
// metrics in reg (the RLS metrics' registry; nil: none).
func Register(stop context.Context, gs *grpc.Server, rules []*config.Rule, store Sharer, reg prometheus.Registerer) *Server {
	s := New(stop, rules, store, Options{Metrics: NewMetrics(reg)})
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, s)
	return s
}

// SetRules replaces the rules; streams use them from their next report.
// Quota rules are left out: a share of a refill has no calendar period.
func (s *Server) SetRules(rules []*config.Rule) {
	m := make(map[string]*config.Rule)
	for _, r := range rules {
		if !r.Shadow && r.Quota == nil {
			m[r.Name] = r
		}
	}
	s.rules.Store(&m)
}

// SetDomain sets the domain served (Options.Domain); streams already open
// keep theirs until they end.
func (s *Server) SetDomain(domain string) { s.domain.Store(&domain) }

// FileDomain is the domain whose rules a configuration file serves:
// settings.rls.domain ("tokengate" when not given), or "" (any) without
// settings.rls (the drop-in's: no rule is shared out there).
func FileDomain(f *config.Config) string {
	if f == nil || f.Settings.RLS == nil {
		return ""
	}
	return f.Settings.RLS.Domain
}

func (s *Server) now() time.Time {
	if s.opt.Now != nil {
		return s.opt.Now()
	}
	return time.Now()
}

// Fill interval, pools, TTL and limits of a rule's shares
// (docs/rlqs.md#shares).
const (
	// poolFraction of the rule's rate is shared out; the rest refills
	// the free tokens that new and changed shares start full with.
	poolFraction = 0.95
	// burstFraction of the burst is shared out as max_tokens, in
	// proportion to the shares' rates; the rest stays free for new and
	// changed shares.
	burstFraction = 0.8
	// defaultInterval is Envoy's reporting interval until the reports
	// say otherwise.
	defaultInterval = 5
	// idleHold is how long a bucket reported with no request keeps its
	// (minimum) share before it is abandoned: at least idleReports
	// intervals and idleHold seconds.
	idleHold    = 10
	idleReports = 3
	// turnReports is how many report intervals (and seconds, at least) a
	// share is held before it yields to an Envoy waiting for one when the
	// burst has no room for both.
	turnReports = 7
	// demandReports is how many reports a bucket's demand is the peak of.
	demandReports = 3
	// reportSlack is how many times a report interval's tokens a report
	// may claim (allowed + denied), over the burst, before it is clamped.
	reportSlack = 2
)

// fillInterval is a rule's fill interval: whole seconds, long enough for
// about a thousand units of rate (0.1 % steps, so that a fleet of hundreds
// of Envoys still gets whole units each), at most a minute.
func fillInterval(rate float64) int64 {
	return int64(min(max(math.Ceil(1000/rate), 1), 60))
}

// bucketState is one bucket a stream reports.
type bucketState struct {
	id       *rlqsv3.BucketId
	rule     *config.Rule
	key      string
	reports  int
	interval int64 // the Envoy's reporting interval, whole seconds
	idle     int64 // seconds reported with no request, in a row
	idleN    int   // reports with no request, in a row
	// recent are the demands (requests per second) of the last reports:
	// the share follows their peak, so that an Envoy with less than one
	// request per interval keeps a share its requests fit.
	recent   [demandReports]float64
	assigned bool
	// gauged reports whether the bucket is counted in
	// tokengate_rls_rlqs_buckets_assigned.
	gauged    bool
	abandoned bool
}

// StreamRateLimitQuotas serves one Envoy: every report message is answered
// with one response carrying an action for each bucket it reports.
func (s *Server) StreamRateLimitQuotas(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	var idb [12]byte
	_, _ = rand.Read(idb[:])
	holder := hex.EncodeToString(idb[:])
	ctx := stream.Context()
	msgs := make(chan *rlqsv3.RateLimitQuotaUsageReports)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	buckets := map[string]*bucketState{}
	m := s.opt.Metrics
	m.streams.Inc()
	defer func() {
		m.streams.Dec()
		for _, b := range buckets {
			s.unassign(b)
		}
	}()
	domain := ""
	for {
		select {
		case <-s.stop.Done():
			return s.expireAll(stream, holder, buckets)
		case <-ctx.Done():
			// The Envoy keeps its assignments until their TTL; their
			// shares stay held as long.
			return nil
		case err := <-errc:
			if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case m := <-msgs:
			if domain == "" {
				if m.GetDomain() == "" {
					return status.Error(codes.InvalidArgument, "the first report must name the domain")
				}
				domain = m.GetDomain()
				if want := *s.domain.Load(); want != "" && domain != want {
					s.opt.Metrics.domains.Inc()
					return status.Errorf(codes.InvalidArgument, "domain %q is not served here (settings.rls.domain is %q)", domain, want)
				}
			}
			if err := overBuckets(m, buckets, s.maxBuckets()); err != nil {
				return err
			}
			resp := s.report(holder, m, buckets)
			if len(resp.BucketAction) > 0 {
				if err := stream.Send(resp); err != nil {
					return err
				}
			}
		}
	}
}

// report decides one report message.
func (s *Server) report(holder string, m *rlqsv3.RateLimitQuotaUsageReports, buckets map[string]*bucketState) *rlqsv3.RateLimitQuotaResponse {
	resp := &rlqsv3.RateLimitQuotaResponse{}
	met := s.opt.Metrics
	nowArg := s.nowArg()
	rules := *s.rules.Load()
	var reqs []shareReq
	var opBuckets []*bucketState
	for _, u := range m.GetBucketQuotaUsages() {
		s.Reports.Add(1)
		met.reports.Inc()
		id := u.GetBucketId()
		name, comp := bucketKey(id)
		b := buckets[name+"\x00"+comp]
		if b == nil || b.abandoned {
			if b != nil {
				s.unassign(b) // abandoned, its release failed
			}
			b = &bucketState{id: id, interval: defaultInterval}
			buckets[name+"\x00"+comp] = b
		}
		b.rule = rules[name]
		if b.rule != nil {
			b.key = redisstore.ShareKey(b.rule.Name, comp)
		}
		b.reports++
		elapsed := max(u.GetTimeElapsed().GetSeconds(), 0)
		if b.reports > 1 && elapsed >= 1 {
			b.interval = min(elapsed, 60)
		}
		ttl := float64(2*b.interval + 1)
		if b.rule == nil {
			// No rule: not limited, as RLS leaves an unmatched descriptor,
			// and not kept (limit.go).
			s.unassign(b)
			delete(buckets, name+"\x00"+comp)
			resp.BucketAction = append(resp.BucketAction, blanket(id, typev3.RateLimitStrategy_ALLOW_ALL, int64(ttl)))
			met.assignments[actAllowAll].Inc()
			continue
		}
		lim := b.rule.Limit
		// A report claims at most what its interval can hold: the burst
		// plus reportSlack times the rate over the interval.
		count, allowed, denied := uint64(0), u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
		limit := lim.Burst + reportSlack*lim.Rate*float64(max(elapsed, 1))
		if float64(allowed) > limit || float64(denied) > limit || float64(allowed+denied) > limit {
			count = uint64(limit)
			met.clamped.Inc()
		} else {
			count = allowed + denied
		}
		if b.reports > 1 && count == 0 && elapsed >= 1 {
			b.idle += elapsed
			b.idleN++
		} else if count > 0 {
			b.idle, b.idleN = 0, 0
		}
		copy(b.recent[1:], b.recent[:])
		b.recent[0] = float64(count) / float64(max(elapsed, 1))
		op := redisstore.ShareOp{Holder: holder, Demand: slices.Max(b.recent[:]), TTL: ttl}
		if b.idleN >= idleReports && b.idle >= idleHold {
			// Idle long enough: abandoned, its share released.
			op.Release = true
			b.abandoned = true
		}
		reqs = append(reqs, shareReq{batch: s.batchOf(b.rule, b.key, b.interval, nowArg), op: op})
		opBuckets = append(opBuckets, b)
	}
	if len(reqs) == 0 {
		return resp
	}
	s.Ops.Add(uint64(len(reqs)))
	met.shares.Add(float64(len(reqs)))
	s.queue.run(reqs)
	for i := range reqs {
		r, b, op, ttl := reqs[i].res, opBuckets[i], reqs[i].op, int64(reqs[i].op.TTL)
		switch {
		case r.Err != nil:
			// Nothing new: the Envoy keeps its assignment until its TTL,
			// which its share in Redis outlives.
			s.Errors.Add(1)
			met.errors.Inc()
		case op.Release:
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
			met.abandons.Inc()
			s.unassign(b)
			delete(buckets, bucketMapKey(b.id))
		case r.Units == 0:
			resp.BucketAction = append(resp.BucketAction, blanket(b.id, typev3.RateLimitStrategy_DENY_ALL, ttl))
			met.assignments[actDenyAll].Inc()
			s.assign(b)
		default:
			resp.BucketAction = append(resp.BucketAction, tokenBucket(b.id, r.MaxTokens, r.Units, reqs[i].batch.Fill, ttl))
			met.assignments[actTokenBucket].Inc()
			s.assign(b)
		}
	}
	return resp
}

// assign marks b assigned, counting it in tokengate_rls_rlqs_buckets_assigned
// the first time.
func (s *Server) assign(b *bucketState) {
	b.assigned = true
	if !b.gauged {
		b.gauged = true
		s.opt.Metrics.assigned.Inc()
	}
}

// unassign takes b out of tokengate_rls_rlqs_buckets_assigned if it is in
// (b.assigned stays: expireAll still releases its share).
func (s *Server) unassign(b *bucketState) {
	if b.gauged {
		b.gauged = false
		s.opt.Metrics.assigned.Dec()
	}
}

// expireAll expires every assignment of the stream (TTL 0: the Envoy falls
// back to its expired_assignment_behavior), releases the shares and ends
// the stream.
func (s *Server) expireAll(stream rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasServer, holder string, buckets map[string]*bucketState) error {
	resp := &rlqsv3.RateLimitQuotaResponse{}
	var reqs []shareReq
	nowArg := s.nowArg()
	for _, b := range buckets {
		resp.BucketAction = append(resp.BucketAction, blanket(b.id, typev3.RateLimitStrategy_DENY_ALL, 0))
		s.opt.Metrics.assignments[actExpire].Inc()
		if b.rule != nil && b.assigned {
			reqs = append(reqs, shareReq{batch: s.batchOf(b.rule, b.key, b.interval, nowArg), op: redisstore.ShareOp{Holder: holder, Release: true}})
		}
	}
	var err error
	if len(resp.BucketAction) > 0 {
		err = stream.Send(resp)
	}
	if len(reqs) > 0 {
		s.queue.run(reqs)
	}
	return err
}

func blanket(id *rlqsv3.BucketId, rule typev3.RateLimitStrategy_BlanketRule, ttl int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return assignment(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}, ttl)
}

// tokenBucket is a share's assignment. Its fill_interval is fill seconds
// and fill nanoseconds: Envoy computes the rate from whole seconds but
// compares strategies by max_tokens, tokens_per_fill and the nanoseconds
// of fill_interval only, so a share whose fill interval changed (a reload
// that changed the rule's rate) must differ in the nanoseconds to replace
// the Envoy's bucket.
func tokenBucket(id *rlqsv3.BucketId, maxTokens, units uint64, fill, ttl int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return assignment(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(maxTokens, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(units, math.MaxUint32))),
		FillInterval:  &durationpb.Duration{Seconds: fill, Nanos: int32(fill)},
	}}}, ttl)
}

func assignment(id *rlqsv3.BucketId, st *typev3.RateLimitStrategy, ttl int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: id,
		BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{QuotaAssignmentAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
			AssignmentTimeToLive: &durationpb.Duration{Seconds: ttl},
			RateLimitStrategy:    st,
		}}}
}

func bucketMapKey(id *rlqsv3.BucketId) string {
	name, comp := bucketKey(id)
	return name + "\x00" + comp
}

// bucketKey maps a bucket id to its rule's name (the RuleKey entry) and its
// composite key: the other entries as "key=value", sorted, percent-encoded
// and joined as sharedstate's composite keys are.
func bucketKey(id *rlqsv3.BucketId) (rule, composite string) {
	m := id.GetBucket()
	rule = m[RuleKey]
	vals := make([]string, 0, len(m))
	for k, v := range m {
		if k != RuleKey {
			vals = append(vals, k+"="+v)
		}
	}
	sort.Strings(vals)
	return rule, string(sharedstate.AppendComposite(nil, vals))
}
