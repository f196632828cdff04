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
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// countingRLS answers OVER_LIMIT for key "k0" and OK otherwise, and counts
// the calls.
type countingRLS struct {
	rlspb.UnimplementedRateLimitServiceServer
	calls atomic.Int64
	// bad counts calls whose request or content-type differ from what the
	// generator should send.
	bad atomic.Int64
}

func (c *countingRLS) ShouldRateLimit(ctx context.Context, r *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	c.calls.Add(1)
	want := &rlspb.RateLimitRequest{Domain: "tokengate", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "tokengate_rule", Value: "bench"}, {Key: "key", Value: "k0"}}}}}
	md, _ := metadata.FromIncomingContext(ctx)
	if !proto.Equal(r, want) || len(md["content-type"]) != 1 || md["content-type"][0] != "application/grpc" {
		c.bad.Add(1)
	}
	code := rlspb.RateLimitResponse_OK
	if e := r.GetDescriptors()[0].GetEntries(); len(e) == 2 && e[0].GetKey() == "tokengate_rule" && e[1].GetValue() == "k0" {
		code = rlspb.RateLimitResponse_OVER_LIMIT
	}
	// The rest of a real answer, which the generator must get past.
	return &rlspb.RateLimitResponse{OverallCode: code, Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{
		Code: code, LimitRemaining: 7, DurationUntilReset: durationpb.New(time.Second),
		CurrentLimit: &rlspb.RateLimitResponse_RateLimit{Name: "bench", RequestsPerUnit: 10, Unit: rlspb.RateLimitResponse_RateLimit_SECOND}}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "ratelimit-remaining", Value: "7"}}}, nil
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
	if n := svc.bad.Load(); n != 0 {
		t.Errorf("%d calls were not the request the generator should send, as application/grpc", n)
	}
	if r.LoadCPUus <= 0 {
		t.Errorf("load_cpu_us %v, want > 0", r.LoadCPUus)
	}
	if r.P50us <= 0 || r.P99us < r.P50us || r.PerSecond <= 0 {
		t.Errorf("latencies p50 %v p99 %v, rate %v", r.P50us, r.P99us, r.PerSecond)
	}
	if r.ServiceCPUus <= 0 {
		t.Errorf("service_cpu_us %v, want > 0 (this process served 2000 calls)", r.ServiceCPUus)
	}
}

// TestParseOverallCode reads overall_code from responses marshalled by
// go-control-plane, and refuses truncated or malformed ones.
func TestParseOverallCode(t *testing.T) {
	full := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT,
		Statuses:             []*rlspb.RateLimitResponse_DescriptorStatus{{Code: rlspb.RateLimitResponse_OVER_LIMIT, LimitRemaining: 3}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "retry-after", Value: "1"}}, RawBody: []byte("x")}
	for _, tc := range []struct {
		msg  *rlspb.RateLimitResponse
		want overallCode
	}{
		{&rlspb.RateLimitResponse{}, 0},
		{&rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}, 1},
		{full, 2},
		{&rlspb.RateLimitResponse{Statuses: full.Statuses, OverallCode: rlspb.RateLimitResponse_OK}, 1},
	} {
		b, err := proto.Marshal(tc.msg)
		if err != nil {
			t.Fatal(err)
		}
		// An unknown field (number 99, bytes) is skipped.
		b = protowire.AppendBytes(protowire.AppendTag(b, 99, protowire.BytesType), []byte("future"))
		code := overallCode(-1)
		if err := parseOverallCode(b, &code); err != nil || code != tc.want {
			t.Errorf("%v: got %d %v, want %d", tc.msg, code, err, tc.want)
		}
		for cut := 1; cut < len(b); cut++ {
			// Cutting inside the last field (the unknown one) must fail;
			// a cut between fields is a valid, shorter message.
			if err := parseOverallCode(b[:len(b)-cut], &code); err == nil && cut <= 7 {
				t.Errorf("%v cut by %d: no error", tc.msg, cut)
			}
		}
	}
	if err := parseOverallCode([]byte{0x0f}, new(overallCode)); err == nil { // wire type 7
		t.Error("wire type 7: no error")
	}
}
