package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// countingRLS answers OVER_LIMIT for key "k0" and OK otherwise, and counts
// the calls.
type countingRLS struct {
	rlspb.UnimplementedRateLimitServiceServer
	calls atomic.Int64
}

func (c *countingRLS) ShouldRateLimit(_ context.Context, r *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	c.calls.Add(1)
	code := rlspb.RateLimitResponse_OK
	if e := r.GetDescriptors()[0].GetEntries(); len(e) == 2 && e[0].GetKey() == "tokengate_rule" && e[1].GetValue() == "k0" {
		code = rlspb.RateLimitResponse_OVER_LIMIT
	}
	return &rlspb.RateLimitResponse{OverallCode: code}, nil
}

// TestRunStopsAtN: the run sends exactly -n requests (plus the first
// probe and the warm-up), counts every answer and reports latencies.
func TestRunStopsAtN(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	svc := &countingRLS{}
	rlspb.RegisterRateLimitServiceServer(srv, svc)
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()

	var out bytes.Buffer
	// -pid: this process stands in for the service.
	args := []string{"-addr", l.Addr().String(), "-keys", "1", "-c", "4", "-n", "2000", "-d", "30s", "-warmup", "0", "-pid", strconv.Itoa(os.Getpid())}
	if err := run(args, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("%v: %q", err, out.String())
	}
	if r.Decisions != 2000 || r.OverLimit != 2000 || r.Errors != 0 {
		t.Errorf("decisions %d over_limit %d errors %d, want 2000 2000 0", r.Decisions, r.OverLimit, r.Errors)
	}
	if n := svc.calls.Load(); n != 2001 { // the probe and 2000
		t.Errorf("the service saw %d calls, want 2001", n)
	}
	if r.P50us <= 0 || r.P99us < r.P50us || r.PerSecond <= 0 {
		t.Errorf("latencies p50 %v p99 %v, rate %v", r.P50us, r.P99us, r.PerSecond)
	}
	if r.ServiceCPUus <= 0 {
		t.Errorf("service_cpu_us %v, want > 0 (this process served 2000 calls)", r.ServiceCPUus)
	}
}
