package rls_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/redistest"
)

const benchConfig = `{"rules": [
  {"name": "hot", "scope": "cluster", "algorithm_config": {"tokens_per_second": 1e9, "burst": 1e9}},
  {"name": "keys", "scope": "cluster", "limit_keys": ["ip:address"], "algorithm_config": {"tokens_per_second": 1e6, "burst": 1e6}}
], "settings": {"rls": {"cluster": "rls"}}}`

// BenchmarkShouldRateLimit measures decisions through gRPC against a real
// redis-server with GOMAXPROCS × 32 callers: one hot key, and 10,000 keys.
// 1e9 / ns/op is decisions per second.
func BenchmarkShouldRateLimit(b *testing.B) {
	srv := redistest.Start(b)
	store := newStore(b, []string{srv.Addr}, false, time.Second)
	e := startServer(b, benchConfig, store)
	for _, tc := range []struct {
		name string
		keys int64
	}{{"hot-key", 1}, {"10k-keys", 10000}} {
		b.Run(tc.name, func(b *testing.B) {
			var n atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					d := ours("hot", "", 0)
					if tc.keys > 1 {
						i := n.Add(1) % tc.keys
						d = ours("keys", fmt.Sprintf("10.0.%d.%d", i/256, i%256), 0)
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
