package rls

import (
	"context"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/service/redisstore"
)

// dropinItem is one limited descriptor of a drop-in request.
type dropinItem struct {
	idx   int
	limit *dlimit
	op    redisstore.Op
	out   redisstore.Outcome
	// redis reports whether op runs in Redis (a limit of 0 per unit
	// is decided without it).
	redis bool
	// detail is the descriptor's detailed series name when its limit has
	// detailed_metric, else "".
	detail string
}

// count counts the item's decision: in its rule's series and, with
// detailed_metric, in its descriptor's.
func (s *Server) count(it *dropinItem, code int) {
	if it.detail != "" {
		s.metrics.decisionDetailed(it.limit.rule, it.detail, code, it.op.Cost)
		return
	}
	s.metrics.decision(it.limit.rule, code, it.op.Cost)
}

// shouldDropin decides a request with a configuration of
// envoyproxy/ratelimit's kind (docs/dropin.md), as that project does:
//
//   - each descriptor's limit is its `limit` override when it carries one
//     (in a known domain), else the tree's (dropin.resolve);
//   - a limit whose name another applying limit replaces is dropped, and
//     unlimited descriptors answer OK with limit_remaining 2^32-1;
//   - hits are the descriptor's hits_addend when set (0 only reads), else
//     the request's, at least 1;
//   - shadow limits are decided and counted but answer OK, and
//     GlobalShadow makes every answer OK;
//   - a Redis failure answers UNAVAILABLE.
//
// With FixedWindow every call counts in its calendar window, over the
// limit or not; with TokenBucket the enforced limits are all or nothing
// (what the others took is refunded when one is over), as in the rest of
// the service.
func (s *Server) shouldDropin(ctx context.Context, d *dropin, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	now := time.Now()
	items, unlimited, err := s.dropinItems(d, req, now)
	if err != nil {
		return nil, err
	}
	if err := s.runDropin(ctx, d, items); err != nil {
		for j := range items {
			if items[j].out.Err != nil {
				s.count(&items[j], codeError)
			}
		}
		s.metrics.request(reqUnavailable)
		return nil, status.Error(codes.Unavailable, "tokengate-rls: redis: "+err.Error())
	}
	return s.dropinAnswer(d, items, unlimited, now), nil
}

// dropinItems resolves each descriptor of req to its limit and op:
// unlimited ones are flagged, unmatched ones and those another applying
// limit replaces are left out.
func (s *Server) dropinItems(d *dropin, req *rlsv3.RateLimitRequest, now time.Time) ([]dropinItem, []bool, error) {
	ds := req.GetDescriptors()
	items := make([]dropinItem, 0, len(ds))
	unlimited := make([]bool, len(ds))
	var replacing map[string]bool
	var entries []Entry
	for i, desc := range ds {
		entries = make([]Entry, len(desc.GetEntries()))
		for j, e := range desc.GetEntries() {
			entries[j] = Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		var l *dlimit
		keyed := entries // what the limit counts under (dropin.resolve)
		if ov := desc.GetLimit(); ov != nil {
			if d.domains[req.Domain] != nil {
				var err error
				if l, err = overrideLimit(req.Domain, ov.GetRequestsPerUnit(), Unit(ov.GetUnit())); err != nil {
					s.metrics.request(reqInvalid)
					return nil, nil, status.Error(codes.InvalidArgument, "descriptors["+strconv.Itoa(i)+"]: "+err.Error())
				}
			}
		} else {
			l, keyed = d.resolve(req.Domain, entries)
		}
		if l == nil {
			s.metrics.unmatched.Add(1)
			continue
		}
		for _, r := range l.Replaces {
			if replacing == nil {
				replacing = map[string]bool{}
			}
			replacing[r] = true
		}
		if l.Unlimited {
			unlimited[i] = true
			continue
		}
		hits := uint64(max(req.GetHitsAddend(), 1))
		if h := desc.GetHitsAddend(); h != nil {
			hits = h.GetValue()
		}
		it := dropinItem{idx: i, limit: l, redis: true}
		if l.DetailedMetric {
			it.detail = detailedName(req.Domain, entries)
			if len(keyed) > 0 && &keyed[0] != &entries[0] { // shared by a pattern
				it.detail = sharedDetailedName(req.Domain, entries, keyed)
			}
		}
		if d.opt.Algorithm == FixedWindow {
			start := now.Unix() / l.window * l.window
			it.op = redisstore.Op{Key: windowKey(d.opt.CacheKeyPrefix, req.Domain, keyed, start), Cost: float64(hits), Window: l.window, Count: l.RequestsPerUnit}
		} else {
			lim := l.rule.Limit
			it.op = redisstore.Op{Key: dropinBucketKey(req.Domain, l, keyed), Rate: lim.Rate, Burst: lim.Burst, Cost: float64(hits)}
			if l.RequestsPerUnit == 0 {
				it.redis, it.out = false, redisstore.Outcome{Allowed: hits == 0}
			}
		}
		items = append(items, it)
	}
	if replacing != nil {
		kept := items[:0]
		for _, it := range items {
			if it.limit.Name == "" || !replacing[it.limit.Name] {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	return items, unlimited, nil
}

// dropinAnswer builds the response from the decided items, and counts
// the decisions.
func (s *Server) dropinAnswer(d *dropin, items []dropinItem, unlimited []bool, now time.Time) *rlsv3.RateLimitResponse {
	resp, parts := newResponse(len(unlimited))
	for i := range unlimited {
		if unlimited[i] {
			resp.Statuses[i].LimitRemaining = math.MaxUint32
		}
	}
	over := false
	for j := range items {
		it := &items[j]
		st, p, l := resp.Statuses[it.idx], &parts[it.idx], it.limit
		p.limit.Name, p.limit.RequestsPerUnit, p.limit.Unit = l.Name, l.RequestsPerUnit, l.Unit
		st.CurrentLimit = &p.limit
		var reset float64
		allowed := it.out.Allowed
		if d.opt.Algorithm == FixedWindow {
			if allowed {
				st.LimitRemaining = l.RequestsPerUnit - uint32(it.out.Tokens)
			}
			reset = float64(l.window - now.Unix()%l.window)
		} else {
			st.LimitRemaining = remainingOf(it.out.Tokens)
			// The seconds until the bucket is full again: until
			// limit_remaining is back to current_limit, nothing taken
			// meanwhile. A rejected request took nothing, so waiting
			// that long always lets it pass if it fits in the bucket.
			reset = l.rule.Limit.ResetAfter(it.out.Tokens)
			if l.RequestsPerUnit == 0 {
				reset = 0
			}
		}
		setDuration(&p.untilReset, reset)
		st.DurationUntilReset = &p.untilReset
		switch {
		case allowed:
			s.count(it, codeOK)
		case l.Shadow:
			s.count(it, codeShadowOver)
		default:
			s.count(it, codeOver)
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			over = true
		}
	}
	if d.opt.Headers != nil {
		resp.ResponseHeadersToAdd = dropinHeaders(d.opt.Headers, resp.Statuses)
	}
	if over && !d.opt.GlobalShadow {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		s.metrics.request(reqOver)
	} else {
		s.metrics.request(reqOK)
	}
	return resp
}

// runDropin runs the items' ops and, for token buckets, gives back what
// the enforced (and, apart, the shadow) limits took when one of their
// group is over. It returns the first Redis error.
func (s *Server) runDropin(ctx context.Context, d *dropin, items []dropinItem) error {
	var ops []redisstore.Op
	var at []int
	for j := range items {
		if items[j].redis {
			ops = append(ops, items[j].op)
			at = append(at, j)
		}
	}
	if len(ops) == 0 {
		return nil
	}
	for k, o := range s.store.Run(ctx, ops) {
		items[at[k]].out = o
	}
	for _, it := range items {
		if it.out.Err != nil {
			return it.out.Err
		}
	}
	if d.opt.Algorithm == FixedWindow {
		return nil
	}
	var enforceOver, shadowOver bool
	for _, it := range items {
		if !it.out.Allowed {
			if it.limit.Shadow {
				shadowOver = true
			} else {
				enforceOver = true
			}
		}
	}
	var refund []redisstore.Op
	var refundAt []int
	for j, it := range items {
		groupOver := enforceOver
		if it.limit.Shadow {
			groupOver = shadowOver
		}
		if groupOver && it.redis && it.out.Allowed && it.op.Cost > 0 {
			op := it.op
			op.Cost = -op.Cost
			refund = append(refund, op)
			refundAt = append(refundAt, j)
		}
	}
	if len(refund) == 0 {
		return nil
	}
	for k, o := range s.store.Run(context.WithoutCancel(ctx), refund) {
		if o.Err != nil {
			s.metrics.refundErrors.Add(1) // strict: the tokens stay taken
			continue
		}
		items[refundAt[k]].out.Tokens = o.Tokens
	}
	return nil
}

// dropinHeaders are envoyproxy/ratelimit's three response headers: the
// limit, remaining and reset (whole seconds, rounded up) of the status
// closest to its limit, or of the last one over it.
func dropinHeaders(h *HeaderNames, sts []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var best *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for _, st := range sts {
		if st.CurrentLimit != nil && st.LimitRemaining < least {
			best, least = st, st.LimitRemaining
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			best, least = st, 0
		}
	}
	if best == nil {
		return nil
	}
	reset := best.DurationUntilReset.GetSeconds()
	if best.DurationUntilReset.GetNanos() > 0 {
		reset++
	}
	return []*corev3.HeaderValue{
		{Key: h.Limit, Value: strconv.FormatUint(uint64(best.CurrentLimit.RequestsPerUnit), 10)},
		{Key: h.Remaining, Value: strconv.FormatUint(uint64(best.LimitRemaining), 10)},
		{Key: h.Reset, Value: strconv.FormatInt(reset, 10)},
	}
}
