package e2e

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/envoyconf"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// jsonRule is a cluster rule decided over settings.rls.protocol "json" by
// the service of the HTTP/1.1 cluster "ratelimit".
func jsonRule(name string, burst int, onError string) string {
	return `{"rules":[{"name":"` + name + `","scope":"cluster","limit_keys":["header:x-api-key"],
	  "algorithm_config":{"rps":0.001,"burst":` + strconv.Itoa(burst) + `}}],
	  "settings":{"rls":{"cluster":"ratelimit","protocol":"json","timeout_ms":1000,"on_error":"` + onError + `"}}}`
}

// TestJSONProtocolBootstrap: the bootstrap of the JSON tests has an
// HTTP/1.1 cluster, so the local host's call really goes over HTTP/1.1.
func TestJSONProtocolBootstrap(t *testing.T) {
	cls, err := envoyconf.Clusters([]byte(rlsBootstrapHTTP1("127.0.0.1:9")))
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := cls["ratelimit"]; !ok || c.HTTP2 || c.Address != "127.0.0.1:9" {
		t.Fatalf("cluster %+v, want an HTTP/1.1 cluster at 127.0.0.1:9", c)
	}
}

// TestFilterJSONAgainstTokengateRLS: the built module with protocol "json"
// against tokengate-rls's /json (its admin listener) on a real Redis, over
// an HTTP/1.1 cluster: the burst passes, then 429 naming the rule; the
// service's metrics show it decided every request; with the service gone,
// on_error applies.
func TestFilterJSONAgainstTokengateRLS(t *testing.T) {
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, jsonRule("json", 3, "deny"), redis.Addr)
	_, srv := startClusterHost(t, jsonRule("json", 3, "deny"), rlsBootstrapHTTP1(rls.Admin), 2)
	var codes []int
	var last *http.Response
	for range 5 {
		resp, _ := getKey(t, srv, "alice")
		codes = append(codes, resp.StatusCode)
		last = resp
	}
	if want := []int{200, 200, 200, 429, 429}; !slices.Equal(codes, want) {
		t.Fatalf("codes %v, want %v", codes, want)
	}
	if last.Header.Get("x-tokengate-rule") != "json" || last.Header.Get("retry-after") == "" {
		t.Errorf("429 headers %v, want the rule and a Retry-After", last.Header)
	}
	if last.Header.Get("ratelimit") == "" {
		t.Errorf("429 without the service's RateLimit header: %v", last.Header)
	}
	_, body := getURL(t, "http://"+rls.Admin+"/metrics", nil)
	for _, want := range []string{`tokengate_rls_decisions_total{code="ok",rule="json"} 3`, `tokengate_rls_decisions_total{code="over_limit",rule="json"} 2`} {
		if !strings.Contains(body, want) {
			t.Errorf("the service's metrics lack %s:\n%s", want, body)
		}
	}
	rls.Stop()
	if resp, body := getKey(t, srv, "bob"); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "rls_error") {
		t.Errorf("service down: %d %q, want on_error deny's 503", resp.StatusCode, body)
	}
}

// TestFilterJSONAgainstEnvoyRatelimit: the built module with protocol
// "json" against envoyproxy/ratelimit's own /json (its HTTP port) on a real
// Redis: its 200 and 429 answers are read, OVER_LIMIT rejects, keys are
// isolated, and its Redis gone (its /json answers 400) follows on_error.
func TestFilterJSONAgainstEnvoyRatelimit(t *testing.T) {
	redis := redistest.Start(t)
	rl := startEnvoyRatelimit(t, redis.Addr, envoyRLConfig, true)
	cfg := strings.Replace(envoyRLFilter("deny"), `"timeout_ms":1000`, `"timeout_ms":1000,"protocol":"json"`, 1)
	if !strings.Contains(cfg, `"json"`) {
		t.Fatal("the configuration lost its protocol")
	}
	_, srv := startClusterHost(t, cfg, rlsBootstrapHTTP1(rl.HTTP), 2)
	for attempt := 0; attempt < 2; attempt++ {
		t0 := time.Now()
		var codes []int
		var last *http.Response
		suffix := strconv.Itoa(attempt)
		for range 7 {
			resp, _ := getKey(t, srv, "json-"+suffix)
			codes = append(codes, resp.StatusCode)
			last = resp
			if resp.StatusCode == http.StatusOK && resp.Header.Get("ratelimit-limit") != "5" {
				t.Errorf("admitted without the service's RateLimit-Limit: %v", resp.Header)
			}
		}
		other, _ := getKey(t, srv, "other-"+suffix)
		if !sameHour(t0, time.Now()) {
			continue // the fixed window rolled over mid-test: try again
		}
		if want := []int{200, 200, 200, 200, 200, 429, 429}; !slices.Equal(codes, want) {
			t.Fatalf("codes %v, want %v", codes, want)
		}
		if last.Header.Get("x-tokengate-rule") != "per-key" || last.Header.Get("ratelimit-remaining") != "0" {
			t.Errorf("429 headers %v, want the rule and the service's RateLimit-Remaining 0", last.Header)
		}
		if other.StatusCode != http.StatusOK {
			t.Errorf("another key: %d, want 200 (keys are isolated)", other.StatusCode)
		}
		break
	}
	redis.Kill()
	for i := range 2 {
		if resp, body := getKey(t, srv, "json-redis-down"); resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "rls_error") {
			t.Errorf("request %d with the service's Redis down: %d %q, want on_error deny's 503", i, resp.StatusCode, body)
		}
	}
}
