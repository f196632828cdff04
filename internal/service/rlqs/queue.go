package rlqs

// The share queue: every stream's report waits here, and one flush at a
// time makes the Redis work of all of them, one script call per bucket
// for every Envoy that reported it, in bounded pipelines (docs/rlqs.md).

import (
	"context"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/redisstore"
)

// nowArg is the time passed to Redis: "" (Redis TIME) unless Options.Now
// is set.
func (s *Server) nowArg() string {
	if s.opt.Now == nil {
		return ""
	}
	return strconv.FormatFloat(float64(s.now().UnixMicro())/1e6, 'f', 6, 64)
}

// batchOf returns the batch parameters of a bucket of rule r (no ops).
func (s *Server) batchOf(r *config.Rule, key string, interval int64, nowArg string) redisstore.ShareBatch {
	lim := r.Limit
	fill := fillInterval(lim.Rate)
	return redisstore.ShareBatch{Key: key, Rate: lim.Rate, Burst: lim.Burst, Fill: fill,
		Pool:      uint64(max(math.Floor(poolFraction*lim.Rate*float64(fill)), 1)),
		BurstPool: uint64(max(math.Floor(burstFraction*lim.Burst), 1)),
		Grace:     s.opt.Grace.Seconds(), Turn: float64(max(turnReports*interval, turnReports)), Now: nowArg}
}

// shareReq is one bucket's share request of a report and, once run, its
// result.
type shareReq struct {
	batch redisstore.ShareBatch // the bucket's parameters, no ops
	op    redisstore.ShareOp
	res   redisstore.ShareResult
}

// shareQueue coalesces the share requests of all streams: while one
// flush runs in Redis, the reports that arrive wait, and the next flush
// decides them all, one script call per bucket whatever the number of
// holders reporting it (a fleet subscribing at once is one call per
// bucket, not one per Envoy). One flush runs at a time.
type shareQueue struct {
	s       *Server
	mu      sync.Mutex
	waiting []*shareTicket
	running bool
}

type shareTicket struct {
	reqs []shareReq
	done chan struct{}
	// pending are the indexes of reqs still to run; tries how many flushes
	// failed some of them.
	pending []int
	tries   int
}

// Retries of share requests Redis failed (a pipeline over the timeout):
// a failed batch runs once more in the same flush, and what still fails
// waits for a later flush, up to shareRetries times, retryBackoff × 2^try
// after the failure (0.1 + 0.2 + 0.4 + 0.8 s = 1.5 s in all), so that a
// burst (a fleet subscribing at once: thousands of streams decoded on the
// same cores as the Redis client) or a Redis that stalled for an instant
// delays the answers instead of losing them. A share request is safe to
// repeat: a second run finds the share the first granted and renews it.
const (
	shareRetries = 4
	retryBackoff = 100 * time.Millisecond
)

// run decides reqs with whatever else is waiting, and returns when their
// results are set.
func (q *shareQueue) run(reqs []shareReq) {
	t := &shareTicket{reqs: reqs, done: make(chan struct{})}
	for i := range reqs {
		t.pending = append(t.pending, i)
	}
	q.mu.Lock()
	q.waiting = append(q.waiting, t)
	if !q.running {
		q.running = true
		go q.flush()
	}
	q.mu.Unlock()
	<-t.done
}

func (q *shareQueue) flush() {
	for {
		q.mu.Lock()
		ts := q.waiting
		q.waiting = nil
		if len(ts) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		var batches []redisstore.ShareBatch
		type at struct{ t, r int }
		var where [][]at
		index := map[string]int{}
		for ti, t := range ts {
			for _, ri := range t.pending {
				r := &t.reqs[ri]
				bi, ok := index[r.batch.Key]
				if !ok {
					bi = len(batches)
					index[r.batch.Key] = bi
					batches = append(batches, r.batch)
					where = append(where, nil)
				} else {
					// The newest parameters (a reload between reports).
					ops := batches[bi].Ops
					batches[bi] = r.batch
					batches[bi].Ops = ops
				}
				batches[bi].Ops = append(batches[bi].Ops, r.op)
				where[bi] = append(where[bi], at{ti, ri})
			}
		}
		q.s.opt.Metrics.calls.Add(float64(len(batches)))
		res := q.s.store.Share(context.Background(), batches)
		// The batches that failed (a pipeline over the timeout on a busy
		// Redis) run once more: a share op is safe to repeat, as a second
		// run finds the share the first granted and renews it.
		var again []redisstore.ShareBatch
		var againAt []int
		for bi := range batches {
			if slices.ContainsFunc(res[bi], func(r redisstore.ShareResult) bool { return r.Err != nil }) {
				again = append(again, batches[bi])
				againAt = append(againAt, bi)
			}
		}
		if len(again) > 0 {
			q.s.opt.Metrics.calls.Add(float64(len(again)))
			for i, r := range q.s.store.Share(context.Background(), again) {
				res[againAt[i]] = r
			}
		}
		for bi, ws := range where {
			for k, w := range ws {
				ts[w.t].reqs[w.r].res = res[bi][k]
			}
		}
		var later []*shareTicket
		for _, t := range ts {
			failed := t.pending[:0]
			for _, ri := range t.pending {
				if t.reqs[ri].res.Err != nil {
					failed = append(failed, ri)
				}
			}
			t.pending = failed
			if len(failed) > 0 && t.tries < shareRetries {
				t.tries++
				later = append(later, t)
				continue
			}
			close(t.done)
		}
		if len(later) > 0 {
			wait := retryBackoff << (later[0].tries - 1)
			select {
			case <-time.After(wait):
			case <-q.s.stop.Done():
			}
			q.mu.Lock()
			q.waiting = append(later, q.waiting...)
			q.mu.Unlock()
		}
	}
}
