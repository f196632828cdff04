package rls_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/metadata"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

const benchConfig = `{"rules": [
  {"name": "hot", "scope": "cluster", "algorithm_config": {"tokens_per_second": 1e9, "burst": 1e9}},
  {"name": "keys", "scope": "cluster", "limit_keys": ["ip:address"], "algorithm_config": {"tokens_per_second": 1e6, "burst": 1e6}},
  {"name": "llm", "scope": "cluster", "limit_keys": ["ip:address"], "algorithm_config": {"tokens_per_second": 1e6, "burst": 1e6, "cost_source": "response_header:x-usage"}}
], "settings": {"rls": {"cluster": "rls"}}}`

// BenchmarkShouldRateLimit measures decisions through gRPC against a real
// redis-server with GOMAXPROCS × 32 callers: one hot key, and 10,000 keys;
// then 10,000 keys of a rule that settles after the response, without a
// receipt id and with a new one per call, as the filter sends them (the
// take also writes the stream's receipt: docs/rls.md#receipts).
// 1e9 / ns/op is decisions per second.
func BenchmarkShouldRateLimit(b *testing.B) {
	srv := redistest.Start(b)
	store := newStore(b, []string{srv.Addr}, false, time.Second)
	e := startServer(b, benchConfig, store)
	for _, tc := range []struct {
		name, rule string
		keys       int64
		receipt    bool
	}{{"hot-key", "hot", 1, false}, {"10k-keys", "keys", 10000, false},
		{"settling-10k-keys", "llm", 10000, false}, {"settling-10k-keys-receipt", "llm", 10000, true}} {
		b.Run(tc.name, func(b *testing.B) {
			var n atomic.Int64
			if _, err := srv.Do("CONFIG", "RESETSTAT"); err != nil {
				b.Fatal(err)
			}
			defer reportScriptTime(b, srv)
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ctx := context.Background()
					d := ours("hot", "", 0)
					if tc.keys > 1 {
						i := n.Add(1)
						d = ours(tc.rule, fmt.Sprintf("10.0.%d.%d", i%tc.keys/256, i%tc.keys%256), 0)
						if tc.receipt {
							ctx = metadata.AppendToOutgoingContext(ctx, rlscontract.ReceiptHeader, fmt.Sprintf("%016x", i|1<<60))
						}
					}
					resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
						Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Errorf("%v %v", resp, err)
						return
					}
				}
			})
		})
	}
}

// reportScriptTime reports the microseconds Redis spent per EVALSHA since
// the last CONFIG RESETSTAT (INFO commandstats): the scripts' own cost,
// which the machine's other load disturbs less than the time per call.
func reportScriptTime(b *testing.B, srv *redistest.Server) {
	v, err := srv.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	m := regexp.MustCompile(`cmdstat_evalsha:calls=\d+,usec=\d+,usec_per_call=([0-9.]+)`).FindStringSubmatch(v.(string))
	if m == nil {
		b.Fatalf("no evalsha in INFO commandstats")
	}
	us, _ := strconv.ParseFloat(m[1], 64)
	b.ReportMetric(us, "redis-µs/evalsha")
}

// allow is a Runner that admits everything without Redis, to measure the
// server's own work.
type allow struct{}

func (allow) Run(_ context.Context, ops []redisstore.Op) []redisstore.Outcome {
	out := make([]redisstore.Outcome, len(ops))
	for i := range out {
		out[i] = redisstore.Outcome{Allowed: true, Tokens: 5}
		if q := ops[i].Quota; q != nil {
			// What internal/service/redisstore/quota.lua answers: the units used and the limit.
			out[i].Quota = &redisstore.QuotaResult{Used: 5, Limit: q.Limit}
		}
	}
	return out
}

// BenchmarkServerDecide is ShouldRateLimit without gRPC or Redis: the
// service's own cost per decision (two descriptors, headers on), with
// the incoming metadata grpc-go gives a call from Envoy.
func BenchmarkServerDecide(b *testing.B) {
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		b.Fatal(err)
	}
	srv := rls.NewServer(cfg, allow{}, rls.NewMetrics(cfg))
	req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		ours("keys", "203.0.113.7", 0), ours("hot", "", 0)}}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(
		":authority", "rls", "content-type", "application/grpc", "user-agent", "envoy/1.36",
		"te", "trailers", "x-envoy-internal", "true", "x-request-id", "0f6a3c2e-5b1d-4c8e-9a7f-2d4e6b8c0a1f"))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := srv.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

const quotaBenchConfig = `{"rules": [
  {"name": "bucket", "scope": "cluster", "limit_keys": ["ip:address"], "algorithm_config": {"tokens_per_second": 1e6, "burst": 1e6}},
  {"name": "quota", "scope": "cluster", "limit_keys": ["ip:address"], "algorithm": "quota",
   "algorithm_config": {"limit": 1e12, "period": "month", "time_zone": "Europe/Paris", "thresholds": [0.8, 0.95]}}
], "settings": {"rls": {"cluster": "rls"}}}`

// redisMicrosPerCall returns Redis's own microseconds per EVALSHA since
// the last CONFIG RESETSTAT (INFO commandstats).
func redisMicrosPerCall(b *testing.B, srv *redistest.Server) float64 {
	b.Helper()
	v, err := srv.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(v.(string), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:"); ok {
			for _, f := range strings.Split(rest, ",") {
				if n, ok := strings.CutPrefix(f, "usec_per_call="); ok {
					x, _ := strconv.ParseFloat(n, 64)
					return x
				}
			}
		}
	}
	return 0
}

// BenchmarkQuotaDecision compares, side by side in one run, a quota
// decision with a token-bucket decision on a real redis-server, 10,000
// keys: through gRPC (the service's whole path, GOMAXPROCS × 32 callers),
// and through the store alone, where redis-µs/op is Redis's own time per
// script call (INFO commandstats). "token-bucket" reads its key's
// override in the same call, as every cluster rule's bucket does;
// "token-bucket-no-override" is the script as it was, to measure that
// read.
func BenchmarkQuotaDecision(b *testing.B) {
	srv := redistest.Start(b)
	store := newStore(b, []string{srv.Addr}, false, time.Second)
	e := startServer(b, quotaBenchConfig, store)
	ip := func(i int64) string { return fmt.Sprintf("10.0.%d.%d", i/256%40, i%256) }
	for _, rule := range []string{"token-bucket", "quota"} {
		name := map[string]string{"token-bucket": "bucket", "quota": "quota"}[rule]
		b.Run("grpc/"+rule, func(b *testing.B) {
			var n atomic.Int64
			srv.MustDo("CONFIG", "RESETSTAT")
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
						Descriptors: []*ratelimitv3.RateLimitDescriptor{ours(name, ip(n.Add(1)), 0)}})
					if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
						b.Errorf("%v %v", resp, err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(redisMicrosPerCall(b, srv), "redis-µs/op")
		})
	}
	// The service's own work, without gRPC or Redis (as
	// BenchmarkServerDecide): the store answers at once.
	cfg, err := rls.ParseConfig([]byte(quotaBenchConfig))
	if err != nil {
		b.Fatal(err)
	}
	own := rls.NewServer(cfg, allow{}, rls.NewMetrics(cfg))
	for _, rule := range []string{"token-bucket", "quota"} {
		name := map[string]string{"token-bucket": "bucket", "quota": "quota"}[rule]
		b.Run("service/"+rule, func(b *testing.B) {
			req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours(name, "203.0.113.7", 0)}}
			b.ReportAllocs()
			for b.Loop() {
				if resp, err := own.ShouldRateLimit(context.Background(), req); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					b.Fatal(resp, err)
				}
			}
		})
	}
	for _, tc := range []struct {
		name string
		op   func(key string) redisstore.Op
	}{
		{"token-bucket-no-override", func(k string) redisstore.Op {
			return redisstore.Op{Key: redisstore.BucketKey("bucket", k), Rate: 1e6, Burst: 1e6, Cost: 1}
		}},
		{"token-bucket", func(k string) redisstore.Op {
			return redisstore.Op{Key: redisstore.BucketKey("bucket", k), Rate: 1e6, Burst: 1e6, Cost: 1, Override: true}
		}},
		{"quota", func(k string) redisstore.Op {
			return redisstore.Op{Key: redisstore.QuotaKey("quota", k, 1777586400), Cost: 1, Quota: &redisstore.QuotaOp{
				Override: redisstore.OverrideKey("quota", k), Limit: 1e12, TTL: 2678400, Thresholds: []float64{0.8, 0.95},
				Args: []string{"1e+12", "0.8", "0.95"}}} // as the service formats them once per rule
		}},
	} {
		b.Run("store/"+tc.name, func(b *testing.B) {
			var n atomic.Int64
			srv.MustDo("CONFIG", "RESETSTAT")
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if out := store.Run(ctx, []redisstore.Op{tc.op(ip(n.Add(1)))}); out[0].Err != nil || !out[0].Allowed {
						b.Errorf("%+v", out[0])
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(redisMicrosPerCall(b, srv), "redis-µs/op")
		})
	}
}
