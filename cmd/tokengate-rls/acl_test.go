package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// docsACL is the Redis user docs/rls.md documents ("tokengate", "on",
// ">pw", "~tb:*", ...), less the Cluster commands (a single Redis) and
// less the rules in drop.
func docsACL(t *testing.T, drop ...string) []string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/rls.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("user tokengate on >… ([^`\n]+)").FindStringSubmatch(string(doc))
	if m == nil {
		t.Fatal("docs/rls.md: no line `user tokengate on >… ...`")
	}
	out := []string{"tokengate", "on", ">pw"}
	for _, r := range strings.Fields(m[1]) {
		if !strings.HasPrefix(r, "+cluster|") && !contains(drop, r) {
			out = append(out, r)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// startWithACL runs tokengate-rls (rlqsConfig's rule "api") as the
// Redis user acl and returns its gRPC client and admin address.
func startWithACL(t *testing.T, acl []string) (*grpc.ClientConn, string) {
	t.Helper()
	redis := redistest.Start(t, append([]string{"--user"}, acl...)...)
	dir := t.TempDir()
	cfg, pw := filepath.Join(dir, "rls.json"), filepath.Join(dir, "pw")
	writeFile(t, cfg, rlqsConfig)
	writeFile(t, pw, "pw\n")
	grpcAddr, admin := startRun(t, io.Discard, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s",
		"-redis-user", "tokengate", "-redis-password-file", pw, "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, admin
}

// TestReadyNeedsACL: with the Redis user docs/rls.md documents the
// service is ready and both RLS v3 and an RLQS share are decided; with
// the ACL the docs gave before (no "tq:*" keys) it is not ready, /ready
// naming what the user may not run, and the gRPC health service says
// NOT_SERVING. Before (issue 30), /ready said 200 while every share
// failed with NOPERM.
func TestReadyNeedsACL(t *testing.T) {
	t.Run("documented", func(t *testing.T) {
		conn, admin := startWithACL(t, docsACL(t))
		waitFor(t, "/ready", func() bool { code, _ := get(t, admin+"/ready"); return code == http.StatusOK })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*commonrl.RateLimitDescriptor{
			descriptorOf(rlscontract.ClusterDescriptor("api", "acme", 0))}}
		if r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("RLS v3: %v %v, want OK", r, err)
		}
		stream, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id := &rlqsv3.BucketId{Bucket: map[string]string{rlscontract.RuleKey: "api", "x-tenant": "acme"}}
		if err := stream.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "tokengate", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: id, NumRequestsAllowed: 5, TimeElapsed: durationpb.New(time.Second)}}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if a := resp.GetBucketAction(); len(a) != 1 || a[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket() == nil {
			t.Errorf("RLQS: %v, want a token-bucket share", resp)
		}
		_, m := get(t, admin+"/metrics")
		if got := metricValue(m, "tokengate_rls_rlqs_debit_errors_total"); got != 0 {
			t.Errorf("RLQS debit errors %v, want 0", got)
		}
		if code, body := get(t, admin+"/ready"); code != http.StatusOK {
			t.Errorf("/ready after the calls: %d %s", code, body)
		}
	})
	t.Run("without-rlqs-keys", func(t *testing.T) {
		conn, admin := startWithACL(t, docsACL(t, "~tq:*"))
		var body string
		waitFor(t, "/ready naming the RLQS keys", func() bool {
			var code int
			code, body = get(t, admin+"/ready")
			return code == http.StatusServiceUnavailable && strings.Contains(body, `"tq:{`)
		})
		if !strings.Contains(body, "HSET") || !strings.Contains(body, "RLQS share") {
			t.Errorf("/ready: %q, want it to name HSET on the RLQS share key", body)
		}
		for i := range 3 {
			if code, body := get(t, admin+"/ready"); code == http.StatusOK {
				t.Fatalf("poll %d: /ready 200 (%s) while the user may not touch the RLQS keys", i, body)
			}
			time.Sleep(400 * time.Millisecond)
		}
		if st, err := healthCheck(t, conn, ""); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("gRPC health: %v %v, want NOT_SERVING", st, err)
		}
	})
}
