package rlqs_test

import (
	"math"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The model of Envoy's rate_limit_quota filter in this file is written from the
// RLQS protocol (rlqs.proto) and Envoy's documented behaviour, not from
// package rlqs: one stream per process; a bucket's first request sends its
// first report (its subscription) and is decided by no_assignment_behavior;
// every reportInterval every bucket is reported with the time elapsed in
// whole seconds; a token-bucket assignment starts a new bucket full unless
// it equals the active one, which only has its TTL (whole seconds)
// extended; an expired assignment falls back to expired_assignment_behavior
// and then no_assignment_behavior; an abandon action erases the bucket.
// The fallbacks are the conservative ones of deploy/rlqs/envoy.yaml:
// deny all. Time is simulated: the model and the server read the same
// clock, and the model waits for the answer to each report before time
// moves on, so no verdict depends on the machine's speed.

const reportInterval = 5 // seconds, Envoy's reporting_interval

type clock struct{ micros atomic.Int64 }

func (c *clock) now() time.Time { return time.UnixMicro(c.micros.Load()) }
func (c *clock) sec() float64   { return float64(c.micros.Load()) / 1e6 }

type modelBucket struct {
	id              map[string]string
	allowed, denied uint64
	lastReport      float64
	// strategy is the active assignment (nil: none), until expires.
	strategy *typev3.RateLimitStrategy
	expires  float64
	// The assignment's token bucket: tokens at last, up to max, refilled
	// at rate per second.
	tokens, max, rate, last float64
}

type modelEnvoy struct {
	t          *testing.T
	stream     rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient
	domain     string
	buckets    map[string]*modelBucket
	nextReport float64 // 0: the timer has not started
	interval   float64 // reporting_interval, seconds (0: reportInterval)
	debug      bool
	sent       int // report messages sent
	admitted   uint64
	abandons   int
	expiries   int
}

func idKey(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k, v := range id {
		keys = append(keys, k+"\x00"+v)
	}
	sort.Strings(keys)
	return strings.Join(keys, "\x01")
}

func (e *modelEnvoy) every() float64 {
	if e.interval > 0 {
		return e.interval
	}
	return reportInterval
}

// request decides one request of bucket id at now.
func (e *modelEnvoy) request(now float64, id map[string]string) bool {
	b := e.buckets[idKey(id)]
	if b == nil {
		b = &modelBucket{id: id, lastReport: now}
		e.buckets[idKey(id)] = b
		ok := e.decide(b, now)
		e.send(now, []*modelBucket{b})
		if e.nextReport == 0 {
			e.nextReport = now + e.every()
		}
		return ok
	}
	return e.decide(b, now)
}

func (e *modelEnvoy) decide(b *modelBucket, now float64) bool {
	if b.strategy != nil && now >= b.expires {
		// expired_assignment_behavior, then no_assignment_behavior: both
		// deny all here.
		b.strategy = nil
		e.expiries++
	}
	ok := false
	switch {
	case b.strategy == nil:
	case b.strategy.GetTokenBucket() != nil:
		b.tokens = math.Min(b.max, b.tokens+(now-b.last)*b.rate)
		b.last = now
		if b.tokens >= 1 {
			b.tokens--
			ok = true
		}
	default:
		ok = b.strategy.GetBlanketRule() == typev3.RateLimitStrategy_ALLOW_ALL
	}
	if ok {
		b.allowed++
		e.admitted++
	} else {
		b.denied++
	}
	return ok
}

// tick sends the periodic report when it is due.
func (e *modelEnvoy) tick(now float64) {
	if e.nextReport == 0 || now < e.nextReport || len(e.buckets) == 0 {
		return
	}
	e.nextReport += e.every()
	bs := make([]*modelBucket, 0, len(e.buckets))
	for _, b := range e.buckets {
		bs = append(bs, b)
	}
	e.send(now, bs)
}

// send reports bs and applies the answer.
func (e *modelEnvoy) send(now float64, bs []*modelBucket) {
	e.t.Helper()
	m := &rlqsv3.RateLimitQuotaUsageReports{Domain: e.domain}
	for _, b := range bs {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqsv3.BucketId{Bucket: b.id},
			TimeElapsed:        &durationpb.Duration{Seconds: int64(now - b.lastReport)},
			NumRequestsAllowed: b.allowed, NumRequestsDenied: b.denied})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	if err := e.stream.Send(m); err != nil {
		e.t.Fatalf("send: %v", err)
	}
	e.sent++
	e.apply(now, e.recv())
}

func (e *modelEnvoy) recv() *rlqsv3.RateLimitQuotaResponse {
	e.t.Helper()
	type got struct {
		r   *rlqsv3.RateLimitQuotaResponse
		err error
	}
	c := make(chan got, 1)
	go func() { r, err := e.stream.Recv(); c <- got{r, err} }()
	select {
	case g := <-c:
		if g.err != nil {
			e.t.Fatalf("recv: %v", g.err)
		}
		return g.r
	case <-time.After(20 * time.Second): // a hang, not a verdict on speed
		e.t.Fatal("no answer to a report within 20 s")
		return nil
	}
}

func (e *modelEnvoy) apply(now float64, r *rlqsv3.RateLimitQuotaResponse) {
	if e.debug {
		e.t.Logf("%.1f %v", now, r)
	}
	for _, a := range r.GetBucketAction() {
		k := idKey(a.GetBucketId().GetBucket())
		b := e.buckets[k]
		if b == nil {
			continue
		}
		if a.GetAbandonAction() != nil {
			delete(e.buckets, k)
			e.abandons++
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		st := qa.GetRateLimitStrategy()
		if tb := st.GetTokenBucket(); tb != nil {
			old := b.strategy.GetTokenBucket()
			// Envoy compares max_tokens, tokens_per_fill and only the
			// nanoseconds of fill_interval (global_client_impl.cc,
			// protoTokenBucketsEq); the rate is tokens_per_fill over the
			// whole seconds.
			same := b.strategy != nil && now < b.expires && old != nil && old.GetMaxTokens() == tb.GetMaxTokens() &&
				old.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
				old.GetFillInterval().GetNanos() == tb.GetFillInterval().GetNanos()
			if !same {
				b.max = float64(tb.GetMaxTokens())
				b.tokens = b.max
				b.rate = float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
				b.last = now
			}
		}
		b.strategy = st
		b.expires = math.Inf(1)
		if qa.GetAssignmentTimeToLive() != nil {
			b.expires = now + float64(qa.GetAssignmentTimeToLive().GetSeconds())
		}
	}
}
