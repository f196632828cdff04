package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

func envOf(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestIsRatelimit(t *testing.T) {
	for arg0, want := range map[string]bool{"/bin/ratelimit": true, "ratelimit": true, "./tokengate-rls": false, "/bin/ratelimit2": false} {
		if got := isRatelimit(arg0); got != want {
			t.Errorf("isRatelimit(%q) = %v, want %v", arg0, got, want)
		}
	}
}

// TestRunRatelimit starts the drop-in as /bin/ratelimit would be, with
// Redis down: /healthcheck answers 500 and the gRPC health service
// "ratelimit" NOT_SERVING until Redis answers; it decides the runtime
// directory's domain, reloads the directory when a file changes, keeps
// the configuration in force when a new file is bad, and stops when the
// context ends.
func TestRunRatelimit(t *testing.T) {
	redis := redistest.Start(t)
	redis.Kill()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, yaml string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listening := make(chan [2]string, 1)
	errc := make(chan error, 1)
	logw := &lockedLog{}
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	promAddr := pl.Addr().String()
	pl.Close()
	go func() {
		errc <- runRatelimit(ctx, envOf("HOST", "127.0.0.1", "PORT", "0", "GRPC_HOST", "127.0.0.1", "GRPC_PORT", "0",
			"DEBUG_HOST", "127.0.0.1", "DEBUG_PORT", "0", "USE_STATSD", "false", "REDIS_SOCKET_TYPE", "tcp",
			"REDIS_URL", redis.Addr, "REDIS_TIMEOUT", "5s", "RUNTIME_ROOT", root, "RUNTIME_SUBDIRECTORY", "rl",
			"RUNTIME_WATCH_ROOT", "false", "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", promAddr, "PROMETHEUS_PATH", "/stats"), logw, listening)
	}()
	var grpcAddr, httpURL string
	select {
	case a := <-listening:
		grpcAddr, httpURL = a[0], "http://"+a[1]
	case err := <-errc:
		t.Fatalf("runRatelimit: %v", err)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	healthOf := func() healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	if code, _ := get(t, httpURL+"/healthcheck"); code != http.StatusInternalServerError {
		t.Errorf("/healthcheck with Redis down: %d, want 500", code)
	}
	if st := healthOf(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("grpc health with Redis down: %v, want NOT_SERVING", st)
	}
	redis.Restart()
	waitUntil(t, "/healthcheck 200 after Redis starts", func() bool { code, _ := get(t, httpURL+"/healthcheck"); return code == http.StatusOK })
	waitUntil(t, "grpc health SERVING after Redis starts", func() bool { return healthOf() == healthpb.HealthCheckResponse_SERVING })

	decide := func(domain string) int {
		code, _ := post(t, httpURL+"/json", `{"domain": "`+domain+`", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`)
		return code
	}
	if a, b := decide("a"), decide("a"); a != http.StatusOK || b != http.StatusTooManyRequests {
		t.Fatalf("domain a: %d then %d, want 200 then 429", a, b)
	}
	if c := decide("b"); c != http.StatusOK {
		t.Fatalf("domain b before it is configured: %d, want 200", c)
	}
	write("b.yaml", "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 0}\n")
	waitUntil(t, "domain b limited after its file appears", func() bool { return decide("b") == http.StatusTooManyRequests })
	if code, body := get(t, "http://"+promAddr+"/stats"); code != http.StatusOK || !strings.Contains(body, "tokengate_rls_requests_total") {
		t.Errorf("PROMETHEUS_PATH /stats: %d %.200s", code, body)
	}
	write("c.yaml", "domain: c\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	waitUntil(t, "the bad file logged", func() bool { return strings.Contains(logw.String(), "configuration not reloaded") })
	if !strings.Contains(logw.String(), "fortnight") {
		t.Errorf("the log does not name the bad unit:\n%s", logw.String())
	}
	if c := decide("b"); c != http.StatusTooManyRequests {
		t.Errorf("after a bad file: domain b %d, want 429 (the configuration in force kept)", c)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("runRatelimit after shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runRatelimit did not return within 10 s of shutdown")
	}
}

// pingOK is a Redis that always answers PING.
type pingOK struct{}

func (pingOK) Ping(context.Context) error { return nil }

// TestHealthAfterSigterm: once shutting down, /healthcheck answers 500
// and the gRPC health service NOT_SERVING, whatever Redis does.
func TestHealthAfterSigterm(t *testing.T) {
	ready := rls.NewReadiness(pingOK{}, 10*time.Millisecond, nil)
	defer ready.Stop()
	hs := rls.RegisterHealth(grpc.NewServer(), ready, "ratelimit")
	waitUntil(t, "ready with Redis answering", ready.Ready)
	if r, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("grpc health with Redis answering: %v %v, want SERVING", r, err)
	}
	ready.Drain()
	if ready.Ready() {
		t.Error("ok after SIGTERM")
	}
	rec := &statusRecorder{}
	dropin.Healthcheck(ready).ServeHTTP(rec, nil)
	if rec.code != http.StatusInternalServerError {
		t.Errorf("/healthcheck after SIGTERM: %d, want 500", rec.code)
	}
	r, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("grpc health after SIGTERM: %v %v, want NOT_SERVING", r, err)
	}
}

// TestHealthWithConfig: with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED the
// drop-in is unhealthy, Redis answering, until a configuration with a
// domain is in force; both health checks follow the one readiness.
func TestHealthWithConfig(t *testing.T) {
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED's setting.
	d := struct {
		env   struct{ healthyWithConfig bool }
		ready *rls.Readiness
	}{env: struct{ healthyWithConfig bool }{healthyWithConfig: true}}
	d.ready = rls.NewReadiness(pingOK{}, 10*time.Millisecond, nil)
	defer d.ready.Stop()
	hs := rls.RegisterHealth(grpc.NewServer(), d.ready, "ratelimit")
	// What the lifecycle does with each configuration it puts in force.
	holdForConfig := func(c *rls.Config) { daemon.HoldFor(d.ready, d.env.healthyWithConfig, c) }
	empty, err := rls.NewDropinConfig(nil, rls.DropinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	one := configWithDomain(t)
	code := func() int {
		rec := &statusRecorder{}
		dropin.Healthcheck(d.ready).ServeHTTP(rec, nil)
		return rec.code
	}
	status := func() healthpb.HealthCheckResponse_ServingStatus {
		r, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetStatus()
	}
	holdForConfig(one)
	waitUntil(t, "healthy with a domain and Redis answering", func() bool { return code() == http.StatusOK })
	holdForConfig(empty)
	if c := code(); c != http.StatusInternalServerError {
		t.Errorf("/healthcheck with no domain: %d, want 500", c)
	}
	if st := status(); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("grpc health with no domain: %v, want NOT_SERVING", st)
	}
	holdForConfig(one)
	if c, st := code(), status(); c != http.StatusOK || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("once a domain is in force again: /healthcheck %d, grpc health %v; want 200, SERVING", c, st)
	}
	d.env.healthyWithConfig = false
	holdForConfig(empty)
	if c := code(); c != http.StatusOK {
		t.Errorf("without HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, no domain: /healthcheck %d, want 200", c)
	}
}

// configWithDomain is a drop-in configuration with domain "a".
func configWithDomain(t *testing.T) *rls.Config {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := dropin.LoadRuntime(dir, false, rls.DropinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type statusRecorder struct {
	code int
	h    http.Header
}

func (s *statusRecorder) Header() http.Header {
	if s.h == nil {
		s.h = http.Header{}
	}
	return s.h
}
func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return len(b), nil
}
func (s *statusRecorder) WriteHeader(c int) { s.code = c }

// waitFor polls cond every 50 ms for up to 15 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRatelimitLogSettings: LOG_FORMAT and LOG_LEVEL set the logger's
// format and least level, as envoyproxy/ratelimit's do.
func TestRatelimitLogSettings(t *testing.T) {
	run := func(kv ...string) string {
		logw := &lockedLog{}
		// USE_STATSD's default is a warning; a Redis database other than 0
		// then stops the start before anything listens.
		env := append([]string{"RUNTIME_ROOT", t.TempDir(), "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis://127.0.0.1:1/3"}, kv...)
		if err := runRatelimit(context.Background(), envOf(env...), logw, nil); err == nil {
			t.Fatal("runRatelimit with REDIS_URL's database 3: no error")
		}
		return logw.String()
	}
	out := run("LOG_FORMAT", "json")
	line, _, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(line, "{") || !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, "USE_STATSD") {
		t.Errorf("LOG_FORMAT=json: the first line is not the USE_STATSD warning in JSON:\n%s", out)
	}
	if out := run("LOG_FORMAT", "text"); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "USE_STATSD") {
		t.Errorf("LOG_FORMAT=text: no logfmt warning:\n%s", out)
	}
	if out := run("LOG_LEVEL", "error"); out != "" {
		t.Errorf("LOG_LEVEL=error: warnings logged:\n%s", out)
	}
}
