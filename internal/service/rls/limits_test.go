package rls_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/rlscontract"
)

// countingRunner admits every op and counts them; while gate is not nil
// each call first waits for it (after saying so on entered).
type countingRunner struct {
	mu      sync.Mutex
	ops     int
	gate    chan struct{}
	entered chan struct{}
}

func (c *countingRunner) Run(_ context.Context, ops []redisstore.Op) []redisstore.Outcome {
	c.mu.Lock()
	c.ops += len(ops)
	gate := c.gate
	c.mu.Unlock()
	if gate != nil {
		c.entered <- struct{}{}
		<-gate
	}
	out := make([]redisstore.Outcome, len(ops))
	for i := range out {
		out[i] = redisstore.Outcome{Allowed: true, Tokens: 1}
	}
	return out
}

func (c *countingRunner) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops
}

// startLimited serves testConfig with lim (and its gRPC server options,
// as the daemon installs them) on 127.0.0.1.
func startLimited(t *testing.T, store rls.Runner, lim rls.Limits) rlsv3.RateLimitServiceClient {
	t.Helper()
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	srv := rls.NewServer(cfg, store, rls.NewMetrics(cfg))
	srv.SetLimits(lim)
	gs := rls.NewGRPCServer(srv, 0, lim.ServerOptions()...)
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

func hotDescs(n int) []*ratelimitv3.RateLimitDescriptor {
	ds := make([]*ratelimitv3.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = ours("hot", "", 0)
	}
	return ds
}

// TestLimitsRefuseBeforeRedis: a call past each per-call limit is refused
// with the code and the limit's name, and no op reaches the store; a call
// at the limits passes.
func TestLimitsRefuseBeforeRedis(t *testing.T) {
	lim := rls.Limits{Descriptors: 4, Entries: 3, EntryBytes: 16, MsgBytes: 4096}
	long := strings.Repeat("x", 17)
	wide := ours("hot", "", 0)
	wide.Entries = append(wide.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "a", Value: "1"}, &ratelimitv3.RateLimitDescriptor_Entry{Key: "b", Value: "2"})
	for _, tc := range []struct {
		name     string
		descs    []*ratelimitv3.RateLimitDescriptor
		wantCode codes.Code
		wantMsg  string
	}{
		{"at the limits", hotDescs(4), codes.OK, ""},
		{"descriptors", hotDescs(5), codes.InvalidArgument, "more than 4 descriptors in one call: over the limit (-max-descriptors)"},
		{"1,000 empty descriptors, under the message size", func() []*ratelimitv3.RateLimitDescriptor {
			ds := make([]*ratelimitv3.RateLimitDescriptor, 1000)
			for i := range ds {
				ds[i] = &ratelimitv3.RateLimitDescriptor{}
			}
			return ds
		}(), codes.InvalidArgument, "(-max-descriptors)"},
		{"entries", []*ratelimitv3.RateLimitDescriptor{wide}, codes.InvalidArgument, "descriptors[0]: more than 3 entries: over the limit (-max-entries)"},
		{"key", []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: long, Value: "v"}}}}, codes.InvalidArgument,
			"descriptors[0].entries[0]: key or value longer than 16 bytes: over the limit (-max-entry-bytes)"},
		{"value", []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: rlscontract.RuleKey, Value: long}}}}, codes.InvalidArgument,
			"(-max-entry-bytes)"},
		{"message", []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: strings.Repeat("v", 5000)}}}}, codes.ResourceExhausted,
			"vs. 4096)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &countingRunner{}
			client := startLimited(t, store, lim)
			_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: tc.descs})
			st := status.Convert(err)
			if st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("got %v, want %v with %q", err, tc.wantCode, tc.wantMsg)
			}
			wantOps := 0
			if tc.wantCode == codes.OK {
				wantOps = len(tc.descs)
			}
			if got := store.count(); got != wantOps {
				t.Errorf("ops sent to the store: got %d, want %d", got, wantOps)
			}
		})
	}
}

// TestLimitsAdmission: while calls in flight hold InFlight descriptors, a
// call that would go past it is refused RESOURCE_EXHAUSTED at once; one
// that fits, and every call once they end, pass.
func TestLimitsAdmission(t *testing.T) {
	store := &countingRunner{gate: make(chan struct{}), entered: make(chan struct{}, 8)}
	client := startLimited(t, store, rls.Limits{Descriptors: 4, InFlight: 6})
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Add(1)
	go func() { // 4 descriptors, held in the store
		defer wg.Done()
		_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: hotDescs(4)})
		errs <- err
	}()
	<-store.entered
	_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: hotDescs(3)})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "more than 6 descriptors in flight") ||
		!strings.Contains(st.Message(), "-max-inflight-descriptors") {
		t.Fatalf("3 more descriptors while 4 of 6 are in flight: got %v, want RESOURCE_EXHAUSTED naming the limit", err)
	}
	wg.Add(1)
	go func() { // 2 fit
		defer wg.Done()
		_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: hotDescs(2)})
		if err != nil {
			t.Errorf("2 more descriptors while 4 of 6 are in flight: %v", err)
		}
	}()
	<-store.entered
	close(store.gate)
	wg.Wait()
	if err := <-errs; err != nil {
		t.Errorf("the held call: %v", err)
	}
	if _, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: hotDescs(4)}); err != nil {
		t.Errorf("after the calls ended: %v", err)
	}
}

// TestCodecLimitsDecodeBounded: the codec of the limits decodes at most
// one descriptor past Descriptors and one entry past Entries of each,
// whatever the message holds, so a request of 100,000 descriptors costs
// what one of 5 does; within the limits it decodes what proto.Unmarshal
// does.
func TestCodecLimitsDecodeBounded(t *testing.T) {
	c := rls.NewCodecLimits(rls.Limits{Descriptors: 4, Entries: 3})
	for _, tc := range []struct {
		name                string
		descs, entries      int
		wantDescs, wantEnts int
	}{
		{"within", 4, 3, 4, 3},
		{"100,000 descriptors", 100000, 1, 5, 1},
		{"100,000 entries", 1, 100000, 1, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &rlsv3.RateLimitRequest{Domain: "tokengate"}
			for range tc.descs {
				d := &ratelimitv3.RateLimitDescriptor{}
				for range tc.entries {
					d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
				}
				req.Descriptors = append(req.Descriptors, d)
			}
			b, err := proto.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			var got rlsv3.RateLimitRequest
			if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil {
				t.Fatal(err)
			}
			if len(got.Descriptors) != tc.wantDescs || len(got.Descriptors[0].Entries) != tc.wantEnts || got.Domain != "tokengate" {
				t.Fatalf("got %d descriptors of %d entries (domain %q), want %d of %d", len(got.Descriptors), len(got.Descriptors[0].Entries), got.Domain, tc.wantDescs, tc.wantEnts)
			}
			if tc.descs == tc.wantDescs && tc.entries == tc.wantEnts && !proto.Equal(&got, req) {
				t.Errorf("within the limits: got %v, want %v", &got, req)
			}
		})
	}
}

// TestLimitsStreamsPerConnection: with StreamsPerConn 1, a second call on
// the connection of a call in flight waits for it (here: until its own
// deadline) and never reaches the store, while a call on another
// connection does.
func TestLimitsStreamsPerConnection(t *testing.T) {
	store := &countingRunner{gate: make(chan struct{}), entered: make(chan struct{}, 8)}
	lim := rls.Limits{StreamsPerConn: 1}
	client := startLimited(t, store, lim)
	done := make(chan error, 1)
	go func() {
		_, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: hotDescs(1)})
		done <- err
	}()
	<-store.entered
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: hotDescs(1)})
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a second stream on the connection: got %v, want it to wait (DeadlineExceeded)", err)
	}
	if n := len(store.entered); n != 0 {
		t.Fatalf("the second stream reached the store (%d)", n)
	}
	close(store.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
