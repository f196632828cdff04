package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"
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
	args := []string{Num(op.Rate), Num(op.Burst), Num(op.TTL), mode, strconv.FormatUint(op.Want, 10),
		op.Holder, strconv.FormatUint(op.Grant, 10), strconv.FormatFloat(op.Unspent, 'f', 6, 64)}
	if op.Now != "" || op.Share > 0 {
		args = append(args, op.Now)
	}
	if op.Share > 0 {
		args = append(args, Num(op.Share))
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
	if err != nil {
		s.notePerm(leaseScript, op.Key, err)
	} else if s.perms.unchecked.Load() {
		s.noteSuccess(leaseScript)
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
	a := []string{rate, burst, Num(op.TTL), "take", Num(op.Cost)}
	if op.Now != "" || op.LeaseShare > 0 {
		a = append(a, "", "0", "0", op.Now)
	}
	if op.LeaseShare > 0 {
		a = append(a, Num(op.LeaseShare))
	}
	return a
}
