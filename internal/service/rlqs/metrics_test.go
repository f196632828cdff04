package rlqs_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rlqs"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// failingSharer is a Redis that fails every share request.
type failingSharer struct{}

func (failingSharer) Share(_ context.Context, batches []redisstore.ShareBatch) [][]redisstore.ShareResult {
	out := make([][]redisstore.ShareResult, len(batches))
	for i, b := range batches {
		out[i] = make([]redisstore.ShareResult, len(b.Ops))
		for j := range out[i] {
			out[i][j].Err = errors.New("redis down")
		}
	}
	return out
}

// gathered returns the value of the metric called name (with label
// action=action when action is not empty) in reg, or -1.
func gathered(t *testing.T, reg *prometheus.Registry, name, action string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if action != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != action) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestMetricsDebitErrorsAndExpiry: a share request Redis fails is counted
// in tokengate_rls_rlqs_debit_errors_total (and nothing is sent for it),
// and the TTL 0 a stopping server sends is counted as action "expire".
func TestMetricsDebitErrorsAndExpiry(t *testing.T) {
	cfg, err := rls.ParseConfig([]byte(fleetConfig))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	stop, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := rlqs.New(stop, cfg.Rules(), failingSharer{}, rlqs.Options{Metrics: rlqs.NewMetrics(reg)})
	gs := grpc.NewServer()
	rlqsv3.RegisterRateLimitQuotaServiceServer(gs, srv)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancelStream := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelStream()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := &rlqsv3.BucketId{Bucket: map[string]string{rlqs.RuleKey: "api", "x-tenant": "acme"}}
	if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "edge",
		BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: id}}}); err != nil {
		t.Fatal(err)
	}
	// The failed share is answered with nothing; the stop answers TTL 0.
	deadline := time.Now().Add(10 * time.Second)
	for gathered(t, reg, "tokengate_rls_rlqs_debit_errors_total", "") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("no debit error counted within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	r, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.GetBucketAction()) != 1 || r.GetBucketAction()[0].GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != 0 {
		t.Fatalf("got %v, want one assignment with TTL 0", r)
	}
	for _, w := range []struct {
		name, action string
		want         float64
	}{
		{"tokengate_rls_rlqs_reports_total", "", 1},
		{"tokengate_rls_rlqs_share_requests_total", "", 1},
		{"tokengate_rls_rlqs_debit_errors_total", "", 1},
		{"tokengate_rls_rlqs_assignments_total", "expire", 1},
		{"tokengate_rls_rlqs_assignments_total", "token_bucket", 0},
		{"tokengate_rls_rlqs_buckets_assigned", "", 0},
	} {
		if got := gathered(t, reg, w.name, w.action); got != w.want {
			t.Errorf("%s %s: got %v, want %v", w.name, w.action, got, w.want)
		}
	}
}
