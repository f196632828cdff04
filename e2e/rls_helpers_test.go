package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/envoyconf"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/envoyrl"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/internal/testsupport/testport"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// rlsBootstrap is the part of an envoy.yaml the local host reads for
// callouts: a STATIC cluster named "ratelimit" with HTTP/2 (prior
// knowledge), as Envoy needs for gRPC, at addr.
func rlsBootstrap(addr string) string {
	host, port, _ := strings.Cut(addr, ":")
	return `static_resources:
  clusters:
  - name: ratelimit
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
    load_assignment:
      cluster_name: ratelimit
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: ` + host + `, port_value: ` + port + `}
`
}

// rlsBootstrapHTTP1 is rlsBootstrap without protocol options: an HTTP/1.1
// cluster "ratelimit", for settings.rls.protocol "json".
func rlsBootstrapHTTP1(addr string) string {
	host, port, _ := strings.Cut(addr, ":")
	return `static_resources:
  clusters:
  - name: ratelimit
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: ratelimit
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: ` + host + `, port_value: ` + port + `}
`
}

// startClusterHost runs the real module with cfg and the clusters of the
// bootstrap, through envoyconf as tokengate-local does with -envoy. When
// the test ends, after the host is closed (every callout reported or
// dropped), it checks that the filter never continued a stream that was
// gone or already continued (wasmhost.Host.StrayContinues).
func startClusterHost(t testing.TB, cfg, bootstrap string, workers int) (*wasmhost.Host, *httptest.Server) {
	t.Helper()
	cls, err := envoyconf.Clusters([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]wasmhost.Cluster{}
	for name, c := range cls {
		clusters[name] = wasmhost.Cluster{Address: c.Address, HTTP2: c.HTTP2}
	}
	if _, ok := clusters["ratelimit"]; !ok {
		t.Fatalf("bootstrap: no cluster ratelimit in %v", clusters)
	}
	var h *wasmhost.Host
	t.Cleanup(func() { // registered before startHost's, so it runs after the host is closed
		if h != nil && h.StrayContinues() != 0 {
			t.Errorf("the filter called proxy_continue_stream %d times on a stream gone or already continued", h.StrayContinues())
		}
	})
	h, srv := startHost(t, wasmhost.Options{PluginConfig: []byte(cfg), Clusters: clusters, Workers: workers})
	return h, srv
}

// envoyRatelimit returns the envoyproxy/ratelimit binary (tools/ratelimit.sh
// installs it the first time). When it cannot be installed (no network for
// the module proxy) the test is skipped, unless $TOKENGATE_REQUIRE_REDIS is
// set, as .ci/run does.
func envoyRatelimit(t testing.TB) string {
	t.Helper()
	bin, err := envoyrl.Install()
	if err != nil {
		if os.Getenv("TOKENGATE_REQUIRE_REDIS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return bin
}

// startEnvoyRatelimit starts envoyproxy/ratelimit on redisAddr with the
// domain configuration yaml, stopped when the test ends.
func startEnvoyRatelimit(t testing.TB, redisAddr, yaml string, headers bool) *envoyrl.Server {
	t.Helper()
	srv, err := envoyrl.Start(envoyRatelimit(t), envoyrl.Options{Redis: redisAddr, Config: yaml, ResponseHeaders: headers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// getKey sends GET / with x-api-key: key and returns the response (body
// read and closed).
func getKey(t testing.TB, srv *httptest.Server, key string) (*http.Response, string) {
	t.Helper()
	return get(t, srv, "/", map[string]string{"x-api-key": key})
}

// getURL sends GET url with header and returns the response (body read and
// closed).
func getURL(t testing.TB, url string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

var (
	rlsBuildOnce sync.Once
	rlsBin       string
	rlsBuildErr  error
)

// tokengateRLS builds cmd/tokengate-rls once per test process, into a
// directory removed by TestMain's cleanup of the module build.
func tokengateRLS(t testing.TB) string {
	t.Helper()
	rlsBuildOnce.Do(func() {
		root, err := wasmbuild.Root()
		if err != nil {
			rlsBuildErr = err
			return
		}
		dir, err := os.MkdirTemp("", "tokengate-rls")
		if err != nil {
			rlsBuildErr = err
			return
		}
		rlsBin = filepath.Join(dir, "tokengate-rls")
		cmd := exec.Command("go", "build", "-o", rlsBin, "./cmd/tokengate-rls")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			rlsBuildErr = fmt.Errorf("building cmd/tokengate-rls: %v\n%s", err, out)
		}
	})
	if rlsBuildErr != nil {
		t.Fatal(rlsBuildErr)
	}
	return rlsBin
}

// rlsProc is a running tokengate-rls.
type rlsProc struct {
	Addr, Admin string
	cmd         *exec.Cmd
	out         *syncBuffer
	done        chan struct{}
	waitErr     error // the exit status, once done is closed
}

// testRedisTimeout is the -redis-timeout the tests give tokengate-rls
// unless they pass their own: not the product's 25 ms, which a loaded
// machine exceeds (a settlement or a decision would then fail and the
// test count the wrong tokens), but a bound no healthy round trip comes
// near. A test about the Redis timeout passes its own -redis-timeout, and
// makes Redis slow deterministically (a frozen or killed Redis), so its
// verdict does not depend on the machine's speed either.
const testRedisTimeout = "5s"

// startTokengateRLS runs tokengate-rls with the plugin configuration cfg on
// Redis at redisAddr (host:port), on free loopback ports, until the test
// ends; it returns once /ready answers 200. Its -redis-timeout is
// testRedisTimeout unless extra sets one (a later flag wins). Writes
// (settlements, lease calls) are open to any caller
// (-allow-unauthenticated-writes), as before the trust model: the tests
// of who may write use startTokengateRLSAuth.
func startTokengateRLS(t testing.TB, cfg, redisAddr string, extra ...string) *rlsProc {
	t.Helper()
	return startTokengateRLSAuth(t, cfg, redisAddr, append([]string{"-allow-unauthenticated-writes"}, extra...)...)
}

// startTokengateRLSAuth is startTokengateRLS with writes as the flags in
// extra say: refused unless they authenticate proxies
// (docs/rls.md#trust-model).
func startTokengateRLSAuth(t testing.TB, cfg, redisAddr string, extra ...string) *rlsProc {
	t.Helper()
	bin := tokengateRLS(t)
	path := filepath.Join(t.TempDir(), "rls.json")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &rlsProc{Addr: freeAddr(t), Admin: freeAddr(t), out: &syncBuffer{}, done: make(chan struct{})}
	args := append([]string{"-config", path, "-redis", redisAddr, "-listen", p.Addr, "-admin", p.Admin,
		"-redis-timeout", testRedisTimeout, "-drain-delay", "0"}, extra...) // no need to wait for health checks here
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.Stop() // a test that cares checks Stop's result itself
		if t.Failed() {
			t.Logf("tokengate-rls output:\n%s", p.out.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + p.Admin + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.done:
			t.Fatalf("tokengate-rls exited:\n%s", p.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("tokengate-rls not ready after 20 s:\n%s", p.out.String())
		}
	}
}

// Stop ends the process (SIGTERM, then SIGKILL after a bound) and returns
// its exit status: nil for a clean exit 0, an error for anything else
// (killed, non-zero); idempotent. The bound is the service's -drain (5 s)
// plus slack: a process that has not exited by then does not shut down.
func (p *rlsProc) Stop() error {
	select {
	case <-p.done:
		return p.waitErr
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT) // in case a test froze it
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("tokengate-rls did not exit within 15 s of SIGTERM (killed: %v)", p.waitErr)
	}
	return p.waitErr
}

// Freeze stops the process with SIGSTOP and returns once all its threads
// are stopped: its sockets accept connections but nothing answers, a
// service slower than any timeout, however slow the machine (a bare
// SIGSTOP lets it run on, and answer, until the signal is handled). Thaw
// resumes it.
func (p *rlsProc) Freeze(t testing.TB) {
	t.Helper()
	if err := redistest.Freeze(p.cmd.Process); err != nil {
		t.Fatalf("freezing tokengate-rls: %v", err)
	}
}

// Thaw resumes a frozen process.
func (p *rlsProc) Thaw() { _ = redistest.Thaw(p.cmd.Process) }

// freeAddr returns "127.0.0.1:port" for a port reserved for the test (the
// programs under test take addresses, not listeners; testport).
func freeAddr(t testing.TB) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(testport.Free(t))
}

// tryGet sends GET url with headers and returns the status, or an error:
// for goroutines, which must not call t.Fatal.
func tryGet(url string, headers map[string]string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
