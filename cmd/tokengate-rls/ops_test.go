package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonrl "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// runMainEnv, set in a child's environment, makes the test binary run
// main with its arguments: the tests drive the real program, signals and
// exit status included, without building it.
const runMainEnv = "TOKENGATE_RLS_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	// "ratelimit": main started under that name, the drop-in.
	if v := os.Getenv(runMainEnv); v == "1" || v == "ratelimit" {
		name := "tokengate-rls"
		if v == "ratelimit" {
			name = "/usr/bin/ratelimit"
		}
		os.Args = append([]string{name}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// secondConfig renames the rule and adds one: a reload that took effect
// decides "per-ip-2".
const secondConfig = `{"rules": [{"name": "per-ip-2", "scope": "cluster", "limit_keys": ["ip:address"],
  "algorithm_config": {"tokens_per_second": 0.001, "burst": 1}}],
  "settings": {"rls": {"cluster": "rls"}}}`

func jsonReq(rule, key string) string {
	return `{"domain": "tokengate", "descriptors": [{"entries": [{"key": "tokengate_rule", "value": "` + rule +
		`"}, {"key": "key", "value": "` + key + `"}]}]}`
}

// proc is the program running in a child process, its log lines parsed.
type proc struct {
	t           *testing.T
	cmd         *exec.Cmd
	grpc, admin string
	mu          sync.Mutex
	lines       []map[string]any
	exited      chan struct{}
	err         error
}

// startProc runs the program with args (and -log-format json) and waits
// for its "serving" line.
func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], append(args, "-log-format", "json")...)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, exited: make(chan struct{})}
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				m = map[string]any{"msg": sc.Text()}
			}
			p.mu.Lock()
			p.lines = append(p.lines, m)
			p.mu.Unlock()
			if m["msg"] == "serving" {
				p.grpc, p.admin = m["grpc"].(string), "http://"+m["admin"].(string)
				close(serving)
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	select {
	case <-serving:
	case <-p.exited:
		t.Fatalf("exited before serving: %v\n%s", p.err, p.log())
	case <-time.After(20 * time.Second):
		t.Fatalf("not serving within 20 s:\n%s", p.log())
	}
	return p
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for _, l := range p.lines {
		j, _ := json.Marshal(l)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// waitLog waits for the n-th line whose msg is msg.
func (p *proc) waitLog(msg string, n int) map[string]any {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		seen := 0
		for _, l := range p.lines {
			if l["msg"] == msg {
				if seen++; seen == n {
					p.mu.Unlock()
					return l
				}
			}
		}
		p.mu.Unlock()
		select {
		case <-p.exited:
			p.t.Fatalf("exited (%v) before logging %q #%d:\n%s", p.err, msg, n, p.log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no %q #%d logged within 10 s:\n%s", msg, n, p.log())
		}
	}
}

// waitFor polls f until it reports true, for at most 10 s.
func waitFor(t *testing.T, what string, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func healthCheck(t *testing.T, conn *grpc.ClientConn, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return r.GetStatus(), err
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	// Write then rename, as an editor or a ConfigMap update does: the
	// program never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestSignals runs the program as a process. SIGHUP reloads the
// configuration (before: SIGHUP killed it, exit 129, no line logged); a
// configuration that does not parse is refused and the one in use stays;
// SIGTERM makes the gRPC health service say NOT_SERVING and /ready 503
// while /live stays 200 and calls are still answered, for -drain-delay,
// and then the program exits 0.
func TestSignals(t *testing.T) {
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	p := startProc(t, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s", "-listen", "127.0.0.1:0",
		"-admin", "127.0.0.1:0", "-drain-delay", "1h", "-drain", "10s", "-watch-interval", "0")
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, "gRPC health SERVING with Redis up", func() bool {
		st, err := healthCheck(t, conn, "envoy.service.ratelimit.v3.RateLimitService")
		return err == nil && st == healthpb.HealthCheckResponse_SERVING
	})
	if code, _ := post(t, p.admin+"/json", jsonReq("per-ip-2", "a")); code != http.StatusOK {
		t.Fatalf("per-ip-2 before the reload: %d, want 200 (no such rule: not limited)", code)
	}

	writeFile(t, cfg, secondConfig)
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if l := p.waitLog("configuration reloaded", 1); l["trigger"] != "SIGHUP" || l["rules"] != 1.0 {
		t.Errorf("reload line: %v", l)
	}
	codes := []int{}
	for range 2 {
		code, _ := post(t, p.admin+"/json", jsonReq("per-ip-2", "b"))
		codes = append(codes, code)
	}
	if codes[0] != http.StatusOK || codes[1] != http.StatusTooManyRequests {
		t.Errorf("per-ip-2 after the reload: %v, want [200 429]", codes)
	}

	writeFile(t, cfg, `{"rules": [{"name": "broken"`)
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	if l := p.waitLog("configuration not reloaded: the previous one stays", 1); l["level"] != "ERROR" || l["error"] == nil || l["error"] == "" {
		t.Errorf("refused reload line: %v", l)
	}
	if code, _ := post(t, p.admin+"/json", jsonReq("per-ip-2", "b")); code != http.StatusTooManyRequests {
		t.Errorf("per-ip-2 after a refused reload: %d, want 429 (the configuration in use stays)", code)
	}
	_, metrics := get(t, p.admin+"/metrics")
	for _, want := range []string{`tokengate_rls_config_reloads_total{result="ok"} 1`, `tokengate_rls_config_reloads_total{result="error"} 1`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitLog("shutting down: not ready", 1)
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService"} {
		if st, err := healthCheck(t, conn, svc); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("gRPC health %q while draining: %v %v, want NOT_SERVING", svc, st, err)
		}
	}
	if code, _ := get(t, p.admin+"/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/ready while draining: %d, want 503", code)
	}
	if code, _ := get(t, p.admin+"/live"); code != http.StatusOK {
		t.Errorf("/live while draining: %d, want 200", code)
	}
	rc := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
		Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}); err != nil {
		t.Errorf("a call while draining: %v, want an answer", err)
	}
	select {
	case <-p.exited:
		t.Fatalf("exited during -drain-delay 1h: %v", p.err)
	default:
	}
	// The delay is an hour: the test ends the process (TestSIGTERMExit
	// sees the exit after a short delay).
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.exited
}

// TestSIGTERMExit: with a short -drain-delay the program exits 0 on
// SIGTERM after logging that it stopped.
func TestSIGTERMExit(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	p := startProc(t, "-config", cfg, "-redis", "127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-drain-delay", "10ms")
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Fatal("no exit within 20 s of SIGTERM")
	}
	if p.err != nil {
		t.Fatalf("exit: %v, want status 0\n%s", p.err, p.log())
	}
	p.waitLog("stopped", 1)
}

// startRun runs run in this process with args and returns the gRPC and
// admin addresses; the run ends with the test.
func startRun(t *testing.T, logw io.Writer, args ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	listening := make(chan [2]string, 1)
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, append(args, "-drain-delay", "0"), logw, listening) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("run after shutdown: %v", err)
		}
	})
	select {
	case a := <-listening:
		return a[0], "http://" + a[1]
	case err := <-errc:
		errc <- nil
		t.Fatalf("run: %v", err)
	}
	return "", ""
}

// syncBuffer is a bytes.Buffer safe for the program's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReloadOnChange: a change of the configuration file is reloaded
// without a signal; a broken file is refused and counted.
func TestReloadOnChange(t *testing.T) {
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	var logs syncBuffer
	_, admin := startRun(t, &logs, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s",
		"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-watch-interval", "20ms")
	waitFor(t, "/ready", func() bool { code, _ := get(t, admin+"/ready"); return code == http.StatusOK })
	writeFile(t, cfg, secondConfig)
	waitFor(t, "reload after the file changed", func() bool {
		_, m := get(t, admin+"/metrics")
		return strings.Contains(m, `tokengate_rls_config_reloads_total{result="ok"} 1`)
	})
	if code, _ := post(t, admin+"/json", jsonReq("per-ip-2", "x")); code != http.StatusOK {
		t.Errorf("first per-ip-2: %d", code)
	}
	if code, _ := post(t, admin+"/json", jsonReq("per-ip-2", "x")); code != http.StatusTooManyRequests {
		t.Errorf("second per-ip-2: %d, want 429: the new rule decides", code)
	}
	writeFile(t, cfg, `{"rules": 7}`)
	waitFor(t, "refused reload after the file broke", func() bool {
		_, m := get(t, admin+"/metrics")
		return strings.Contains(m, `tokengate_rls_config_reloads_total{result="error"} 1`)
	})
	if code, _ := post(t, admin+"/json", jsonReq("per-ip-2", "x")); code != http.StatusTooManyRequests {
		t.Errorf("per-ip-2 after the broken file: %d, want 429 (the configuration in use stays)", code)
	}
	if !strings.Contains(logs.String(), "configuration not reloaded") || !strings.Contains(logs.String(), "trigger=\"file changed\"") {
		t.Errorf("no refusal logged:\n%s", logs.String())
	}
}

// TestLiveReady: with Redis down the process is live and not ready, and
// the gRPC health service says NOT_SERVING.
func TestLiveReady(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	grpcAddr, admin := startRun(t, io.Discard, "-config", cfg, "-redis", "127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0")
	if code, _ := get(t, admin+"/live"); code != http.StatusOK {
		t.Errorf("/live with Redis down: %d, want 200", code)
	}
	if code, _ := get(t, admin+"/ready"); code != http.StatusServiceUnavailable {
		t.Errorf("/ready with Redis down: %d, want 503", code)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if st, err := healthCheck(t, conn, ""); err != nil || st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health with Redis down: %v %v, want NOT_SERVING", st, err)
	}
	if _, err := healthCheck(t, conn, "no.such.Service"); status.Code(err) != codes.NotFound {
		t.Errorf("gRPC health of an unknown service: %v, want NotFound", err)
	}
}

// TestRefusedByGRPC: a call gRPC refuses before the service sees it (a
// 5 MiB message, above gRPC's 4 MiB limit) is counted.
func TestRefusedByGRPC(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	grpcAddr, admin := startRun(t, io.Discard, "-config", cfg, "-redis", "127.0.0.1:1", "-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0")
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	big := strings.Repeat("x", 5<<20)
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
		Descriptors: []*commonrl.RateLimitDescriptor{{Entries: []*commonrl.RateLimitDescriptor_Entry{{Key: "k", Value: big}}}}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 5 MiB call: %v, want ResourceExhausted", err)
	}
	_, m := get(t, admin+"/metrics")
	for _, want := range []string{
		`tokengate_rls_grpc_calls_total{code="ResourceExhausted",method="ShouldRateLimit"} 1`,
		`tokengate_rls_grpc_call_duration_seconds_count{code="ResourceExhausted",method="ShouldRateLimit"} 1`,
		`tokengate_rls_grpc_calls_in_flight 0`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestRedisErrorsLogged: Redis failing under calls is counted by cause
// and node and logged, in fewer lines than failures (rate-limited) that
// say what failed.
func TestRedisErrorsLogged(t *testing.T) {
	redis := redistest.Start(t)
	cfg := filepath.Join(t.TempDir(), "rls.json")
	writeFile(t, cfg, configJSON)
	var logs syncBuffer
	_, admin := startRun(t, &logs, "-config", cfg, "-redis", redis.Addr, "-redis-timeout", "5s",
		"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-log-format", "json")
	waitFor(t, "/ready", func() bool { code, _ := get(t, admin+"/ready"); return code == http.StatusOK })
	redis.Kill()
	const calls = 40
	failed := 0
	for i := range calls {
		if code, _ := post(t, admin+"/json", jsonReq("per-ip", "k"+string(rune('a'+i%26)))); code == http.StatusServiceUnavailable {
			failed++
		}
	}
	if failed < calls/2 {
		t.Fatalf("%d of %d calls failed with Redis down", failed, calls)
	}
	var lines []map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == "redis round trip failed" {
			lines = append(lines, m)
		}
	}
	if len(lines) == 0 || len(lines) >= failed {
		t.Fatalf("%d error lines for %d failures, want at least one and fewer:\n%s", len(lines), failed, logs.String())
	}
	if l := lines[0]; l["level"] != "ERROR" || l["node"] != redis.Addr || l["cause"] == "" || l["error"] == "" {
		t.Errorf("error line does not say what failed: %v", l)
	}
	_, m := get(t, admin+"/metrics")
	if !strings.Contains(m, `tokengate_rls_redis_errors_total{cause="`) || !strings.Contains(m, `node="`+redis.Addr+`"}`) {
		t.Errorf("/metrics: no Redis errors by cause and node:\n%s", m)
	}
}
