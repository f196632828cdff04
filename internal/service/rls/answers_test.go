package rls_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

func headerOK(r *rlsv3.RateLimitResponse, name string) (string, bool) {
	for _, h := range r.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), name) {
			return h.GetValue(), true
		}
	}
	return "", false
}

func readyStore(t *testing.T, addr string) *redisstore.Store {
	t.Helper()
	st, err := redisstore.New(redisstore.Options{Addrs: []string{addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	deadline := time.Now().Add(10 * time.Second)
	for st.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis does not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return st
}

// TestAnswersIssue23 pins the answers issue 23 (item 6) found wrong.
func TestAnswersIssue23(t *testing.T) {
	redis := redistest.Start(t)
	e := startServer(t, testConfig, readyStore(t, redis.Addr))

	t.Run("a cost above the burst is not told to retry", func(t *testing.T) {
		// Was: remaining 2, retry-after 1073741824 and ratelimit-reset 0
		// together, and duration_until_reset 2^30 s.
		r := ask(t, e.client, "tokengate", ours("narrow", "big", 5))
		if r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("overall %v, want OVER_LIMIT", r.OverallCode)
		}
		if v, ok := headerOK(r, "retry-after"); ok {
			t.Errorf("retry-after %q: a cost above the burst never passes", v)
		}
		if v, _ := headerOK(r, "ratelimit-remaining"); v != "2" {
			t.Errorf("ratelimit-remaining %q, want 2 (the bucket is full)", v)
		}
		if d := r.Statuses[0].GetDurationUntilReset(); d.AsDuration() != 0 {
			t.Errorf("duration_until_reset %v, want 0 (the bucket is full)", d.AsDuration())
		}
	})

	t.Run("the descriptor's limit override is enforced", func(t *testing.T) {
		// Was: the rule's burst of 2 admitted where the override said 1
		// per minute.
		d := native("remote_address", "198.51.100.9")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
		first, second := ask(t, e.client, "edge", d), ask(t, e.client, "edge", d)
		if first.OverallCode != rlsv3.RateLimitResponse_OK || second.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("codes %v, %v, want OK then OVER_LIMIT (1 per minute)", first.OverallCode, second.OverallCode)
		}
		l := first.Statuses[0].GetCurrentLimit()
		if l.GetRequestsPerUnit() != 1 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || l.GetName() != "edge-ip" {
			t.Errorf("current_limit %v, want 1/MINUTE named edge-ip", l)
		}
		// The rule's own bucket for the address is untouched.
		if r := ask(t, e.client, "edge", native("remote_address", "198.51.100.9")); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Errorf("without the override: %v, want OK", r.OverallCode)
		}
	})

	t.Run("the domain selects the configuration", func(t *testing.T) {
		// Was: every domain drew from the rule's bucket.
		for i := range 4 {
			if r := ask(t, e.client, "elsewhere", ours("narrow", "d", 0)); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
				t.Fatalf("call %d in another domain: %v, want OK and no limit", i, r)
			}
		}
		for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
			if r := ask(t, e.client, "tokengate", ours("narrow", "d", 0)); r.OverallCode != want {
				t.Fatalf("call %d in the configured domain: %v, want %v", i, r.OverallCode, want)
			}
		}
	})
}

// TestDropinTokenBucketStatuses: with a drop-in configuration in token
// buckets, limit_remaining is the bucket's whole tokens and
// duration_until_reset the time until it is full again, for admitted and
// rejected calls alike (a rejected call took nothing). 3 per minute refill
// one token every 20 s; the bounds allow up to 20 s between calls.
func TestDropinTokenBucketStatuses(t *testing.T) {
	redis := redistest.Start(t)
	cfg, err := rls.NewDropinConfig([]*rls.Domain{{Name: "d", Descriptors: []*rls.Descriptor{
		{Key: "user", RateLimit: &rls.RateLimit{RequestsPerUnit: 3, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, Name: "per-user"}},
	}}}, rls.DropinOptions{Headers: &rls.HeaderNames{Limit: "L", Remaining: "R", Reset: "T"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := rls.NewServer(cfg, readyStore(t, redis.Addr), rls.NewMetrics(cfg))
	c := serveClient(t, srv)
	for i, want := range []struct {
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
		fullIn    time.Duration // at most, and more than 20 s less
	}{
		{rlsv3.RateLimitResponse_OK, 2, 20 * time.Second},
		{rlsv3.RateLimitResponse_OK, 1, 40 * time.Second},
		{rlsv3.RateLimitResponse_OK, 0, 60 * time.Second},
		{rlsv3.RateLimitResponse_OVER_LIMIT, 0, 60 * time.Second},
	} {
		r := ask(t, c, "d", native("user", "u"))
		st := r.Statuses[0]
		d := st.GetDurationUntilReset().AsDuration()
		if r.OverallCode != want.code || st.Code != want.code || st.LimitRemaining != want.remaining ||
			d > want.fullIn || d <= want.fullIn-20*time.Second {
			t.Errorf("step %d: got %v remaining %d reset %v, want %v remaining %d reset in (%v, %v]",
				i, st.Code, st.LimitRemaining, d, want.code, want.remaining, want.fullIn-20*time.Second, want.fullIn)
		}
		if l := st.GetCurrentLimit(); l.GetRequestsPerUnit() != 3 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || l.GetName() != "per-user" {
			t.Errorf("step %d: current_limit %v", i, l)
		}
		if v, _ := headerOK(r, "R"); v != strconv.FormatUint(uint64(want.remaining), 10) {
			t.Errorf("step %d: remaining header %q, want %d", i, v, want.remaining)
		}
	}
}

// serveClient serves srv over gRPC on 127.0.0.1 and returns a client.
func serveClient(t *testing.T, srv *rls.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	gs := rls.NewGRPCServer(srv, 0)
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
	return rlsv3.NewRateLimitServiceClient(conn)
}

// TestStoreUnixSocket: Network "unix" reaches Redis over its Unix socket
// (envoyproxy/ratelimit's default, REDIS_SOCKET_TYPE=unix).
func TestStoreUnixSocket(t *testing.T) {
	sock := t.TempDir() + "/redis.sock"
	redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
	st, err := redisstore.New(redisstore.Options{Addrs: []string{sock}, Network: "unix", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := st.Ping(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PING over %s: %v", sock, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	out := st.Run(context.Background(), []redisstore.Op{{Key: "tb:{unix:x}", Rate: 1, Burst: 2, Cost: 1}})
	if out[0].Err != nil || !out[0].Allowed || out[0].Tokens != 1 {
		t.Errorf("take over the socket: %+v", out[0])
	}
}
