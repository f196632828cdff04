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
// renews, rotates and releases them, for every holder of a batch in one
// call, reading only that batch's records and the bucket's running totals
// (docs/rlqs.md#running-totals).

//go:embed share.lua
var shareLua string

var shareScript = newScript(shareLua)

// ShareKey returns the Redis key of an RLQS bucket:
// "tq:{<rule>:<composite>}" (the braces are the Redis Cluster hash tag, as
// in BucketKey).
func ShareKey(rule, composite string) string {
	return "tq:{" + rule + ":" + composite + "}"
}

// ShareBatch is every share request for one bucket decided together: one
// script call, whatever the number of holders.
type ShareBatch struct {
	Key         string
	Rate, Burst float64
	// Fill is the fill interval of the bucket's shares, whole seconds: a
	// share's rate is Units/Fill tokens per second.
	Fill int64
	// Pool bounds the units all live shares hold together (at most
	// Rate*Fill); BurstPool is the max_tokens shared out, each share
	// getting its part of the pool's (at least 1; the free tokens bound
	// them all), and so also the most shares held at once.
	Pool, BurstPool uint64
	// Grace is how long a replaced or released share stays held, Turn how
	// long a share is held before it yields to a holder waiting for one
	// when the burst has no room for both (seconds).
	Grace, Turn float64
	// Now replaces Redis TIME when not empty (tests).
	Now string
	// Ops are the holders' requests, at most one per holder.
	Ops []ShareOp
}

// ShareOp is one holder's request for its share of a bucket, or its
// release.
type ShareOp struct {
	// Holder is the Envoy stream; Demand its requests per second.
	Holder string
	Demand float64
	// TTL is how long, in whole seconds, the Envoy keeps the share.
	TTL float64
	// Release gives the holder's share up.
	Release bool
}

// ShareResult is the script's answer to a ShareOp.
type ShareResult struct {
	// Units and MaxTokens are the holder's share (Units 0: none); Changed
	// reports whether it differs from the one the holder had.
	Units, MaxTokens uint64
	Changed          bool
	// Tokens are the free tokens left in the bucket after the batch.
	Tokens float64
	Err    error
}

// Share limits: a script call decides at most shareCallOps holders (a
// batch of more is split into calls run one after the other, each seeing
// the last's state), and a pipeline carries at most shareChunkCalls calls
// and shareChunkOps holders, so that each round trip fits the store's
// timeout however large the report or the fleet (10,000 buckets are 313
// round trips, one after the other, each under the timeout; never one
// round trip per bucket).
const (
	shareCallOps    = 64
	shareChunkCalls = 32
	shareChunkOps   = 64
)

// Share runs batches, one script call per batch (per shareCallOps of its
// holders), in pipelines of bounded size one after the other (each as Run
// runs its ops: the deadline, NOSCRIPT, retries and the guard of silent
// nodes alike), and returns each batch's results in the order of its ops.
func (s *Store) Share(ctx context.Context, batches []ShareBatch) [][]ShareResult {
	out := make([][]ShareResult, len(batches))
	type call struct {
		b    *ShareBatch
		res  []ShareResult
		from int
		to   int
	}
	var calls []call
	for i := range batches {
		b := &batches[i]
		out[i] = make([]ShareResult, len(b.Ops))
		for from := 0; from < len(b.Ops) || from == 0; from += shareCallOps {
			to := min(from+shareCallOps, len(b.Ops))
			calls = append(calls, call{b: b, res: out[i][from:to], from: from, to: to})
			if to == len(b.Ops) {
				break
			}
		}
	}
	for start := 0; start < len(calls); {
		end, ops := start, 0
		for end < len(calls) && end-start < shareChunkCalls && (end == start || ops+calls[end].to-calls[end].from <= shareChunkOps) {
			ops += calls[end].to - calls[end].from
			end++
		}
		chunk := calls[start:end]
		s.runEach(ctx, len(chunk), func(i int) (*script, string, []string) {
			c := chunk[i]
			return shareScript, c.b.Key, c.b.args(c.from, c.to)
		}, func(i int, r rueidis.RedisResult, err error) error {
			res := chunk[i].res
			if err == nil {
				err = shareResults(r, res)
			}
			if err != nil {
				for j := range res {
					res[j] = ShareResult{Err: err}
				}
			}
			return err
		})
		start = end
	}
	return out
}

// args are the script's arguments for b.Ops[from:to].
func (b *ShareBatch) args(from, to int) []string {
	a := make([]string, 0, 8+4*(to-from))
	a = append(a, Num(b.Rate), Num(b.Burst), strconv.FormatInt(b.Fill, 10),
		strconv.FormatUint(b.Pool, 10), strconv.FormatUint(b.BurstPool, 10), Num(b.Grace), Num(b.Turn), b.Now)
	for _, op := range b.Ops[from:to] {
		mode := "share"
		if op.Release {
			mode = "release"
		}
		a = append(a, mode, op.Holder, strconv.FormatFloat(op.Demand, 'f', 6, 64), Num(op.TTL))
	}
	return a
}

func shareResults(r rueidis.RedisResult, out []ShareResult) error {
	arr, err := r.ToArray()
	if err != nil {
		return err
	}
	if len(arr) != 3*len(out)+1 {
		return fmt.Errorf("redis: share script returned %d values, want %d", len(arr), 3*len(out)+1)
	}
	ts, err := arr[len(arr)-1].ToString()
	if err != nil {
		return fmt.Errorf("redis: share script: %w", err)
	}
	tokens, err := strconv.ParseFloat(ts, 64)
	if err != nil {
		return fmt.Errorf("redis: share script returned tokens %q", ts)
	}
	for i := range out {
		var ints [3]int64
		for k := range ints {
			if ints[k], err = arr[3*i+k].AsInt64(); err != nil || ints[k] < 0 {
				return fmt.Errorf("redis: share script: value %d: %v", 3*i+k, arr[3*i+k])
			}
		}
		out[i] = ShareResult{Units: uint64(ints[0]), MaxTokens: uint64(ints[1]), Changed: ints[2] == 1, Tokens: tokens}
	}
	return nil
}
