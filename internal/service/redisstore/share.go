package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"
)

// Shares (docs/rlqs.md): a bucket served over RLQS is split among the Envoy
// processes that report it, each holding a share of the rule's rate and
// burst, in a Redis hash "tq:{<rule>:<composite>}"; share.lua grants,
// renews and releases them.

//go:embed share.lua
var shareLua string

var shareScript = newScript(shareLua)

// ShareKey returns the Redis key of an RLQS bucket:
// "tq:{<rule>:<composite>}" (the braces are the Redis Cluster hash tag, as
// in BucketKey).
func ShareKey(rule, composite string) string {
	return "tq:{" + rule + ":" + composite + "}"
}

// ShareOp is one holder's request for its share of a bucket, or its
// release.
type ShareOp struct {
	Key         string
	Rate, Burst float64
	// Fill is the fill interval of every share of the bucket, whole
	// seconds: a share's rate is Units/Fill tokens per second.
	Fill int64
	// Pool bounds the units all live shares hold together (at most
	// Rate*Fill); BurstPool the max_tokens they hold together (at most
	// Burst).
	Pool, BurstPool uint64
	// Holder is the Envoy stream; Demand its requests per second.
	Holder string
	Demand float64
	// TTL is how long, in whole seconds, the Envoy keeps the share; Grace
	// how long a replaced or released share stays held (seconds).
	TTL, Grace float64
	// Release gives the holder's share up.
	Release bool
	// Now replaces Redis TIME when not empty (tests).
	Now string
}

// ShareResult is the script's answer to a ShareOp.
type ShareResult struct {
	// Units and MaxTokens are the holder's share (Units 0: none); Changed
	// reports whether it differs from the one the holder had.
	Units, MaxTokens uint64
	Changed          bool
	// Tokens are the free tokens left in the bucket.
	Tokens float64
	Err    error
}

// Share runs ops in one pipeline (spread over a cluster's masters by key)
// and returns their results in order, as Run runs its ops (runEach: the
// deadline, NOSCRIPT, retries and the guard of silent nodes alike).
func (s *Store) Share(ctx context.Context, ops []ShareOp) []ShareResult {
	out := make([]ShareResult, len(ops))
	s.runEach(ctx, len(ops), func(i int) (*script, string, []string) {
		return shareScript, ops[i].Key, ops[i].args()
	}, func(i int, r rueidis.RedisResult, err error) error {
		if err == nil {
			out[i] = shareResult(r)
		} else {
			out[i] = ShareResult{Err: err}
		}
		return out[i].Err
	})
	return out
}

func (op ShareOp) args() []string {
	mode := "share"
	if op.Release {
		mode = "release"
	}
	return []string{Num(op.Rate), Num(op.Burst), strconv.FormatInt(op.Fill, 10),
		strconv.FormatUint(op.Pool, 10), strconv.FormatUint(op.BurstPool, 10), mode, op.Holder,
		strconv.FormatFloat(op.Demand, 'f', 6, 64), Num(op.TTL), Num(op.Grace), op.Now}
}

func shareResult(r rueidis.RedisResult) ShareResult {
	arr, err := r.ToArray()
	if err != nil {
		return ShareResult{Err: err}
	}
	if len(arr) != 4 {
		return ShareResult{Err: fmt.Errorf("redis: share script returned %d values, want 4", len(arr))}
	}
	var ints [3]int64
	for i := range ints {
		if ints[i], err = arr[i].AsInt64(); err != nil || ints[i] < 0 {
			return ShareResult{Err: fmt.Errorf("redis: share script: value %d: %v", i, arr[i])}
		}
	}
	ts, err := arr[3].ToString()
	if err != nil {
		return ShareResult{Err: fmt.Errorf("redis: share script: %w", err)}
	}
	tokens, err := strconv.ParseFloat(ts, 64)
	if err != nil {
		return ShareResult{Err: fmt.Errorf("redis: share script returned tokens %q", ts)}
	}
	return ShareResult{Units: uint64(ints[0]), MaxTokens: uint64(ints[1]), Changed: ints[2] == 1, Tokens: tokens}
}
