package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/envoyconf"
	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// clusterSettleConfig has three cluster-scope rules that settle in
// tokengate-rls, by path: an LLM rule charged what the response reports
// (pre_charge 0: the service takes 1 hit at admission; the debt is carried
// in full, as no floor forgives it since issue 22), a login rule that
// counts only 401s, and one that also resets on a 200. The rates are so
// low (the least tokengate accepts) that no refill shows in six decimals
// between two writes of a bucket, so the Redis
// values are exact.
const clusterSettleConfig = `{"rules":[
  {"name":"llm","scope":"cluster","limit_keys":["header:x-api-key"],"match":{"path":"/llm"},
   "algorithm_config":{"tokens_per_second":1e-7,"burst":100,"cost_source":"response_json:/usage/total_tokens","pre_charge":0}},
  {"name":"login","scope":"cluster","limit_keys":["header:x-api-key"],"match":{"path":"/login"},
   "algorithm_config":{"tokens_per_second":3e-9,"burst":3,"count_statuses":[401]}},
  {"name":"relogin","scope":"cluster","limit_keys":["header:x-api-key"],"match":{"path":"/relogin"},
   "algorithm_config":{"tokens_per_second":3e-9,"burst":3,"count_statuses":[401],"reset_on_statuses":[200]}}],
 "settings":{"rls":{"cluster":"ratelimit","timeout_ms":2000,"on_error":"deny"}}}`

// settleUpstream answers /llm?tokens=N with an OpenAI-style usage object,
// and /login and /relogin with 200 when Authorization is "good", else 401.
func settleUpstream() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/llm" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"total_tokens":`+r.URL.Query().Get("tokens")+`}}`)
			return
		}
		if r.Header.Get("Authorization") != "good" {
			w.WriteHeader(401)
			return
		}
		_, _ = io.WriteString(w, "welcome")
	})
}

// startSettleFleetHost runs the module with cfg, the bootstrap's clusters
// and upstream.
func startSettleFleetHost(t *testing.T, cfg, bootstrap string, upstream http.Handler) (*wasmhost.Host, *httptest.Server) {
	t.Helper()
	cls, err := envoyconf.Clusters([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]wasmhost.Cluster{}
	for name, c := range cls {
		clusters[name] = wasmhost.Cluster{Address: c.Address, HTTP2: c.HTTP2}
	}
	return startHost(t, wasmhost.Options{PluginConfig: []byte(cfg), Clusters: clusters, Workers: 2}, proxy.Options{Upstream: upstream})
}

// redisTokens returns the tokens of a bucket in Redis, or "" if the key is
// absent (a full bucket).
func redisTokens(t *testing.T, redis *redistest.Server, key string) string {
	t.Helper()
	v, err := redis.Do("GET", key)
	if err != nil {
		t.Fatalf("GET %s: %v", key, err)
	}
	if v == nil {
		return ""
	}
	s, ok := v.(string)
	if !ok {
		t.Fatalf("GET %s: %T %v", key, v, v)
	}
	return strings.SplitN(s, ":", 2)[0]
}

// TestClusterSettle: cluster-scope rules settle after the response in
// tokengate-rls, through the built module, on a real Redis. A response
// reporting 42 tokens leaves the global bucket at exactly 100 - 42 (1 hit
// at admission, 41 in the settlement); one reporting 2000 takes it into a
// debt of the full 2000 (nothing forgiven: issue 22), and the next request
// gets 429 from the service. Successes of a count_statuses rule are refunded in the service
// (three failures still exhaust it, a success after them gets 429), and a
// reset_on_statuses success deletes the key. One settlement call per
// stream, none failed; the response was never held for it. It runs over
// both protocols: gRPC on an HTTP/2 cluster, and JSON over HTTP/1.1 to the
// service's /json, where the settlement's mark travels as an HTTP header.
//
// The "credential" variants run it against a service that accepts
// settlements only from proxies (docs/rls.md#trust-model): the module sends
// settings.rls.credential with each call, and every settlement applies.
func TestClusterSettle(t *testing.T) {
	t.Run("grpc", func(t *testing.T) { testClusterSettle(t, "grpc", false) })
	t.Run("json", func(t *testing.T) { testClusterSettle(t, "json", false) })
	t.Run("grpc-credential", func(t *testing.T) { testClusterSettle(t, "grpc", true) })
	t.Run("json-credential", func(t *testing.T) { testClusterSettle(t, "json", true) })
}

func testClusterSettle(t *testing.T, protocol string, credential bool) {
	redis := redistest.Start(t)
	cfg := strings.Replace(clusterSettleConfig, `"cluster":"ratelimit"`, `"cluster":"ratelimit","protocol":"`+protocol+`"`, 1)
	var rls *rlsProc
	if credential {
		cfg = strings.Replace(cfg, `"cluster":"ratelimit"`, `"cluster":"ratelimit","credential":"`+trustCredential+`"`, 1)
		rls = startTokengateRLSAuth(t, cfg, redis.Addr, "-credential-file", credentialFile(t, "an-older-credential-being-rotated", trustCredential))
	} else {
		rls = startTokengateRLS(t, cfg, redis.Addr)
	}
	bootstrap := rlsBootstrap(rls.Addr)
	if protocol == "json" {
		bootstrap = rlsBootstrapHTTP1(rls.Admin)
	}
	h, srv := startSettleFleetHost(t, cfg, bootstrap, settleUpstream())
	c := srv.Client()
	n := uint64(0) // streams ended
	calls := uint64(0)
	step := func(path, key, auth string, want int) response {
		t.Helper()
		hd := map[string]string{"x-api-key": key}
		if auth != "" {
			hd["Authorization"] = auth
		}
		r := mustDo(t, c, srv, path, hd)
		if r.status != want {
			t.Fatalf("%s (%s): got %d, want %d: %s", path, key, r.status, want, r.body)
		}
		n++
		waitStreamsEnded(t, h, n)
		return r
	}
	// settled waits until the module has sent want settlement calls in all
	// and Redis holds tokens for key (the answers come after the response).
	settled := func(key, tokens string, wantCalls uint64) {
		t.Helper()
		var got string
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if got = redisTokens(t, redis, key); got == tokens {
				break
			}
		}
		if got != tokens {
			t.Fatalf("%s: tokens %q, want %q", key, got, tokens)
		}
		if v, _ := h.Metric("tokengate.rls_settle_calls"); v != wantCalls {
			t.Errorf("rls_settle_calls: got %d, want %d", v, wantCalls)
		}
	}

	t.Run("usage charged exactly", func(t *testing.T) {
		step("/llm?tokens=42", "k1", "", 200)
		calls++
		settled("tb:{llm:k1}", "58.000000", calls)
		step("/llm?tokens=2000", "k1", "", 200)
		calls++
		settled("tb:{llm:k1}", "-1942.000000", calls) // 58 - 2000, carried in full
		r := step("/llm?tokens=1", "k1", "", 429)
		if ra, _ := strconv.Atoi(r.header.Get("Retry-After")); ra < 1 {
			t.Errorf("429 in debt: Retry-After %q", r.header.Get("Retry-After"))
		}
		if got := redisTokens(t, redis, "tb:{llm:k1}"); got != "-1942.000000" {
			t.Errorf("a rejected request changed the bucket: %q", got)
		}
		if got := metric(t, h, "llm", "settle_charged"); got != 2 {
			t.Errorf("settle_charged: got %d, want 2", got)
		}
	})

	t.Run("count_statuses refunds successes in the service", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			step("/login", "k2", "good", 200)
			calls++
			settled("tb:{login:k2}", "3.000000", calls)
		}
		for i := 0; i < 3; i++ {
			step("/login", "k2", "bad", 401)
		}
		if got := redisTokens(t, redis, "tb:{login:k2}"); got != "0.000000" {
			t.Fatalf("after 3 failures: %q, want 0", got)
		}
		step("/login", "k2", "good", 429) // even valid credentials
		if got := metric(t, h, "login", "settle_refunded"); got != 5 {
			t.Errorf("settle_refunded: got %d, want 5", got)
		}
	})

	t.Run("reset_on_statuses clears the key", func(t *testing.T) {
		step("/relogin", "k3", "bad", 401)
		step("/relogin", "k3", "bad", 401)
		if got := redisTokens(t, redis, "tb:{relogin:k3}"); got != "1.000000" {
			t.Fatalf("after 2 failures: %q, want 1", got)
		}
		step("/relogin", "k3", "good", 200)
		calls++
		settled("tb:{relogin:k3}", "", calls)
		if got := metric(t, h, "relogin", "settle_reset"); got != 1 {
			t.Errorf("settle_reset: got %d, want 1", got)
		}
	})

	if v, _ := h.Metric("tokengate.rls_settle_errors"); v != 0 {
		t.Errorf("rls_settle_errors: got %d, want 0", v)
	}
	if v, _ := h.Metric("tokengate.rls_errors"); v != 0 {
		t.Errorf("rls_errors: got %d, want 0", v)
	}
}

// TestClusterSettleFailureCounted: a settlement the service refuses (its
// configuration has the rule without a response cost, so it does not
// settle) is counted in tokengate.rls_settle_errors, and the response it
// belonged to was 200 all the same: nothing waits for a settlement.
func TestClusterSettleFailureCounted(t *testing.T) {
	redis := redistest.Start(t)
	service := strings.Replace(clusterSettleConfig, `,"cost_source":"response_json:/usage/total_tokens","pre_charge":0`, "", 1)
	rls := startTokengateRLS(t, service, redis.Addr)
	h, srv := startSettleFleetHost(t, clusterSettleConfig, rlsBootstrap(rls.Addr), settleUpstream())
	if r := mustDo(t, srv.Client(), srv, "/llm?tokens=42", map[string]string{"x-api-key": "k1"}); r.status != 200 {
		t.Fatalf("got %d, want 200", r.status)
	}
	waitFor(t, func() bool { v, _ := h.Metric("tokengate.rls_settle_errors"); return v == 1 })
	if v, _ := h.Metric("tokengate.rls_settle_calls"); v != 1 {
		t.Errorf("rls_settle_calls: got %d, want 1", v)
	}
	if got := redisTokens(t, redis, "tb:{llm:k1}"); got != "99.000000" {
		t.Errorf("tokens: %q, want 99 (the admission's hit only)", got)
	}
}

// envoyRLSettleConfig is envoyproxy/ratelimit's domain for the rules of
// TestClusterSettleAgainstEnvoyRatelimit: hour windows, per key.
const envoyRLSettleConfig = `domain: tokengate
descriptors:
  - key: tokengate_rule
    value: llm
    descriptors:
      - key: key
        rate_limit: {unit: hour, requests_per_unit: 50}
  - key: tokengate_rule
    value: login
    descriptors:
      - key: key
        rate_limit: {unit: hour, requests_per_unit: 3}
`

// TestClusterSettleAgainstEnvoyRatelimit: what docs/rls.md says of
// envoyproxy/ratelimit as the service of settling rules. Extra hits are
// counted (a response reporting 10 costs 10 of the window's 50, one
// reporting 45 then exhausts it), and refunds are impossible: the refund
// descriptors match no limit and change nothing, so every success of a
// count_statuses rule counts, and the settlement calls do not fail.
func TestClusterSettleAgainstEnvoyRatelimit(t *testing.T) {
	redis := redistest.Start(t)
	rl := startEnvoyRatelimit(t, redis.Addr, envoyRLSettleConfig, false)
	cfg := strings.Replace(clusterSettleConfig, `"on_error":"deny"`, `"on_error":"deny","domain":"tokengate"`, 1)
	h, srv := startSettleFleetHost(t, cfg, rlsBootstrap(rl.GRPC), settleUpstream())
	c := srv.Client()
	n := uint64(0) // requests, each with one admission call
	for attempt := 0; attempt < 2; attempt++ {
		t0 := time.Now()
		key := "k" + strconv.FormatInt(t0.UnixNano(), 36)
		var codes []int
		for _, q := range []struct{ path, auth string }{
			{"/llm?tokens=10", ""}, {"/llm?tokens=45", ""}, {"/llm?tokens=1", ""}, // 10, then 55 of 50
			{"/login", "good"}, {"/login", "good"}, {"/login", "good"}, {"/login", "good"}, // never refunded
		} {
			r := mustDo(t, c, srv, q.path, map[string]string{"x-api-key": key, "Authorization": q.auth})
			codes = append(codes, r.status)
			n++
			waitStreamsEnded(t, h, n)
			// Every call answered (one admission per request, and the
			// settlements sent at the streams' ends) before the next
			// request is decided.
			waitFor(t, func() bool {
				settles, _ := h.Metric("tokengate.rls_settle_calls")
				return h.GuestCalls()["proxy_on_http_call_response"] == n+settles
			})
		}
		if !sameHour(t0, time.Now()) {
			continue // the fixed window rolled over mid-test: try again
		}
		if want := []int{200, 200, 429, 200, 200, 200, 429}; !slices.Equal(codes, want) {
			t.Fatalf("codes %v, want %v", codes, want)
		}
		if v, _ := h.Metric("tokengate.rls_settle_errors"); v != 0 {
			t.Errorf("rls_settle_errors: got %d, want 0 (the service answers OK, applying nothing)", v)
		}
		return
	}
	t.Fatal("two window edges in a row")
}
