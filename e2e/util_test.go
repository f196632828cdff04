package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
	"github.com/tokengate/tokengate/sharedstate"
)

// t0 is the fake clock's start: a whole second, so that offsets of a
// quarter second stay exact in float64 seconds.
var t0 = time.Unix(1_700_000_000, 0)

// semantics are the two shared-data behaviours every scenario runs under.
var semantics = []struct {
	name string
	kong bool
}{
	{name: "envoy", kong: false},
	{name: "kong", kong: true},
}

// metric returns the value of the rule's counter, failing if the filter did
// not define it.
func metric(t testing.TB, h *wasmhost.Host, rule, counter string) uint64 {
	t.Helper()
	name := "tokengate.rule." + rule + "." + counter
	v, ok := h.Metric(name)
	if !ok {
		t.Fatalf("metric %s is not defined", name)
	}
	return v
}

// stored is one bucket as found in the shared data.
type stored struct {
	key          string
	tokens, last float64
}

// findBucket returns the bucket of owner (the identity's composite key, e.g.
// the client IP) under rule: either the unbounded key "tb:{rule}:{owner}"
// holding "{tokens}:{last}", or a slot "tb:{rule}:${n}" whose value is
// "{tokens}:{last}:{owner}".
func findBucket(t testing.TB, ms *wasmhost.MemData, rule, owner string) (stored, bool) {
	t.Helper()
	prefix := "tb:" + rule + ":"
	for _, e := range ms.Snapshot(prefix) {
		fields := strings.SplitN(e.Value, ":", 3)
		switch {
		case e.Key == prefix+owner && len(fields) == 2:
		case strings.HasPrefix(e.Key, prefix+"$") && len(fields) == 3 && fields[2] == owner:
		default:
			continue
		}
		tokens, err1 := strconv.ParseFloat(fields[0], 64)
		last, err2 := strconv.ParseFloat(fields[1], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: unparsable value %q", e.Key, e.Value)
		}
		return stored{key: e.Key, tokens: tokens, last: last}, true
	}
	return stored{}, false
}

// bucketKeys returns the keys that hold rule's buckets.
func bucketKeys(ms *wasmhost.MemData, rule string) []string {
	var keys []string
	for _, e := range ms.Snapshot("tb:" + rule + ":") {
		keys = append(keys, e.Key)
	}
	return keys
}

// seconds returns t in seconds since the Unix epoch as the filter stores
// last_refill: its clock reading, floored to the microsecond.
func seconds(t time.Time) float64 { return sharedstate.Quantize(float64(t.UnixNano()) / 1e9) }

// clientFrom returns an HTTP client whose connections come from the
// loopback address ip (127.0.0.0/8 is all loopback on Linux), so the host
// sees ip in source.address through the real connection.
func clientFrom(ip string, conns int) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext:         d.DialContext,
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			DisableCompression:  true,
		},
	}
}

// response is what a test checks of one HTTP exchange.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends a GET of path to srv with the client c and header, and reads the
// whole response.
func do(c *http.Client, srv *httptest.Server, path string, header map[string]string) (response, error) {
	return doBody(c, srv, path, header, "")
}

// doBody is do with a POST of body, or a GET when body is empty.
func doBody(c *http.Client, srv *httptest.Server, path string, header map[string]string, body string) (response, error) {
	method, rd := http.MethodGet, io.Reader(nil)
	if body != "" {
		method, rd = http.MethodPost, strings.NewReader(body)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// mustDo is do for the test goroutine.
func mustDo(t testing.TB, c *http.Client, srv *httptest.Server, path string, header map[string]string) response {
	t.Helper()
	r, err := do(c, srv, path, header)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return r
}

// rateLimitHeaders are the headers an enforced decision adds.
var rateLimitHeaders = []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "RateLimit", "RateLimit-Policy"}

// checkNoRateLimitHeaders fails if r carries any header of a decision.
func checkNoRateLimitHeaders(t testing.TB, step string, r response) {
	t.Helper()
	for _, k := range append(rateLimitHeaders, "Retry-After", "X-Tokengate-Reason", "X-Tokengate-Rule") {
		if v := r.header.Values(k); len(v) > 0 {
			t.Errorf("%s: got %s: %q, want no such header", step, k, v)
		}
	}
}

// hostOpts returns host options for a rule configuration on a fake clock.
func hostOpts(cfg string, kong bool, workers int, clk *wasmhost.FakeClock, st wasmhost.SharedData) wasmhost.Options {
	return wasmhost.Options{
		PluginConfig: []byte(cfg),
		Kong:         kong,
		Workers:      workers,
		Store:        st,
		Walltime:     clk.Walltime,
		Nanotime:     clk.Nanotime,
	}
}

// closeHost is for tests that start a host without startHost.
func closeHost(t testing.TB, h *wasmhost.Host) {
	t.Helper()
	if err := h.Close(context.Background()); err != nil {
		t.Errorf("wasmhost.Close: %v", err)
	}
}

// TestMain removes the module and the tokengate-local and tokengate-rls
// binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	if localBin != "" {
		_ = os.RemoveAll(filepath.Dir(localBin))
	}
	if rlsBin != "" {
		_ = os.RemoveAll(filepath.Dir(rlsBin))
	}
	os.Exit(code)
}
