package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

const configJSON = `{"rules": [{"name": "per-ip", "scope": "cluster", "limit_keys": ["ip:address"],
  "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}],
  "settings": {"rls": {"cluster": "rls"}}}`

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRun starts the program against a Redis that is down, sees /ready say
// 503, starts Redis, sees 200, decides over /json, and shuts down cleanly
// when the context ends (as on SIGTERM).
func TestRun(t *testing.T) {
	redis := redistest.Start(t)
	redis.Kill()
	cfg := filepath.Join(t.TempDir(), "rls.json")
	if err := os.WriteFile(cfg, []byte(configJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan [2]string, 1)
	errc := make(chan error, 1)
	go func() {
		// A Redis timeout no healthy round trip on a loaded machine comes
		// near (the default 25 ms does): the test counts decisions, not
		// timeouts.
		errc <- run(ctx, []string{"-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s",
			"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-drain-delay", "0"}, io.Discard, listening)
	}()
	var admin string
	select {
	case a := <-listening:
		admin = "http://" + a[1]
	case err := <-errc:
		t.Fatalf("run: %v", err)
	}
	if code, _ := get(t, admin+"/ready"); code != http.StatusServiceUnavailable {
		t.Fatalf("/ready with Redis down: %d, want 503", code)
	}
	redis.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _ := get(t, admin+"/ready"); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/ready not 200 within 10 s of Redis starting")
		}
		time.Sleep(50 * time.Millisecond)
	}
	req := `{"domain": "tokengate", "descriptors": [{"entries": [{"key": "tokengate_rule", "value": "per-ip"}, {"key": "key", "value": "192.0.2.1"}]}]}`
	if code, body := post(t, admin+"/json", req); code != http.StatusOK || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Fatalf("/json first: %d %s", code, body)
	}
	if code, body := post(t, admin+"/json", req); code != http.StatusTooManyRequests || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Fatalf("/json second: %d %s", code, body)
	}
	if code, _ := post(t, admin+"/json", `{"descriptors": []}`); code != http.StatusBadRequest {
		t.Fatalf("/json invalid: %d, want 400", code)
	}
	_, metrics := get(t, admin+"/metrics")
	for _, want := range []string{
		`tokengate_rls_decisions_total{code="ok",rule="per-ip"} 1`,
		`tokengate_rls_decisions_total{code="over_limit",rule="per-ip"} 1`,
		`tokengate_rls_redis_duration_seconds_count 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, metrics)
		}
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("run after shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return within 10 s of shutdown")
	}
}

func TestRunFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-config is required"},
		{[]string{"-config", "/nonexistent.json"}, "no such file"},
		{[]string{"-config", "x", "extra"}, "unexpected arguments"},
		{[]string{"-config", "x", "-stream-workers", "70000"}, "at most 65536"},
		{[]string{"-config", "x", "-redis-flush-delay", "-1us"}, "must not be negative"},
	} {
		err := run(context.Background(), tc.args, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.args, err, tc.want)
		}
	}
	cfg := filepath.Join(t.TempDir(), "c.json")
	_ = os.WriteFile(cfg, []byte(configJSON), 0o644)
	err := run(context.Background(), []string{"-config", cfg, "-redis", "127.0.0.1:1,127.0.0.1:2"}, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "need -redis-cluster") {
		t.Errorf("two addresses without -redis-cluster: got %v", err)
	}
}

// TestTimeoutsAgree: every client timeout this repository ships or
// defaults to waits longer than a decision can take, two Redis round
// trips of -redis-timeout (a take, then the refund of a rejected or failed
// request) plus a margin for the network: the service's answer, not the
// client's timeout, decides (docs/rls.md#timeouts).
func TestTimeoutsAgree(t *testing.T) {
	const margin = 5 * time.Millisecond
	least := 2*defaultRedisTimeout + margin
	root := filepath.Join("..", "..")
	cfg, err := config.Parse([]byte(`{"rules":[{"name":"a","scope":"cluster","algorithm_config":{"rps":1,"burst":1}}],"settings":{"rls":{"cluster":"rls"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	timeouts := map[string]time.Duration{"the filter's default timeout_ms": time.Duration(cfg.Settings.RLS.TimeoutMs) * time.Millisecond}
	ms := regexp.MustCompile(`"timeout_ms":\s*(\d+)`)
	for _, f := range []string{"deploy/rls/tokengate.json", "examples/cluster/cluster.json", "examples/cluster/envoy.yaml", "docs/rls.md", "docs/fleet.md"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range ms.FindAllSubmatch(b, -1) {
			n, _ := strconv.Atoi(string(m[1]))
			timeouts[f+" timeout_ms #"+strconv.Itoa(i+1)] = time.Duration(n) * time.Millisecond
		}
	}
	// Envoy's own ratelimit filter in the example bootstrap.
	b, err := os.ReadFile(filepath.Join(root, "deploy/rls/envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+timeout:\s*([0-9.]+s)\s*$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/rls/envoy.yaml: no ratelimit filter timeout")
	}
	d, err := time.ParseDuration(string(m[1]))
	if err != nil {
		t.Fatal(err)
	}
	timeouts["deploy/rls/envoy.yaml ratelimit timeout"] = d
	for what, d := range timeouts {
		if d < least {
			t.Errorf("%s is %v, want at least 2 x -redis-timeout (%v) + %v = %v", what, d, defaultRedisTimeout, margin, least)
		}
	}
	if len(timeouts) < 6 {
		t.Errorf("found %d timeouts, want the default and every shipped one: %v", len(timeouts), timeouts)
	}
}

// TestRunPprof: -pprof serves /debug/pprof/ beside the admin paths; without
// it the path is not found.
func TestRunPprof(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.json")
	if err := os.WriteFile(cfg, []byte(configJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, on := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		listening := make(chan [2]string, 1)
		errc := make(chan error, 1)
		args := []string{"-config", cfg, "-redis", "127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-drain-delay", "0"}
		if on {
			args = append(args, "-pprof")
		}
		go func() { errc <- run(ctx, args, io.Discard, listening) }()
		var admin string
		select {
		case a := <-listening:
			admin = "http://" + a[1]
		case err := <-errc:
			t.Fatalf("run: %v", err)
		}
		want := http.StatusNotFound
		if on {
			want = http.StatusOK
		}
		if code, body := get(t, admin+"/debug/pprof/"); code != want || on && !strings.Contains(body, "goroutine") {
			t.Errorf("-pprof %v: /debug/pprof/ answered %d, want %d", on, code, want)
		}
		if code, body := get(t, admin+"/metrics"); code != http.StatusOK || !strings.Contains(body, "tokengate_rls_requests_total") {
			t.Errorf("-pprof %v: /metrics answered %d", on, code)
		}
		cancel()
		if err := <-errc; err != nil {
			t.Fatalf("run after shutdown: %v", err)
		}
	}
}
