package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/redistest"
)

// sentCounter is a client stats handler that counts request messages
// handed to the connection.
type sentCounter struct{ sent atomic.Int64 }

func (s *sentCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (s *sentCounter) HandleRPC(_ context.Context, st stats.RPCStats) {
	if _, ok := st.(*stats.OutPayload); ok {
		s.sent.Add(1)
	}
}
func (s *sentCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (s *sentCounter) HandleConn(context.Context, stats.ConnStats) {}

// TestTokengateRLSSigterm: the real tokengate-rls binary gets SIGTERM while
// calls are in flight (its Redis in DEBUG SLEEP holds them inside the
// service); it drains them, every one gets its answer, and it exits 0.
//
// A call counts as in flight once its request was handed to the gRPC
// connection (a stats handler sees it) before the signal: grpc-go's
// graceful stop announces GOAWAY with a PING first and serves every stream
// that reached it before the client's acknowledgement, which follows the
// request on the connection.
func TestTokengateRLSSigterm(t *testing.T) {
	const cfg = `{"rules":[{"name":"s","scope":"cluster","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1,"burst":1000}}],
	  "settings":{"rls":{"cluster":"ratelimit"}}}`
	redis := redistest.Start(t)
	// The Redis timeout outlasts the sleep: the calls wait for Redis
	// rather than fail, and -drain (5 s) outlasts both.
	rls := startTokengateRLS(t, cfg, redis.Addr, "-redis-timeout", "3s")
	sc := &sentCounter{}
	conn, err := grpc.NewClient(rls.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(sc))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := func(key string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "tokengate_rule", Value: "s"}, {Key: "key", Value: key}}}}}
	}
	call := func(ctx context.Context, key string) (*rlsv3.RateLimitResponse, error) {
		return client.ShouldRateLimit(ctx, req(key))
	}
	if r, err := call(context.Background(), "warm"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("before: %v %v", r, err)
	}

	slept := make(chan error, 1)
	go func() { slept <- debugSleep(redis.Addr, 2) }()
	// Redis sleeps once a short call times out.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := call(ctx, "probe")
		cancel()
		if status.Code(err) == codes.DeadlineExceeded {
			break
		}
		if err != nil {
			t.Fatalf("probe: %v", err)
		}
		select {
		case err := <-slept:
			t.Fatalf("DEBUG SLEEP ended (%v) before a call waited on it", err)
		case <-time.After(10 * time.Millisecond):
		}
	}

	const inFlight = 8
	base := sc.sent.Load()
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := range inFlight {
		wg.Add(1)
		go func() { // reports with t.Errorf only
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, err := call(ctx, "in-flight-"+string(rune('a'+i)))
			if err != nil {
				t.Errorf("call %d in flight at SIGTERM: %v, want an answer", i, err)
				return
			}
			if r.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Errorf("call %d: %v, want OK", i, r.OverallCode)
				return
			}
			answered.Add(1)
		}()
	}
	for sc.sent.Load() < base+inFlight {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-slept:
		t.Fatalf("DEBUG SLEEP ended (%v) before SIGTERM: the calls were not held in flight", err)
	default:
	}
	if answered.Load() != 0 {
		t.Fatalf("%d calls answered while Redis slept", answered.Load())
	}
	stopped := make(chan error, 1)
	go func() { stopped <- rls.Stop() }()
	wg.Wait()
	if err := <-stopped; err != nil {
		t.Errorf("tokengate-rls after SIGTERM: %v, want exit 0\n%s", err, rls.out.String())
	}
	if answered.Load() != inFlight {
		t.Errorf("%d of %d calls in flight at SIGTERM answered", answered.Load(), inFlight)
	}
	if err := <-slept; err != nil {
		t.Errorf("DEBUG SLEEP: %v", err)
	}
}
