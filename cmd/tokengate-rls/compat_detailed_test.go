package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/internal/testsupport/testport"
)

// TestRatelimitDetailedMetric: started as /bin/ratelimit on a YAML whose
// descriptor has detailed_metric, with TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS=2,
// the Prometheus scrape shows a series per value for the first two values
// with their counts, and the later values counted in the overflow series.
func TestRatelimitDetailedMetric(t *testing.T) {
	redis := redistest.Start(t)
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := "domain: edge\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := "127.0.0.1:" + strconv.Itoa(testport.Free(t))
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan [2]string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- runRatelimit(ctx, envOf("HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0",
			"DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0", "USE_STATSD", "false", "REDIS_SOCKET_TYPE", "tcp",
			"REDIS_URL", redis.Addr, "REDIS_TIMEOUT", "5s", "RUNTIME_ROOT", root, "RUNTIME_SUBDIRECTORY", "rl",
			"RUNTIME_WATCH_ROOT", "false", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", promAddr,
			"TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS", "2"), &lockedLog{}, listening)
	}()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("runRatelimit after the end: %v", err)
		}
	}()
	var grpcAddr, httpURL string
	select {
	case a := <-listening:
		grpcAddr, httpURL = a[0], "http://"+a[1]
	case err := <-errc:
		errc <- nil
		t.Fatalf("runRatelimit: %v", err)
	}
	waitFor(t, "/healthcheck 200", func() bool { code, _ := get(t, httpURL+"/healthcheck"); return code == http.StatusOK })

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	for _, user := range []string{"ann", "ann", "ben", "cy", "cy", "dee"} {
		cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: user}}}}})
		ccancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, m := get(t, "http://"+promAddr+"/metrics")
	series := func(desc, code string) string {
		return `tokengate_rls_detailed_decisions_total{code="` + code + `",descriptor="` + desc + `",rule="edge.user"}`
	}
	for _, w := range []struct {
		series string
		want   float64
	}{
		{series("edge.user_ann", "ok"), 1},
		{series("edge.user_ann", "over_limit"), 1},
		{series("edge.user_ben", "ok"), 1},
		{series(rls.DetailedOverflow, "ok"), 2},         // cy, dee
		{series(rls.DetailedOverflow, "over_limit"), 1}, // cy again
		{series("edge.user_cy", "ok"), -1},
		{"tokengate_rls_detailed_descriptors", 2},
		{"tokengate_rls_detailed_overflow_total", 3},
	} {
		if got := metricValue(m, w.series); got != w.want {
			t.Errorf("%s = %v, want %v (-1: absent)", w.series, got, w.want)
		}
	}
}
