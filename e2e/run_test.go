package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// syncBuffer is a bytes.Buffer safe for a child process writing and a test
// reading at once.
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

// parsePrometheus returns the samples of a Prometheus text exposition,
// name (with labels) → value, and the declared type of each name.
func parsePrometheus(t testing.TB, text string) (samples map[string]float64, types map[string]string) {
	t.Helper()
	samples, types = map[string]float64{}, map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			types[name] = typ
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("bad sample line %q", line)
		}
		samples[line[:i]] = v
	}
	return samples, types
}

// repoRoot is the directory holding go.mod.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := wasmbuild.Root()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

var (
	localOnce sync.Once
	localBin  string
	localErr  error
)

// buildLocal builds cmd/tokengate-local once per test process.
func buildLocal(t testing.TB) string {
	t.Helper()
	root := repoRoot(t)
	localOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tokengate-local-")
		if err != nil {
			localErr = err
			return
		}
		localBin = filepath.Join(dir, "tokengate-local")
		build := exec.Command("go", "build", "-o", localBin, "./cmd/tokengate-local")
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			localErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if localErr != nil {
		t.Fatal(localErr)
	}
	return localBin
}

// local is a running tokengate-local.
type local struct {
	cmd            *exec.Cmd
	exited         chan error
	stdout, stderr *syncBuffer
	base, admin    string // http://host:port of the proxy and the admin listener
}

// startLocal runs tokengate-local as `make run` does, with the built module
// and the repository's envoy.yaml, on free loopback ports, and waits until
// it has printed both addresses. The process is killed at cleanup if the
// test has not stopped it.
func startLocal(t *testing.T) *local {
	t.Helper()
	loadModule(t) // builds the module, or fails the test
	wasm, _ := wasmbuild.Path()
	l := &local{exited: make(chan error, 1), stdout: &syncBuffer{}, stderr: &syncBuffer{}}
	l.cmd = exec.Command(buildLocal(t), "-wasm", wasm, "-envoy", filepath.Join(repoRoot(t), "envoy.yaml"),
		"-listen", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-workers", "2")
	l.cmd.Stdout, l.cmd.Stderr = l.stdout, l.stderr
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { l.exited <- l.cmd.Wait() }()
	t.Cleanup(func() {
		if l.cmd.ProcessState == nil {
			_ = l.cmd.Process.Kill()
			<-l.exited
		}
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", l.stdout.String(), l.stderr.String())
		}
	})
	listenRe := regexp.MustCompile(`listening on (http://\S+)`)
	adminRe := regexp.MustCompile(`metrics: (http://\S+)/stats`)
	for deadline := time.Now().Add(30 * time.Second); l.base == "" || l.admin == ""; {
		if m := listenRe.FindStringSubmatch(l.stdout.String()); m != nil {
			l.base = m[1]
		}
		if m := adminRe.FindStringSubmatch(l.stdout.String()); m != nil {
			l.admin = m[1]
		}
		select {
		case err := <-l.exited:
			t.Fatalf("tokengate-local exited before serving: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("tokengate-local did not print its addresses within 30 s")
		}
	}
	return l
}

// interrupt sends SIGINT and checks that the process exits with status 0
// within 10 s.
func (l *local) interrupt(t *testing.T) {
	t.Helper()
	if err := l.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-l.exited:
		if err != nil {
			t.Errorf("exit after SIGINT: %v, want status 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tokengate-local still running 10 s after SIGINT")
	}
}

// TestMakeRun smoke-tests what `make run` starts: the tokengate-local
// command is built and run with the freshly built module and the repository's
// envoy.yaml on free loopback ports. Over a real HTTP client, "/" answers
// 200s then 429s (the "edge" policy: rps 5, burst 10 per client IP); the
// admin /stats shows the per-ip counters with the values seen and the
// shadow rule per-ip-strict counting every request; /shared_data lists the
// buckets; SIGINT stops it with exit status 0.
func TestMakeRun(t *testing.T) {
	l := startLocal(t)
	base, admin := l.base, l.admin
	for _, want := range []string{`plugin "tokengate" from`, "per-ip, tier-enterprise, tier-pro, tier-free, api-fallback, search-cost, per-ip-strict", "Envoy semantics"} {
		if !strings.Contains(l.stdout.String(), want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	fetch := func(url string) (int, http.Header, string) { t.Helper(); return fetchURL(t, url) }
	if code, _, body := fetch(admin + "/ready"); code != 200 || body != "LIVE\n" {
		t.Fatalf("/ready: got %d %q", code, body)
	}

	// 200s, then 429s.
	start := time.Now()
	var statuses []int
	admitted, rejected := 0, 0
	for len(statuses) < 30 && rejected < 3 {
		code, h, body := fetch(base + "/")
		statuses = append(statuses, code)
		switch code {
		case 200:
			admitted++
			if h.Get("RateLimit-Policy") != `"per-ip";q=10;w=2` {
				t.Errorf("request %d: RateLimit-Policy %q", len(statuses), h.Get("RateLimit-Policy"))
			}
		case 429:
			rejected++
			if h.Get("X-Tokengate-Rule") != "per-ip" || !strings.Contains(body, `"rule":"per-ip"`) {
				t.Errorf("request %d: 429 from %q: %q", len(statuses), h.Get("X-Tokengate-Rule"), body)
			}
		default:
			t.Fatalf("request %d: status %d %q", len(statuses), code, body)
		}
	}
	elapsed := time.Since(start)
	if rejected == 0 {
		t.Fatalf("no 429 in %v", statuses)
	}
	for i, code := range statuses[:10] {
		if code != 200 {
			t.Errorf("request %d of the burst: got %d, want 200 (statuses %v)", i, code, statuses)
		}
	}
	if max := 10 + 5*elapsed.Seconds(); float64(admitted) > max {
		t.Errorf("admitted %d in %v, more than burst + rate × elapsed = %.2f", admitted, elapsed, max)
	}

	// Metrics.
	for _, path := range []string{"/stats", "/stats/prometheus"} {
		code, h, body := fetch(admin + path)
		if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/plain; version=0.0.4") {
			t.Fatalf("%s: got %d %q", path, code, h.Get("Content-Type"))
		}
		samples, types := parsePrometheus(t, body)
		total := float64(len(statuses))
		for name, want := range map[string]float64{
			"tokengate_rule_per_ip_allowed":            float64(admitted),
			"tokengate_rule_per_ip_rejected":           float64(rejected),
			"tokengate_rule_per_ip_fail_open":          0,
			"tokengate_rule_tier_pro_allowed":          0, // /api/ only
			"tokengate_rule_search_cost_allowed":       0,
			"tokengate_rule_per_ip_strict_fail_open":   0,
			"tokengate_rule_per_ip_strict_rejected":    0, // shadow: never rejects
			"tokengate_rule_per_ip_strict_cas_retries": samples["tokengate_rule_per_ip_strict_cas_retries"],
		} {
			got, ok := samples[name]
			if !ok || got != want || types[name] != "counter" {
				t.Errorf("%s %s: got %v (present %v, type %q), want %v", path, name, got, ok, types[name], want)
			}
		}
		// The shadow rule sees every request: at most its burst (4) plus
		// what 2/s refilled would have been allowed.
		sa, sr := samples["tokengate_rule_per_ip_strict_allowed"], samples["tokengate_rule_per_ip_strict_shadow_rejected"]
		if sa+sr != total || sa < 4 || sa > 4+2*elapsed.Seconds() {
			t.Errorf("%s: shadow per-ip-strict allowed %v + shadow_rejected %v, want %v in all, allowed within [4, 4 + 2 × %v]",
				path, sa, sr, total, elapsed)
		}
	}

	// Shared data.
	code, _, dump := fetch(admin + "/shared_data")
	if code != 200 {
		t.Fatalf("/shared_data: got %d", code)
	}
	// Issue 22 item 11: identities and the slot seed are redacted by
	// default (the README's tour shows this form), so the owner is a
	// digest and the seed "(redacted)", where they were 127.0.0.1 and hex.
	for _, re := range []string{
		`(?m)^# identities and the slot seed redacted \(tokengate-local -show-identities shows them\)$`,
		`(?m)^# [0-9]+ keys, [0-9]+ bytes of keys and values$`,
		`(?m)^"tokengate:seed" cas=[0-9]+ value="\(redacted\)"$`,
		`(?m)^"tb:per-ip:\$[0-9]+" cas=[0-9]+ value="[0-9.]+:[0-9.]+:#[0-9a-f]{12}"$`,
		`(?m)^"shadow:tb:per-ip-strict:\$[0-9]+" cas=[0-9]+ value="[0-9.]+:[0-9.]+:#[0-9a-f]{12}"$`,
	} {
		if !regexp.MustCompile(re).MatchString(dump) {
			t.Errorf("/shared_data does not match %s:\n%s", re, dump)
		}
	}
	if strings.Contains(dump, "127.0.0.1") {
		t.Errorf("/shared_data shows the client's address:\n%s", dump)
	}

	// Ctrl-C.
	l.interrupt(t)
	if !strings.Contains(l.stdout.String(), "tokengate-local: shutting down") {
		t.Errorf("stdout lacks the shutdown line")
	}
	t.Logf("statuses %v in %v", statuses, elapsed.Round(time.Millisecond))
}

// TestMakeRunListsFallbackRule pins a bug in tokengate-local's start-up
// banner: envoy.yaml has 7 rules (the filter logs "configured 7 rules"), but
// the banner's "rules:" line omits the api policy's fallback_limit, named
// "api-fallback" by default, although it limits requests and has its own
// counters (tokengate_rule_api_fallback_*).
func TestMakeRunListsFallbackRule(t *testing.T) {
	l := startLocal(t)
	if !strings.Contains(l.stderr.String(), "configured 7 rules") {
		t.Errorf("the filter did not log \"configured 7 rules\"")
	}
	_, _, body := fetchURL(t, l.admin+"/stats")
	if !strings.Contains(body, "tokengate_rule_api_fallback_allowed 0") {
		t.Errorf("/stats has no tokengate_rule_api_fallback_allowed")
	}
	if m := regexp.MustCompile(`rules: (.*)`).FindStringSubmatch(l.stdout.String()); m == nil || !strings.Contains(m[1], "api-fallback") {
		t.Errorf("the banner's rules line omits the fallback limit: got %q, want it to list api-fallback (7 rules)", m)
	}
	l.interrupt(t)
}

// fetchURL GETs url and returns the status, headers and body.
func fetchURL(t testing.TB, url string) (int, http.Header, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}
