package rls_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// testConfig has cluster rules the filter would ask about, a shadow
// policy, and rls_descriptors for Envoy's own filter.
const testConfig = `{
  "bundle_version": 1,
  "settings": {"rls": {"cluster": "rls", "domain": "tokengate"}},
  "policies": [
    {"id": "main", "spec": {"rules": [
      {"name": "hot", "scope": "cluster", "algorithm_config": {"tokens_per_second": 20, "burst": 40}},
      {"name": "keys", "scope": "cluster", "limit_keys": ["ip:address"], "algorithm_config": {"tokens_per_second": 0.000001, "burst": 3}},
      {"name": "wide", "scope": "cluster", "algorithm_config": {"tokens_per_second": 0.000001, "burst": 10}},
      {"name": "narrow", "scope": "cluster", "algorithm_config": {"tokens_per_second": 0.000001, "burst": 2}},
      {"name": "wide2", "scope": "cluster", "algorithm_config": {"tokens_per_second": 0.000001, "burst": 100}},
      {"name": "narrow2", "scope": "cluster", "algorithm_config": {"tokens_per_second": 0.000001, "burst": 10}},
      {"name": "local", "algorithm_config": {"tokens_per_second": 1, "burst": 1}}
    ]}},
    {"id": "watch", "spec": {"mode": "shadow", "rules": [
      {"name": "watched", "scope": "cluster", "algorithm_config": {"tokens_per_second": 0.000001, "burst": 1}}
    ]}}
  ],
  "rls_descriptors": [{"domain": "edge", "descriptors": [
    {"key": "remote_address", "rule": {"name": "edge-ip", "algorithm_config": {"tokens_per_second": 0.000001, "burst": 2}}},
    {"key": "generic_key", "value": "api", "descriptors": [
      {"key": "header_match", "value": "post", "rule": {"name": "api-post", "algorithm_config": {"tokens_per_second": 0.000001, "burst": 1}}}
    ]}
  ]}]
}`

type env struct {
	client rlsv3.RateLimitServiceClient
	srv    *rls.Server
	m      *rls.Metrics
}

// startServer serves cfg on 127.0.0.1 over gRPC with store.
func startServer(t testing.TB, cfgJSON string, store rls.Runner) env {
	t.Helper()
	cfg, err := rls.ParseConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	m := rls.NewMetrics(cfg)
	srv := rls.NewServer(cfg, store, m)
	// These tests are the proxies' calls: writes are open to them
	// (trust_test.go tests who may write).
	srv.SetWriteAuth(rls.WriteAuth{Open: true})
	gs := rls.NewGRPCServer(srv, rls.DefaultStreamWorkers)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return env{client: rlsv3.NewRateLimitServiceClient(conn), srv: srv, m: m}
}

// backend is a Redis deployment the server tests run against.
type backend struct {
	name    string
	addrs   []string
	cluster bool
	single  *redistest.Server
	c       *redistest.Cluster
}

// forEachBackend runs f against one redis-server and against a 3-master
// Redis Cluster, each started once for all of f's subtests.
func forEachBackend(t *testing.T, f func(t *testing.T, b *backend)) {
	t.Run("single", func(t *testing.T) {
		s := redistest.Start(t)
		f(t, &backend{name: "single", addrs: []string{s.Addr}, single: s})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		f(t, &backend{name: "cluster", addrs: c.Addrs(), cluster: true, c: c})
	})
}

// ours is the descriptor the filter sends for a cluster rule.
func ours(rule, key string, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
		{Key: rlscontract.RuleKey, Value: rule}, {Key: rlscontract.CompositeKey, Value: key}}}
	if hits > 0 {
		d.HitsAddend = wrapperspb.UInt64(hits)
	}
	return d
}

func native(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// askGo is ask for goroutines, which must not call t.Fatal: it reports a
// failed call with t.Errorf and returns nil.
func askGo(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Errorf("ShouldRateLimit: %v", err)
		return nil
	}
	return resp
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

func TestServer(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b *backend) {
		store := newStore(t, b.addrs, b.cluster, 2*time.Second)
		e := startServer(t, testConfig, store)
		t.Run("hammer one key", func(t *testing.T) { hammerOneKey(t, e) })
		t.Run("many keys", func(t *testing.T) { manyKeys(t, e) })
		t.Run("all or nothing", func(t *testing.T) { allOrNothing(t, e) })
		t.Run("all or nothing, concurrent", func(t *testing.T) { allOrNothingConcurrent(t, e) })
		t.Run("shadow", func(t *testing.T) { shadow(t, e) })
		t.Run("envoy native descriptors", func(t *testing.T) { envoyNative(t, e) })
		t.Run("hits_addend", func(t *testing.T) { hitsAddend(t, e) })
		if b.cluster {
			t.Run("master killed", func(t *testing.T) { clusterMasterKilled(t, b.c) })
		}
	})
}

// hammerOneKey: goroutines × requests on one bucket (rate 20/s, burst 40)
// admit at most burst + rate × elapsed + 1, and at least burst + rate ×
// (the time certainly inside the run) − 1: the requests never stop, so
// tokens never pile up unused.
func hammerOneKey(t *testing.T, e env) {
	const workers, per = 8, 60
	var admitted atomic.Int64
	var firstDone, lastSent atomic.Int64 // unix nanos
	firstDone.Store(1 << 62)
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				sent := time.Now().UnixNano()
				resp := askGo(t, e.client, "tokengate", ours("hot", "", 0))
				if resp == nil {
					return
				}
				if i == per-1 {
					for v := lastSent.Load(); sent > v && !lastSent.CompareAndSwap(v, sent); v = lastSent.Load() {
					}
				}
				if i == 0 {
					d := time.Now().UnixNano()
					for v := firstDone.Load(); d < v && !firstDone.CompareAndSwap(v, d); v = firstDone.Load() {
					}
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	inner := max(float64(lastSent.Load()-firstDone.Load())/1e9, 0)
	hi := 40 + 20*elapsed + 1
	lo := 40 + 20*inner - 2
	got := float64(admitted.Load())
	t.Logf("%d requests in %.3f s: admitted %v, bounds [%.1f, %.1f]", workers*per, elapsed, got, lo, hi)
	if got > hi {
		t.Errorf("over-admission: admitted %v > burst + rate × elapsed + 1 = %.1f", got, hi)
	}
	if got < lo {
		t.Errorf("under-admission: admitted %v < %.1f", got, lo)
	}
}

// manyKeys: 300 identities of burst 3 (a refill of one token takes 1e6 s),
// 5 requests each from several goroutines: exactly 3 admitted per key.
func manyKeys(t *testing.T, e env) {
	const keys, per = 300, 5
	counts := make([]atomic.Int32, keys)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := w; k < keys; k += 6 {
				for range per {
					resp := askGo(t, e.client, "tokengate", ours("keys", fmt.Sprintf("10.0.%d.%d", k/256, k%256), 0))
					if resp == nil {
						return
					}
					if resp.OverallCode == rlsv3.RateLimitResponse_OK {
						counts[k].Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	for k := range counts {
		if got := counts[k].Load(); got != 3 {
			t.Errorf("key %d: admitted %d of %d, want 3", k, got, per)
		}
	}
}

// allOrNothing: wide (burst 10) and narrow (burst 2) in one request; the
// third request is rejected by narrow and takes nothing from wide.
func allOrNothing(t *testing.T, e env) {
	both := func() *rlsv3.RateLimitResponse {
		return ask(t, e.client, "tokengate", ours("wide", "", 0), ours("narrow", "", 0))
	}
	for i := range 2 {
		if r := both(); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v, want OK", i, r.OverallCode)
		}
	}
	r := both()
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third request: %v, want OVER_LIMIT", r.OverallCode)
	}
	if r.Statuses[0].Code != rlsv3.RateLimitResponse_OK || r.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("statuses: %v", r.Statuses)
	}
	if got := r.Statuses[0].LimitRemaining; got != 8 {
		t.Errorf("wide after the refund: limit_remaining %d, want 8", got)
	}
	if got := r.Statuses[1].DurationUntilReset.AsDuration(); got < 999999*time.Second || got > 1000001*time.Second {
		t.Errorf("narrow: duration_until_reset %v, want the 1e6 s one token takes", got)
	}
	// The headers the filter would send for this rejection.
	wantList := `"wide";r=8;t=2000000, "narrow";r=0;t=1000000`
	if got := header(r, "ratelimit"); got != wantList {
		t.Errorf("ratelimit: got %q, want %q", got, wantList)
	}
	if got := header(r, "ratelimit-policy"); got != `"wide";q=10;w=10000000, "narrow";q=2;w=2000000` {
		t.Errorf("ratelimit-policy: got %q", got)
	}
	if got := header(r, "ratelimit-limit"); got != "2" {
		t.Errorf("ratelimit-limit: got %q, want narrow's 2", got)
	}
	if got := header(r, "retry-after"); got != "1000000" {
		t.Errorf("retry-after: got %q, want narrow's 1000000 (one token at 1e-6 a second)", got)
	}
	// wide still holds 8: exactly 8 more requests pass it alone.
	for i := range 8 {
		if r := ask(t, e.client, "tokengate", ours("wide", "", 0)); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("wide alone, request %d: %v", i, r.OverallCode)
		}
	}
	if r := ask(t, e.client, "tokengate", ours("wide", "", 0)); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("wide alone, 9th request: %v, want OVER_LIMIT", r.OverallCode)
	}
}

// allOrNothingConcurrent: 160 requests from 8 goroutines on wide2 (burst
// 100) and narrow2 (burst 10): exactly 10 pass, and wide2 lost exactly
// those 10 tokens, whatever the interleaving of takes and refunds.
func allOrNothingConcurrent(t *testing.T, e env) {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				r := askGo(t, e.client, "tokengate", ours("wide2", "", 0), ours("narrow2", "", 0))
				if r == nil {
					return
				}
				if r.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got := admitted.Load(); got != 10 {
		t.Fatalf("admitted %d, want narrow2's burst 10", got)
	}
	r := ask(t, e.client, "tokengate", ours("wide2", "", 0))
	if got := r.Statuses[0].LimitRemaining; got != 89 {
		t.Fatalf("wide2 after 10 admitted requests and one more: %d tokens left, want 89", got)
	}
}

// shadow: a shadow rule over its limit says OVER_LIMIT in its status and
// never in overall_code, and adds no headers.
func shadow(t *testing.T, e env) {
	if r := ask(t, e.client, "tokengate", ours("watched", "", 0)); r.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first: %v", r.Statuses[0].Code)
	}
	r := ask(t, e.client, "tokengate", ours("watched", "", 0))
	if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second: overall %v, status %v; want OK, OVER_LIMIT", r.OverallCode, r.Statuses[0].Code)
	}
	if len(r.ResponseHeadersToAdd) != 0 {
		t.Fatalf("shadow rule added headers: %v", r.ResponseHeadersToAdd)
	}
	if !strings.Contains(e.m.String(), `tokengate_rls_decisions_total{code="shadow_over_limit",rule="watched"} 1`) {
		t.Errorf("metrics do not count the shadow rejection:\n%s", e.m.String())
	}
}

// envoyNative sends what Envoy's envoy.filters.http.ratelimit sends for
// remote_address, and generic_key + header_value_match actions.
func envoyNative(t *testing.T, e env) {
	ip := native("remote_address", "192.0.2.7")
	for i := range 2 {
		if r := ask(t, e.client, "edge", ip); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, r.OverallCode)
		}
	}
	r := ask(t, e.client, "edge", ip)
	if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].CurrentLimit.GetName() != "edge-ip" {
		t.Fatalf("third: %v", r)
	}
	// Another address has a bucket of its own.
	if r := ask(t, e.client, "edge", native("remote_address", "192.0.2.8")); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("second address: %v", r.OverallCode)
	}
	post := native("generic_key", "api", "header_match", "post")
	if r := ask(t, e.client, "edge", post); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("api post: %v", r.OverallCode)
	}
	if r := ask(t, e.client, "edge", post); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("api post again: %v", r.OverallCode)
	}
	// Unmatched: another domain, another value, a prefix of a path, an
	// unknown rule name: OK, not limited, no current_limit.
	for _, tc := range []struct {
		domain string
		d      *ratelimitv3.RateLimitDescriptor
	}{
		{"other", native("remote_address", "192.0.2.7")},
		{"edge", native("generic_key", "web", "header_match", "post")},
		{"edge", native("generic_key", "api")},
		{"edge", native("generic_key", "api", "header_match", "post", "extra", "x")},
		{"tokengate", ours("no-such-rule", "", 0)},
		{"tokengate", ours("local", "", 0)},
	} {
		for range 3 {
			r := ask(t, e.client, tc.domain, tc.d)
			if r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
				t.Fatalf("%s %v: %v", tc.domain, tc.d, r)
			}
		}
	}
}

// hitsAddend: the descriptor's hits_addend, else the request's, else 1.
func hitsAddend(t *testing.T, e env) {
	ctx := context.Background()
	key := "hits-" + fmt.Sprint(time.Now().UnixNano())
	resp, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", HitsAddend: 2,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("keys", key, 0)}})
	if err != nil || resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("request hits_addend 2 on burst 3: %v %v", resp, err)
	}
	resp, err = e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", HitsAddend: 2,
		Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("keys", key, 1)}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("descriptor hits_addend 1 over the request's 2: %v %v", resp, err)
	}
	// A cost above burst is never admitted.
	resp, err = e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("keys", key+"x", 4)}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("cost 4 on burst 3: %v %v", resp, err)
	}
	// Invalid requests.
	for _, req := range []*rlsv3.RateLimitRequest{
		{Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("keys", key, 0)}},
		{Domain: "tokengate"},
	} {
		if _, err := e.client.ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%v: got %v, want InvalidArgument", req, err)
		}
	}
}
