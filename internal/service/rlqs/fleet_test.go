package rlqs_test

import (
	"context"
	"math"
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rlqs"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// The model of Envoy's rate_limit_quota filter below is written from the
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

// countingStore counts the share requests that reach Redis and the
// script calls that carry them.
type countingStore struct {
	*redisstore.Store
	ops, calls atomic.Int64
}

func (c *countingStore) Share(ctx context.Context, batches []redisstore.ShareBatch) [][]redisstore.ShareResult {
	for _, b := range batches {
		c.ops.Add(int64(len(b.Ops)))
	}
	c.calls.Add(int64(len(batches)))
	return c.Store.Share(ctx, batches)
}

const fleetConfig = `{"rules": [{"name": "api", "scope": "cluster", "limit_keys": ["header:x-tenant"],
  "algorithm_config": {"tokens_per_second": 100, "burst": 100}}],
  "settings": {"rls": {"cluster": "tokengate_rls", "domain": "edge"}}}`

const (
	rate, burst = 100.0, 100.0
	tick        = 0.1 // seconds of simulated time
)

type fleet struct {
	srv    *rlqs.Server
	store  *countingStore
	clk    *clock
	envoys []*modelEnvoy
	stop   context.CancelFunc
	addr   string
	// at, when set, runs at every tick before the Envoys (k: the tick).
	at func(k int, now float64)
}

func startFleet(t *testing.T, n int) *fleet { t.Helper(); return startFleetConfig(t, n, fleetConfig) }

// startFleetConfig starts n model Envoys against a server of configuration
// cfgJSON (rule "api", domain "edge").
func startFleetConfig(t *testing.T, n int, cfgJSON string) *fleet {
	t.Helper()
	redis := redistest.Start(t)
	st, err := redisstore.New(redisstore.Options{Addrs: []string{redis.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	deadline := time.Now().Add(10 * time.Second)
	for st.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("no PING answer from Redis within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cfg, err := rls.ParseConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{store: &countingStore{Store: st}, clk: &clock{}}
	f.clk.micros.Store(1_767_000_000 * 1e6)
	stop, cancel := context.WithCancel(context.Background())
	f.stop = cancel
	f.srv = rlqs.New(stop, cfg.Rules(), f.store, rlqs.Options{Now: f.clk.now})
	// The gRPC server tokengate-rls runs (its codec, its stream workers).
	gs := rls.NewGRPCServer(rls.NewServer(cfg, st, rls.NewMetrics(cfg)), 4)
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, f.srv)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(func() { cancel(); gs.Stop() })
	f.addr = l.Addr().String()
	for range n {
		f.envoys = append(f.envoys, &modelEnvoy{t: t, stream: f.dial(t), domain: "edge", buckets: map[string]*modelBucket{}})
	}
	return f
}

// dial opens a new stream on a new connection (one Envoy process).
func (f *fleet) dial(t *testing.T) rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run drives the fleet for secs of simulated time, Envoy i offering
// demand(i, now) requests per second to one bucket, and returns the
// requests admitted at each tick, by Envoy.
func (f *fleet) run(secs float64, demand func(i int, now float64) float64) [][]int {
	id := map[string]string{rlqs.RuleKey: "api", "x-tenant": "acme"}
	ticks := int(secs / tick)
	out := make([][]int, ticks)
	acc := make([]float64, len(f.envoys))
	start := f.clk.sec()
	for k := range ticks {
		now := start + float64(k)*tick
		f.clk.micros.Store(int64(math.Round(now * 1e6)))
		out[k] = make([]int, len(f.envoys))
		if f.at != nil {
			f.at(k, now-start)
		}
		for i, e := range f.envoys {
			e.tick(now)
			acc[i] += demand(i, now-start) * tick
			for ; acc[i] >= 1; acc[i]-- {
				if e.request(now, id) {
					out[k][i]++
				}
			}
		}
	}
	f.clk.micros.Store(int64(math.Round((start + float64(ticks)*tick) * 1e6)))
	return out
}

// checkBound fails when the fleet admitted more than burst + rate*W in any
// window of W seconds (ticks k..k+W/tick span W seconds).
func checkBound(t *testing.T, adm [][]int) {
	t.Helper()
	total := make([]int, len(adm)+1) // prefix sums
	for k, row := range adm {
		s := 0
		for _, v := range row {
			s += v
		}
		total[k+1] = total[k] + s
	}
	for _, w := range []int{1, 10, 50, 100, len(adm) - 1} { // ticks
		bound := burst + rate*float64(w)*tick
		for k := 0; k+w < len(adm); k++ {
			if got := total[k+w+1] - total[k]; float64(got) > bound+1e-9 {
				t.Fatalf("admitted %d in the %.1f s from %.1f s: above burst + rate×W = %.1f", got, float64(w)*tick, float64(k)*tick, bound)
			}
		}
	}
}

func sumRange(adm [][]int, i int, from, to float64) int {
	s := 0
	for k := int(from / tick); k < int(to/tick) && k < len(adm); k++ {
		s += adm[k][i]
	}
	return s
}

// TestFleetEqualDemand: N Envoys each offering twice their fair share; the
// fleet stays within the bound in every window, and from the third report
// interval on each admits at least 75 % of its fair share (rate/N).
func TestFleetEqualDemand(t *testing.T) {
	for _, n := range []int{3, 10} {
		t.Run(map[int]string{3: "envoys=3", 10: "envoys=10"}[n], func(t *testing.T) {
			f := startFleet(t, n)
			const secs = 60.0
			adm := f.run(secs, func(int, float64) float64 { return 2 * rate / float64(n) })
			checkBound(t, adm)
			from := 3.0 * reportInterval
			fair := rate / float64(n) * (secs - from)
			for i := range f.envoys {
				if got := float64(sumRange(adm, i, from, secs)); got < 0.75*fair {
					t.Errorf("envoy %d admitted %.0f in [%.0f s, %.0f s): below 75 %% of its fair share %.0f", i, got, from, secs, fair)
				}
			}
			checkCost(t, f, secs)
		})
	}
}

// TestFleetSkewedDemand: N Envoys with demand skewed 100:1, one going idle
// halfway; within the bound in every window, the fleet uses most of the
// rate, every Envoy with demand admits some, and the idle one's bucket is
// abandoned.
func TestFleetSkewedDemand(t *testing.T) {
	for _, n := range []int{3, 10} {
		t.Run(map[int]string{3: "envoys=3", 10: "envoys=10"}[n], func(t *testing.T) {
			f := startFleet(t, n)
			const secs, idleAt = 80.0, 40.0
			d := func(i int, now float64) float64 {
				if i == n-1 && now >= idleAt {
					return 0
				}
				return 2 * rate / math.Pow(100, float64(i)/float64(n-1))
			}
			adm := f.run(secs, d)
			checkBound(t, adm)
			from := 3.0 * reportInterval
			all := 0
			for i := range f.envoys {
				got := sumRange(adm, i, from, idleAt)
				all += got
				if got == 0 {
					t.Errorf("envoy %d (demand %.1f/s) admitted nothing in [%.0f s, %.0f s)", i, d(i, from), from, idleAt)
				}
			}
			if want := 0.75 * rate * (idleAt - from); float64(all) < want {
				t.Errorf("fleet admitted %d in [%.0f s, %.0f s), want at least %.0f (75 %% of the rate)", all, from, idleAt, want)
			}
			if e := f.envoys[n-1]; e.abandons == 0 || len(e.buckets) != 0 {
				t.Errorf("idle envoy: %d abandons, %d buckets left; want its bucket abandoned", e.abandons, len(e.buckets))
			}
			// The heaviest Envoy follows demand: after the idle one left,
			// it gets more than before.
			before := sumRange(adm, 0, idleAt-10, idleAt)
			after := sumRange(adm, 0, secs-10, secs)
			if after < before {
				t.Errorf("envoy 0 admitted %d in the last 10 s, %d in the 10 s before the idle one left; want no less", after, before)
			}
			checkCost(t, f, secs)
		})
	}
}

// checkCost: no call on the request path, and at most one Redis script per
// Envoy per bucket per report.
func checkCost(t *testing.T, f *fleet, secs float64) {
	t.Helper()
	maxMsgs := int(secs/reportInterval) + 2 // periodic reports + the subscription
	for i, e := range f.envoys {
		if e.sent > maxMsgs {
			t.Errorf("envoy %d sent %d messages in %.0f s; want at most %d (one per report interval)", i, e.sent, secs, maxMsgs)
		}
	}
	if ops, reps := f.store.ops.Load(), int64(f.srv.Reports.Load()); ops > reps {
		t.Errorf("%d share scripts for %d bucket reports; want at most one each", ops, reps)
	}
}

// TestShutdownExpiresAssignments: when the server stops, every Envoy gets
// TTL 0 for each of its buckets before the stream ends.
func TestShutdownExpiresAssignments(t *testing.T) {
	f := startFleet(t, 3)
	f.run(12, func(int, float64) float64 { return 20 })
	f.stop()
	for i, e := range f.envoys {
		r := e.recv()
		if len(r.GetBucketAction()) != len(e.buckets) || len(e.buckets) == 0 {
			t.Fatalf("envoy %d: %d actions for %d buckets", i, len(r.GetBucketAction()), len(e.buckets))
		}
		for _, a := range r.GetBucketAction() {
			if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive(); ttl == nil || ttl.AsDuration() != 0 {
				t.Errorf("envoy %d: action %v, want an assignment with TTL 0", i, a)
			}
		}
		if _, err := e.stream.Recv(); err == nil {
			t.Errorf("envoy %d: the stream goes on after the TTL 0", i)
		}
	}
}

// TestFleetBurst: N Envoys idle along at a trickle, their buckets full, then
// all at once offer ten times the rate, unequally: the new, larger shares start full,
// and the tokens they start with were taken from the bucket, so no window
// holds more than burst + rate×W.
func TestFleetBurst(t *testing.T) {
	for _, n := range []int{3, 10} {
		t.Run(map[int]string{3: "envoys=3", 10: "envoys=10"}[n], func(t *testing.T) {
			f := startFleet(t, n)
			adm := f.run(50, func(i int, now float64) float64 {
				if now < 23 {
					return 2
				}
				return 10 * rate * float64(i+1) / float64(n*(n+1)/2)
			})
			checkBound(t, adm)
		})
	}
}
