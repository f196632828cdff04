package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/stats"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
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
// calls are in flight (its Redis stopped with SIGSTOP holds them inside the
// service); it drains them, every one gets its answer once Redis resumes,
// and it exits 0.
//
// Nothing here depends on timing. A call counts as in flight once its
// request was handed to the gRPC connection (a stats handler sees it)
// before the signal: grpc-go's graceful stop announces GOAWAY with a PING
// first and serves every stream that reached it before the client's
// acknowledgement, which follows the request on the connection. Redis
// resumes only after the service has logged that it is shutting down.
func TestTokengateRLSSigterm(t *testing.T) {
	const cfg = `{"rules":[{"name":"s","scope":"cluster","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1,"burst":1000}}],
	  "settings":{"rls":{"cluster":"ratelimit"}}}`
	redis := redistest.Start(t)
	// The Redis timeout and the drain outlast the pause by far: the calls
	// wait for Redis rather than fail.
	rls := startTokengateRLS(t, cfg, redis.Addr, "-redis-timeout", "20s", "-drain", "20s")
	sc := &sentCounter{}
	conn, err := grpc.NewClient(rls.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStatsHandler(sc))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	call := func(ctx context.Context, key string) (*rlsv3.RateLimitResponse, error) {
		return client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tokengate_rule", Value: "s"}, {Key: "key", Value: key}}}}})
	}
	if r, err := call(context.Background(), "warm"); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("before: %v %v", r, err)
	}

	// SIGSTOP, and return once Redis is certainly stopped: a bare signal
	// lets it run on a loaded machine, and answer a call sent after it.
	redis.Freeze()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			redis.Thaw()
		}
	}
	defer resume()

	const inFlight = 8
	var wg sync.WaitGroup
	var answered atomic.Int64
	for i := range inFlight {
		wg.Add(1)
		go func() { // reports with t.Errorf only
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			r, err := call(ctx, "in-flight-"+strconv.Itoa(i))
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
	deadline := time.Now().Add(30 * time.Second)
	for sc.sent.Load() < 1+inFlight { // the warm call, then these
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d calls sent", sc.sent.Load()-1, inFlight)
		}
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- rls.Stop() }()
	for !strings.Contains(rls.out.String(), "shutting down") {
		if time.Now().After(deadline) {
			resume()
			t.Fatalf("tokengate-rls did not start shutting down after SIGTERM:\n%s", rls.out.String())
		}
		time.Sleep(time.Millisecond)
	}
	if n := answered.Load(); n != 0 {
		t.Errorf("%d calls answered while Redis was stopped", n)
	}
	resume()
	wg.Wait()
	if err := <-stopped; err != nil {
		t.Errorf("tokengate-rls after SIGTERM: %v, want exit 0\n%s", err, rls.out.String())
	}
	if answered.Load() != inFlight {
		t.Errorf("%d of %d calls in flight at SIGTERM answered", answered.Load(), inFlight)
	}
}
