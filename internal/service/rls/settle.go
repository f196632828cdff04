package rls

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/rlscontract"
)

// Settling after the response (docs/rls.md): a cluster-scope rule with
// count_statuses, reset_on_statuses or a response_* cost took its
// admission cost here; when the stream ends, the filter sends one more
// ShouldRateLimit with the stream's settlements, and internal/service/redisstore/settle.lua applies
// each to its bucket atomically: an extra charge (which may take the
// bucket into debt, carried in full), a refund (capped at burst), or a
// reset (the key is deleted: a full bucket).

// Settler applies settlements; *redisstore.Store is the Redis one.
type Settler interface {
	Settle(ctx context.Context, ops []redisstore.SettleOp) []redisstore.Outcome
}

// isSettleCall reports whether a call is a settlement: it carries the
// filter's settle header (gRPC metadata), or a descriptor with a
// tokengate_settle entry. It reads the one header, not the whole
// metadata: FromIncomingContext copies every header of every call into a
// new map, 2 % of the service's CPU under load.
func isSettleCall(ctx context.Context, req *rlsv3.RateLimitRequest) bool {
	for _, v := range metadata.ValueFromIncomingContext(ctx, rlscontract.SettleHeader) {
		if v == "1" {
			return true
		}
	}
	for _, d := range req.GetDescriptors() {
		for _, e := range d.GetEntries() {
			if e.GetKey() == rlscontract.SettleKey {
				return true
			}
		}
	}
	return false
}

// settleRule returns the rule and bucket key of one settlement descriptor
// (rlscontract.ParseSettlement), and what to do: a charge of its hits (the
// descriptor's hits_addend, else the request's, at least 1), a refund or a
// reset. The rule must be a cluster-scope rule that settles (exact mode).
func (c *Config) settleRule(domain string, d *ratelimitv3.RateLimitDescriptor, reqHits uint32, now time.Time) (redisstore.SettleOp, *config.Rule, error) {
	es := make([]rlscontract.Entry, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		es[i] = rlscontract.Entry{Key: e.GetKey(), Value: e.GetValue()}
	}
	set, err := rlscontract.ParseSettlement(rlscontract.Descriptor{Entries: es, HitsAddend: d.GetHitsAddend().GetValue()})
	if err != nil {
		return redisstore.SettleOp{}, nil, err
	}
	r := c.clusterRule(domain, set.Rule)
	if r == nil || r.Settle == nil || r.Lease != nil {
		return redisstore.SettleOp{}, nil, fmt.Errorf("no cluster-scope rule %q that settles after the response", set.Rule)
	}
	op := redisstore.SettleOp{Key: redisstore.BucketKey(r.Name, cleanComposite(set.Composite)), Rate: r.Limit.Rate, Burst: r.Limit.Burst, MaxDebt: r.Limit.MaxDebt,
		Kind: set.Kind, Amount: set.Amount}
	if set.Kind == rlscontract.SettleCharge {
		hits := set.Hits
		if hits == 0 {
			hits = uint64(reqHits)
		}
		op.Amount = float64(max(hits, 1))
	}
	if r.Quota != nil {
		// A quota's settlement goes to the consumption of the period
		// holding now (a response that ends after the period's end is
		// charged to the next), never below zero for a refund, and
		// bounded by the stream's receipt of that period (settleReceipt:
		// after a period boundary, none, so nothing is given back).
		var it item
		it.rule, it.op.Cost = r, op.Amount
		c.quotaItem(&it, op.Key, nil, now)
		op.Key, op.Quota = it.op.Key, it.op.Quota
	}
	return op, r, nil
}

// maxChargeBursts bounds a settlement's charge, in bursts of its rule: a
// response costing a hundred times what any admission may take is no
// usage, but a fault or a forgery.
const maxChargeBursts = 100

// boundSettle bounds a settlement's amount by what one request of the
// rule can have taken or owe (docs/rls.md#trust-model): a refund gives
// back at most what its admission took, and an admission never takes more
// than the burst; a charge is carried in full (issue 22: a report above
// the burst is not forgiven; the tests report twenty bursts) up to
// maxChargeBursts bursts, so that a corrupt amount (1e9) from a proxy
// cannot put a key a billion tokens into debt. It reports whether it cut
// the amount.
func boundSettle(op *redisstore.SettleOp) bool {
	bound := op.Burst
	switch op.Kind {
	case rlscontract.SettleReset:
		return false
	case rlscontract.SettleCharge:
		bound = maxChargeBursts * op.Burst
	}
	if op.Amount > bound {
		op.Amount = bound
		return true
	}
	return false
}

// shouldSettle answers a settlement call (isSettleCall); ok is false for
// any other call. Every descriptor must be a settlement of a rule that
// settles (INVALID_ARGUMENT otherwise, and nothing is applied); a Redis
// failure answers UNAVAILABLE. The statuses are OK, with the tokens left.
func (s *Server) shouldSettle(ctx context.Context, req *rlsv3.RateLimitRequest) (resp *rlsv3.RateLimitResponse, ok bool, err error) {
	if !isSettleCall(ctx, req) {
		return nil, false, nil
	}
	if err := s.authorizeWrite(ctx); err != nil {
		return nil, true, err // a write from a caller that is not a proxy (trust.go)
	}
	rid := receiptID(ctx)
	ds := req.GetDescriptors()
	ops := make([]redisstore.SettleOp, len(ds))
	rules := make([]*config.Rule, len(ds))
	clamped := make([]bool, len(ds)) // counted once each
	cfg := s.cfg.Load()
	var seen map[string]struct{} // the buckets named, when too many to compare pairwise
	if len(ds) > 8 {
		seen = make(map[string]struct{}, len(ds))
	}
	for i, d := range ds {
		op, r, err := cfg.settleRule(req.GetDomain(), d, req.GetHitsAddend(), s.clock())
		if err != nil {
			s.metrics.request(reqInvalid)
			return nil, true, status.Error(codes.InvalidArgument, "tokengate-rls: "+err.Error())
		}
		// The filter settles each bucket of a stream once: a bucket named
		// twice would repeat a refund.
		dup := false
		if seen != nil {
			_, dup = seen[op.Key]
			seen[op.Key] = struct{}{}
		} else {
			for j := range i {
				dup = dup || ops[j].Key == op.Key
			}
		}
		if dup {
			s.metrics.request(reqInvalid)
			return nil, true, status.Error(codes.InvalidArgument, "tokengate-rls: a settlement call names a bucket twice")
		}
		if boundSettle(&op) {
			s.metrics.trust.clamped.Inc()
			clamped[i] = true
		}
		settleReceipt(&op, rid)
		ops[i], rules[i] = op, r
	}
	st, ok2 := s.store.(Settler)
	if !ok2 {
		return nil, true, status.Error(codes.Unimplemented, "this store does not settle")
	}
	out := st.Settle(ctx, ops)
	resp = &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for i, o := range out {
		if o.Err != nil {
			s.metrics.request(reqUnavailable)
			return nil, true, status.Error(codes.Unavailable, "tokengate-rls: redis: "+o.Err.Error())
		}
		if q := cfg.quotas[rules[i]]; q != nil && o.Quota != nil {
			// A reported cost crossed thresholds: counted, though the
			// response that could carry the warning is gone.
			for j, pct := range q.percents {
				if o.Quota.Crossed&(1<<j) != 0 {
					s.metrics.quotaCrossed(rules[i], pct)
				}
			}
		}
		if o.Cut && !clamped[i] {
			s.metrics.trust.clamped.Inc() // beyond the stream's receipt (receipt.go)
		}
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:           rlsv3.RateLimitResponse_OK,
			CurrentLimit:   currentLimit(rules[i]),
			LimitRemaining: remaining(o.Tokens),
		})
	}
	s.metrics.request(reqOK)
	return resp, true, nil
}

// remaining is a bucket's whole tokens left as limit_remaining: 0 while
// it is empty or in debt.
func remaining(tokens float64) uint32 {
	if !(tokens > 0) {
		return 0
	}
	return uint32(min(math.Floor(tokens), math.MaxUint32))
}
