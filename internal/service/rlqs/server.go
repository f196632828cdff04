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
	"sort"
	"strconv"
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

// Sharer runs share requests; *redisstore.Store is the Redis one.
type Sharer interface {
	Share(ctx context.Context, ops []redisstore.ShareOp) []redisstore.ShareResult
}

// Options tune a Server; the zero value is the defaults.
type Options struct {
	// Now, when set, is the clock, and its time is passed to Redis in
	// place of Redis TIME (tests driving simulated time).
	Now func() time.Time
	// Grace is how long a replaced or released share stays held: the bound
	// on an answer's way to its Envoy (default 1 s).
	Grace time.Duration
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
	rules atomic.Pointer[map[string]*config.Rule]
	store Sharer
	stop  context.Context
	opt   Options
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
	s.SetRules(rules)
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
func (s *Server) SetRules(rules []*config.Rule) {
	m := make(map[string]*config.Rule)
	for _, r := range rules {
		if !r.Shadow {
			m[r.Name] = r
		}
	}
	s.rules.Store(&m)
}

func (s *Server) now() time.Time {
	if s.opt.Now != nil {
		return s.opt.Now()
	}
	return time.Now()
}

// Fill interval, pools and TTL of a rule's shares (docs/rlqs.md#shares).
const (
	// poolFraction of the rule's rate is shared out; the rest refills
	// the free tokens that new and changed shares start full with.
	poolFraction = 0.9
	// burstFraction of the burst is shared out as max_tokens; the rest
	// stays free for them.
	burstFraction = 0.5
	// defaultInterval is Envoy's reporting interval until the reports
	// say otherwise.
	defaultInterval = 5
)

// fillInterval is a rule's fill interval: whole seconds, long enough for
// about a hundred units of rate (1 % steps), at most a minute.
func fillInterval(rate float64) int64 {
	return int64(min(max(math.Ceil(100/rate), 1), 60))
}

// bucketState is one bucket a stream reports.
type bucketState struct {
	id       *rlqsv3.BucketId
	rule     *config.Rule
	key      string
	reports  int
	interval int64 // the Envoy's reporting interval, whole seconds
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
			}
			if err := overBuckets(m, buckets, s.maxBuckets()); err != nil {
				return err
			}
			resp := s.report(ctx, holder, m, buckets)
			if len(resp.BucketAction) > 0 {
				if err := stream.Send(resp); err != nil {
					return err
				}
			}
		}
	}
}

// report decides one report message.
func (s *Server) report(ctx context.Context, holder string, m *rlqsv3.RateLimitQuotaUsageReports, buckets map[string]*bucketState) *rlqsv3.RateLimitQuotaResponse {
	resp := &rlqsv3.RateLimitQuotaResponse{}
	met := s.opt.Metrics
	now := s.now()
	nowArg := ""
	if s.opt.Now != nil {
		nowArg = strconv.FormatFloat(float64(now.UnixMicro())/1e6, 'f', 6, 64)
	}
	rules := *s.rules.Load()
	var ops []redisstore.ShareOp
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
		elapsed := u.GetTimeElapsed().GetSeconds()
		if b.reports > 1 && elapsed >= 1 {
			b.interval = min(elapsed, 60)
		}
		ttl := float64(2*b.interval + 1)
		count := u.GetNumRequestsAllowed() + u.GetNumRequestsDenied()
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
		fill := fillInterval(lim.Rate)
		op := redisstore.ShareOp{Key: b.key, Rate: lim.Rate, Burst: lim.Burst, Fill: fill,
			Pool:      uint64(math.Floor(poolFraction * lim.Rate * float64(fill))),
			BurstPool: uint64(max(math.Floor(burstFraction*lim.Burst), 1)),
			Holder:    holder, Demand: float64(count) / float64(max(elapsed, 1)),
			TTL: ttl, Grace: s.opt.Grace.Seconds(), Now: nowArg}
		if b.reports > 1 && count == 0 && elapsed >= 1 {
			// Idle for a whole interval: abandoned, its share released.
			op.Release = true
			b.abandoned = true
		}
		ops = append(ops, op)
		opBuckets = append(opBuckets, b)
	}
	if len(ops) == 0 {
		return resp
	}
	s.Ops.Add(uint64(len(ops)))
	met.shares.Add(float64(len(ops)))
	for i, r := range s.store.Share(ctx, ops) {
		b := opBuckets[i]
		switch {
		case r.Err != nil:
			// Nothing new: the Envoy keeps its assignment until its TTL,
			// which its share in Redis outlives.
			s.Errors.Add(1)
			met.errors.Inc()
		case ops[i].Release:
			resp.BucketAction = append(resp.BucketAction, &rlqsv3.RateLimitQuotaResponse_BucketAction{BucketId: b.id,
				BucketAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqsv3.RateLimitQuotaResponse_BucketAction_AbandonAction{}}})
			met.abandons.Inc()
			s.unassign(b)
			delete(buckets, bucketMapKey(b.id))
		case r.Units == 0:
			resp.BucketAction = append(resp.BucketAction, blanket(b.id, typev3.RateLimitStrategy_DENY_ALL, int64(ops[i].TTL)))
			met.assignments[actDenyAll].Inc()
			s.assign(b)
		default:
			resp.BucketAction = append(resp.BucketAction, tokenBucket(b.id, r.MaxTokens, r.Units, ops[i].Fill, int64(ops[i].TTL)))
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
	var ops []redisstore.ShareOp
	now := s.now()
	nowArg := ""
	if s.opt.Now != nil {
		nowArg = strconv.FormatFloat(float64(now.UnixMicro())/1e6, 'f', 6, 64)
	}
	for _, b := range buckets {
		resp.BucketAction = append(resp.BucketAction, blanket(b.id, typev3.RateLimitStrategy_DENY_ALL, 0))
		s.opt.Metrics.assignments[actExpire].Inc()
		if b.rule != nil && b.assigned {
			ops = append(ops, redisstore.ShareOp{Key: b.key, Rate: b.rule.Limit.Rate, Burst: b.rule.Limit.Burst, Fill: fillInterval(b.rule.Limit.Rate),
				Holder: holder, Release: true, Grace: s.opt.Grace.Seconds(), Now: nowArg})
		}
	}
	var err error
	if len(resp.BucketAction) > 0 {
		err = stream.Send(resp)
	}
	if len(ops) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		s.store.Share(ctx, ops)
	}
	return err
}

func blanket(id *rlqsv3.BucketId, rule typev3.RateLimitStrategy_BlanketRule, ttl int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return assignment(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}, ttl)
}

func tokenBucket(id *rlqsv3.BucketId, maxTokens, units uint64, fill, ttl int64) *rlqsv3.RateLimitQuotaResponse_BucketAction {
	return assignment(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(min(maxTokens, math.MaxUint32)),
		TokensPerFill: wrapperspb.UInt32(uint32(min(units, math.MaxUint32))),
		FillInterval:  durationpb.New(time.Duration(fill) * time.Second),
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
