package main

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// rlqsConfig has one cluster rule RLQS can share out.
const rlqsConfig = `{"rules": [{"name": "api", "scope": "cluster", "limit_keys": ["header:x-tenant"],
  "algorithm_config": {"tokens_per_second": 100, "burst": 100}}],
  "settings": {"rls": {"cluster": "rls"}}}`

// metricValue is the value of series in the Prometheus text m, or -1 when
// m has no such line.
func metricValue(m, series string) float64 {
	for _, line := range strings.Split(m, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err == nil {
				return v
			}
		}
	}
	return -1
}

// TestRLQSMetrics: the RLQS series are on the service's /metrics: a stream
// open, its reports, the assignments it was sent by action (a share for a
// rule's bucket, allow_all for a bucket no rule names), the buckets
// assigned, the share requests, an abandon after three idle intervals; and,
// once the stream has ended, no stream open and no bucket assigned.
// Before, RLQS counted on the server only (Server.Reports), not in
// Prometheus.
func TestRLQSMetrics(t *testing.T) {
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, rlqsConfig)
	grpcAddr, admin := startRun(t, io.Discard, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s",
		"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0")
	waitFor(t, "/ready", func() bool { code, _ := get(t, admin+"/ready"); return code == http.StatusOK })

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shared := &rlqsv3.BucketId{Bucket: map[string]string{rlscontract.RuleKey: "api", "x-tenant": "acme"}}
	free := &rlqsv3.BucketId{Bucket: map[string]string{rlscontract.RuleKey: "no-such-rule"}}
	usage := func(id *rlqsv3.BucketId, allowed uint64, elapsed int64) *rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage {
		return &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: id, NumRequestsAllowed: allowed,
			TimeElapsed: durationpb.New(time.Duration(elapsed) * time.Second)}
	}
	exchange := func(us ...*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqsv3.RateLimitQuotaResponse {
		t.Helper()
		if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "tokengate", BucketQuotaUsages: us}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	// The subscriptions: a share of "api", allow_all for the other.
	resp := exchange(usage(shared, 0, 0), usage(free, 0, 0))
	if len(resp.GetBucketAction()) != 2 {
		t.Fatalf("%d actions, want 2: %v", len(resp.GetBucketAction()), resp)
	}
	action := ""
	for _, b := range resp.GetBucketAction() {
		if b.GetBucketId().GetBucket()[rlscontract.RuleKey] != "api" {
			continue
		}
		if a := b.GetQuotaAssignmentAction(); a == nil {
			t.Fatalf("action %v for the shared bucket, want an assignment", b)
		} else if a.GetRateLimitStrategy().GetTokenBucket() != nil {
			action = "token_bucket"
		} else {
			action = "deny_all" // no tokens to give now: still an assignment
		}
	}
	_, m := get(t, admin+"/metrics")
	for _, w := range []struct {
		series string
		want   float64
	}{
		{"tokengate_rls_rlqs_streams_open", 1},
		{"tokengate_rls_rlqs_reports_total", 2},
		{"tokengate_rls_rlqs_share_requests_total", 1},
		{`tokengate_rls_rlqs_assignments_total{action="` + action + `"}`, 1},
		{`tokengate_rls_rlqs_assignments_total{action="allow_all"}`, 1},
		{"tokengate_rls_rlqs_buckets_assigned", 1},
		{"tokengate_rls_rlqs_abandons_total", 0},
		{"tokengate_rls_rlqs_debit_errors_total", 0},
	} {
		if got := metricValue(m, w.series); got != w.want {
			t.Errorf("after the subscriptions: %s = %v, want %v", w.series, got, w.want)
		}
	}

	// Idle reports keep a share for a while (docs/rlqs.md: 3 reports and
	// 10 s); the third idle interval of 5 s abandons it.
	for i := range 2 {
		resp = exchange(usage(shared, 0, 5))
		if len(resp.GetBucketAction()) != 1 || resp.GetBucketAction()[0].GetQuotaAssignmentAction() == nil {
			t.Fatalf("idle report %d answered %v, want the share kept", i+1, resp)
		}
	}
	resp = exchange(usage(shared, 0, 5))
	if len(resp.GetBucketAction()) != 1 || resp.GetBucketAction()[0].GetAbandonAction() == nil {
		t.Fatalf("third idle report answered %v, want an abandon", resp)
	}
	_, m = get(t, admin+"/metrics")
	for _, w := range []struct {
		series string
		want   float64
	}{
		{"tokengate_rls_rlqs_reports_total", 5},
		{"tokengate_rls_rlqs_share_requests_total", 4},
		{"tokengate_rls_rlqs_abandons_total", 1},
		{"tokengate_rls_rlqs_buckets_assigned", 0},
	} {
		if got := metricValue(m, w.series); got != w.want {
			t.Errorf("after the abandon: %s = %v, want %v", w.series, got, w.want)
		}
	}

	// A new subscription, then the stream ends.
	exchange(usage(shared, 0, 0))
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stream's end in the metrics", func() bool {
		_, m := get(t, admin+"/metrics")
		return metricValue(m, "tokengate_rls_rlqs_streams_open") == 0 && metricValue(m, "tokengate_rls_rlqs_buckets_assigned") == 0
	})
}
