package rls

import (
	"context"
	_ "embed"
	"math"
	"strconv"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/rlscontract"
)

// Leaser runs lease requests; *redisstore.Store is the Redis one.
type Leaser interface {
	Lease(ctx context.Context, op redisstore.LeaseOp) (redisstore.LeaseResult, error)
}

// leaseRule returns the lease-mode rule a lease descriptor names and its
// bucket's key, or nil.
func (c *Config) leaseRule(domain string, l rlscontract.Lease) (*config.Rule, string) {
	r := c.clusterRule(domain, l.Rule)
	if r == nil || r.Lease == nil {
		return nil, ""
	}
	return r, redisstore.LeaseKey(r.Name, cleanComposite(l.Composite))
}

// leaseTake returns the rule and bucket of an exact take sent by a
// lease-mode rule: its lease bucket, or, when this service's configuration
// has the rule in exact mode, its token bucket (limited either way, never
// waved through); lease reports which.
func (c *Config) leaseTake(domain string, l rlscontract.Lease) (r *config.Rule, key string, lease bool) {
	if r, key := c.leaseRule(domain, l); r != nil {
		return r, key, true
	}
	if r := c.clusterRule(domain, l.Rule); r != nil {
		return r, redisstore.BucketKey(r.Name, cleanComposite(l.Composite)), false
	}
	return nil, "", false
}

// shouldLease answers a request whose only descriptor is a holder's lease
// request or release. ok is false for any other request.
func (s *Server) shouldLease(ctx context.Context, req *rlsv3.RateLimitRequest) (resp *rlsv3.RateLimitResponse, ok bool, err error) {
	ds := req.GetDescriptors()
	if len(ds) != 1 || len(ds[0].GetEntries()) < 3 || ds[0].GetEntries()[2].GetKey() != rlscontract.ModeKey {
		return nil, false, nil // not lease mode (rlscontract.ParseLease): skip the copy
	}
	entries := make([]Entry, 0, len(ds[0].GetEntries()))
	for _, e := range ds[0].GetEntries() {
		entries = append(entries, Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	l, isLease, perr := rlscontract.ParseLease(rlscontract.Descriptor{Entries: entries, HitsAddend: ds[0].GetHitsAddend().GetValue()})
	if !isLease || perr == nil && l.Exact() {
		return nil, false, nil // an exact take: ShouldRateLimit's path
	}
	if err := s.authorizeWrite(ctx); err != nil {
		return nil, true, err // a holder's grant or return: a write (trust.go)
	}
	if perr != nil {
		s.metrics.request(reqInvalid)
		return nil, true, status.Error(codes.InvalidArgument, perr.Error())
	}
	r, key := s.cfg.Load().leaseRule(req.GetDomain(), l)
	if r == nil {
		s.metrics.request(reqInvalid)
		return nil, true, status.Error(codes.InvalidArgument, "no lease-mode rule "+strconv.Quote(l.Rule))
	}
	lr, ok2 := s.store.(Leaser)
	if !ok2 {
		return nil, true, status.Error(codes.Unimplemented, "this store does not lease")
	}
	res, err := lr.Lease(ctx, redisstore.LeaseOp{Key: key, Rate: r.Limit.Rate, Burst: r.Limit.Burst, TTL: r.Lease.TTL,
		Holder: l.Holder, Grant: l.Grant, Unspent: l.Unspent, Want: l.Want, Release: l.Release, Share: r.Lease.Max})
	if err != nil {
		s.metrics.request(reqUnavailable)
		return nil, true, status.Error(codes.Unavailable, "tokengate-rls: redis: "+err.Error())
	}
	a := rlscontract.LeaseAnswer{OverLimit: res.OverLimit, Remaining: uint32(min(math.Floor(res.Tokens), math.MaxUint32))}
	if res.OverLimit {
		a.Retry = res.Retry
	}
	if !l.Release {
		// The grant's whole amount: the reported tokens it carries over
		// plus the new ones (docs/lease.md, wire protocol).
		a.HasGrant, a.Grant, a.Tokens, a.ValidUntil = true, res.ID, uint32(min(res.Covered+res.Granted, math.MaxUint32)), res.ValidUntil
	}
	st := statusMessage(rlscontract.LeaseStatus(a))
	st.CurrentLimit = currentLimit(r)
	resp = &rlsv3.RateLimitResponse{OverallCode: st.Code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{st}}
	if res.OverLimit {
		s.metrics.decision(r, codeOver, 0)
		s.metrics.request(reqOver)
	} else {
		s.metrics.decision(r, codeOK, float64(res.Granted))
		s.metrics.request(reqOK)
	}
	return resp, true, nil
}

// statusMessage is a contract status as the protocol's message: code,
// limit_remaining, duration_until_reset when over the limit or not 0, and the quota
// (requests, id, valid_until) when it has one. current_limit is the
// caller's.
func statusMessage(c rlscontract.Status) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(c.Code), LimitRemaining: c.LimitRemaining}
	if c.Code == rlscontract.CodeOverLimit || c.UntilReset != 0 {
		st.DurationUntilReset = duration(c.UntilReset)
	}
	if c.HasQuota {
		sec, frac := math.Modf(c.Quota.ValidUntil)
		st.Quota = &rlsv3.RateLimitResponse_Quota{Requests: c.Quota.Requests, Id: c.Quota.ID,
			ExpirationSpecifier: &rlsv3.RateLimitResponse_Quota_ValidUntil{ValidUntil: &timestamppb.Timestamp{Seconds: int64(sec), Nanos: int32(frac * 1e9)}}}
	}
	return st
}
