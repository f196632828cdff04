package rls

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"strconv"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/rlscontract"
)

// Lease mode (docs/lease.md): the global bucket of a lease-mode rule lives
// in a Redis hash "tl:{<rule>:<composite>}" holding the free tokens and the
// live grants of every proxy process; one Lua script (lease.lua) grants,
// renews, takes back and takes exactly.

//go:embed lease.lua
var leaseLua string

var leaseScript = newScript(leaseLua)

// LeaseKey returns the Redis key of a lease-mode rule's bucket:
// "tl:{<rule>:<composite>}" (the braces are the Redis Cluster hash tag, as
// in BucketKey).
func LeaseKey(rule, composite string) string {
	return "tl:{" + rule + ":" + composite + "}"
}

// LeaseOp is one holder's lease request, or its release.
type LeaseOp struct {
	Key         string
	Rate, Burst float64
	// TTL is a grant's lifetime in seconds.
	TTL float64
	// Holder is the proxy process's id; Grant the grant id it holds (0:
	// none) and Unspent what it has left of it.
	Holder  string
	Grant   uint64
	Unspent float64
	// Want is the tokens asked for (0: a renewal of Unspent's expiry).
	Want uint64
	// Release returns Unspent instead.
	Release bool
	// Now replaces Redis TIME when not empty (tests).
	Now string
	// Share is the most one holder's share of the refill may reach, in
	// tokens (the rule's lease_max): the refill is divided among the
	// active holders, so that equal demand gets equal grants whoever asks
	// first (lease.lua, docs/lease.md). 0: no shares.
	Share float64
}

// LeaseResult is the script's answer to a LeaseOp.
type LeaseResult struct {
	// OverLimit: tokens were wanted and none were free.
	OverLimit bool
	// Granted is the new tokens granted (or, for a release, the tokens
	// returned).
	Granted uint64
	// Covered is the part of the reported unspent tokens the new grant
	// carries over: the tokens the reported grant still held, whole. The
	// new grant's amount is Covered + Granted (Quota.requests).
	Covered uint64
	// ID is the new grant's id (0 for a release).
	ID uint64
	// Tokens are the free tokens left that this holder could still be
	// granted: the global bucket's, less the other holders' shares.
	Tokens float64
	// Retry is the seconds until a token is free (OverLimit); ValidUntil
	// the grant's expiry in Redis time, seconds since the Unix epoch.
	Retry, ValidUntil float64
}

// Lease runs one lease request or release.
func (s *Store) Lease(ctx context.Context, op LeaseOp) (LeaseResult, error) {
	cp := s.client.Load()
	if cp == nil {
		s.observe(0, ErrNotConnected)
		return LeaseResult{}, ErrNotConnected
	}
	c := *cp
	start := time.Now()
	ctx, cancel := s.bound(ctx, start)
	defer cancel()
	mode := "lease"
	if op.Release {
		mode = "release"
	}
	args := []string{num(op.Rate), num(op.Burst), num(op.TTL), mode, strconv.FormatUint(op.Want, 10),
		op.Holder, strconv.FormatUint(op.Grant, 10), strconv.FormatFloat(op.Unspent, 'f', 6, 64)}
	if op.Now != "" || op.Share > 0 {
		args = append(args, op.Now)
	}
	if op.Share > 0 {
		args = append(args, num(op.Share))
	}
	// doOne: not sent to a node that does not answer (guard.go).
	r, err := s.doOne(ctx, c, c.B().Evalsha().Sha1(leaseScript.sha).Numkeys(1).Key(op.Key).Arg(args...).Build())
	if e, ok := rueidis.IsRedisErr(r.Error()); err == nil && ok && e.IsNoScript() {
		r, err = s.doOne(ctx, c, c.B().Eval().Script(leaseScript.text).Numkeys(1).Key(op.Key).Arg(args...).Build())
	}
	res := LeaseResult{}
	if err == nil {
		res, err = leaseResult(r)
	}
	if s.opt.Observe != nil {
		s.opt.Observe(time.Since(start), err)
	}
	return res, err
}

func leaseResult(r rueidis.RedisResult) (LeaseResult, error) {
	arr, err := r.ToArray()
	if err != nil {
		return LeaseResult{}, err
	}
	if len(arr) != 7 {
		return LeaseResult{}, fmt.Errorf("redis: lease script returned %d values, want 7", len(arr))
	}
	var ints [4]int64
	for i, j := range [...]int{0, 1, 2, 6} {
		if ints[i], err = arr[j].AsInt64(); err != nil || ints[i] < 0 {
			return LeaseResult{}, fmt.Errorf("redis: lease script: value %d: %v", j, arr[j])
		}
	}
	var fl [3]float64
	for i := range fl {
		str, err := arr[3+i].ToString()
		if err == nil {
			fl[i], err = strconv.ParseFloat(str, 64)
		}
		if err != nil {
			return LeaseResult{}, fmt.Errorf("redis: lease script: %w", err)
		}
	}
	return LeaseResult{OverLimit: ints[0] == 2, Granted: uint64(ints[1]), ID: uint64(ints[2]), Covered: uint64(ints[3]),
		Tokens: fl[0], Retry: fl[1], ValidUntil: fl[2]}, nil
}

// leaseArgs are the lease script's arguments for an exact take (Op.Lease):
// its answer has the token-bucket script's shape.
func (op Op) leaseArgs() []string {
	rate, burst := op.limitStrings()
	a := []string{rate, burst, num(op.TTL), "take", num(op.Cost)}
	if op.Now != "" || op.LeaseShare > 0 {
		a = append(a, "", "0", "0", op.Now)
	}
	if op.LeaseShare > 0 {
		a = append(a, num(op.LeaseShare))
	}
	return a
}

// Leaser runs lease requests; *Store is the Redis one.
type Leaser interface {
	Lease(ctx context.Context, op LeaseOp) (LeaseResult, error)
}

// leaseRule returns the lease-mode rule a lease descriptor names and its
// bucket's key, or nil.
func (c *Config) leaseRule(domain string, l rlscontract.Lease) (*config.Rule, string) {
	r := c.clusterRule(domain, l.Rule)
	if r == nil || r.Lease == nil {
		return nil, ""
	}
	return r, LeaseKey(r.Name, cleanComposite(l.Composite))
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
		return r, BucketKey(r.Name, cleanComposite(l.Composite)), false
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
	res, err := lr.Lease(ctx, LeaseOp{Key: key, Rate: r.Limit.Rate, Burst: r.Limit.Burst, TTL: r.Lease.TTL,
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
