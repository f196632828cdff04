package rlqs_test

import (
	"context"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rlqs"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

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
