package rls_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// adminConfig has the rules the admin API tests name: token buckets with
// one and two limit keys, one without, a lease-mode rule and a monthly
// quota in Paris time with an identity-carried limit.
const adminConfig = `{
  "bundle_version": 1,
  "settings": {"rls": {"cluster": "rls", "domain": "tokengate"}},
  "policies": [{"id": "main", "spec": {"rules": [
    {"name": "per-key", "scope": "cluster", "limit_keys": ["header:x-api-key"], "algorithm_config": {"tokens_per_second": 1, "burst": 10}},
    {"name": "two", "scope": "cluster", "limit_keys": ["header:x-tenant", "header:x-user"], "algorithm_config": {"tokens_per_second": 1, "burst": 10}},
    {"name": "global", "scope": "cluster", "algorithm_config": {"tokens_per_second": 5, "burst": 50}},
    {"name": "leased", "scope": "cluster", "mode": "lease", "limit_keys": ["header:x-api-key"], "algorithm_config": {"tokens_per_second": 10, "burst": 100}},
    {"name": "monthly", "scope": "cluster", "algorithm": "quota", "limit_keys": ["header:x-api-key"],
     "algorithm_config": {"limit": 1000, "period": "month", "time_zone": "Europe/Paris", "billing_day": 31,
       "limit_source": "header:x-plan-limit", "max_limit": 5000}}
  ]}}]
}`

const (
	adminCred = "admin-credential-0123456789"
	usageCred = "usage-credential-0123456789"
	proxyCred = "proxy-credential-0123456789"
)

// adminEnv is an admin API over a real redis-server.
type adminEnv struct {
	redis *redistest.Server
	url   string
	m     *rls.Metrics
	srv   *rls.Server
}

// startAdmin serves cfgJSON's admin API, admins holding adminCred, the
// usage endpoint usageCred, the proxies proxyCred.
func startAdmin(t *testing.T, cfgJSON string, adminAuth, usageAuth rls.WriteAuth) adminEnv {
	t.Helper()
	rs := redistest.Start(t)
	store := readyStore(t, rs.Addr)
	cfg, err := rls.ParseConfig([]byte(cfgJSON))
	if err != nil {
		t.Fatal(err)
	}
	m := rls.NewMetrics(cfg)
	srv := rls.NewServer(cfg, store, m)
	var proxies rls.WriteAuth
	proxies.AddCredential(proxyCred)
	srv.SetWriteAuth(proxies)
	api := rls.NewAdminAPI(srv, store, rls.NewAdminGate(adminAuth, usageAuth), m)
	hs := httptest.NewServer(api.Handler(rls.AdminHandler(srv, m, nil)))
	t.Cleanup(hs.Close)
	return adminEnv{redis: rs, url: hs.URL, m: m, srv: srv}
}

func credAuth(secrets ...string) rls.WriteAuth { return rls.WriteAuth{}.WithCredentials(secrets) }

// call sends method path with body and the bearer credential cred ("":
// none), and returns the status and the decoded JSON answer.
func (e adminEnv) call(t *testing.T, method, path, cred, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if cred != "" {
		req.Header.Set("authorization", "Bearer "+cred)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %q", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// snapshot is every key of Redis with its value (a hash's fields, a
// string) and whether it expires.
func (e adminEnv) snapshot(t *testing.T) map[string]string {
	t.Helper()
	keys, err := e.redis.Do("KEYS", "*")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, k := range keys.([]any) {
		key := k.(string)
		typ := e.redis.MustDo("TYPE", key).(string)
		var v any
		if typ == "hash" {
			v = e.redis.MustDo("HGETALL", key)
		} else {
			v = e.redis.MustDo("GET", key)
		}
		b, _ := json.Marshal(v)
		out[key] = typ + " " + string(b) + " ttl>0:" + boolStr(e.redis.MustDo("PTTL", key).(int64) > 0)
	}
	return out
}

func boolStr(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// calls is tokengate_rls_admin_calls_total{api, outcome}.
func (e adminEnv) calls(api, outcome string) float64 {
	mfs, err := e.m.Registry().Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tokengate_rls_admin_calls_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["api"] == api && l["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// TestAdminRefusals: every call that is unauthenticated, authenticated
// wrongly, malformed or out of bounds gets its status and a JSON error
// that says what is wrong, is counted by outcome, and changes nothing in
// Redis (an override set before stays as it was, and nothing else
// appears).
func TestAdminRefusals(t *testing.T) {
	e := startAdmin(t, adminConfig, credAuth(adminCred), credAuth(usageCred))
	if st, body := e.call(t, "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 2, "burst": 20}`); st != 200 {
		t.Fatalf("seeding the override: %d %v", st, body)
	}
	before := e.snapshot(t)
	if len(before) != 1 {
		t.Fatalf("after the seed: %v, want one override", before)
	}
	long := strings.Repeat("k", 600)
	cases := []struct {
		name, method, path, cred, body string
		status                         int
		outcome                        string
		errHas                         string
	}{
		{"unauthenticated", "PUT", "/v1/overrides/per-key?key=alice", "", `{"rate": 1000}`, 401, "unauthenticated", "authorization: Bearer"},
		{"unauthenticated read", "GET", "/v1/overrides/per-key?key=alice", "", "", 401, "unauthenticated", "authorization: Bearer"},
		{"wrong token", "PUT", "/v1/overrides/per-key?key=alice", "not-the-admin-credential", `{"rate": 1000}`, 403, "forbidden", "not an admin credential"},
		{"the proxies' token", "PUT", "/v1/overrides/per-key?key=alice", proxyCred, `{"rate": 1000}`, 403, "forbidden", "not an admin credential"},
		{"the usage token", "DELETE", "/v1/overrides/per-key?key=alice", usageCred, "", 403, "forbidden", "only read usage"},
		{"malformed JSON", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 1000`, 400, "bad_request", "malformed JSON"},
		{"not an object", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `[1000]`, 400, "bad_request", "not an override"},
		{"empty body", "PUT", "/v1/overrides/per-key?key=alice", adminCred, ``, 400, "bad_request", "empty body"},
		{"two objects", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 3}{"rate": 4}`, 400, "bad_request", "nothing after it"},
		{"unknown field", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 3, "brust": 30}`, 400, "bad_request", `unknown field "brust"`},
		{"string number", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": "3"}`, 400, "bad_request", "rate: want a number"},
		{"unknown rule", "PUT", "/v1/overrides/nope?key=alice", adminCred, `{"rate": 3}`, 404, "unknown_rule", `no rule "nope"`},
		{"rate above the bound", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 2e9, "burst": 1e10}`, 400, "bad_request", "rate: must be > 0 and <= 1e+09"},
		{"burst above the bound", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"burst": 2e12}`, 400, "bad_request", "burst: must be > 0 and <= 1e+12"},
		{"zero burst", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"burst": 0}`, 400, "bad_request", "burst: must be > 0"},
		{"negative rate", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": -1}`, 400, "bad_request", "rate: must be > 0"},
		{"burst below the rule's rate", "PUT", "/v1/overrides/global?key=", adminCred, `{"burst": 4}`, 400, "bad_request", "below rate 5"},
		{"too slow to refill", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 1e-6, "burst": 1e6}`, 400, "bad_request", "refills within 1e9 seconds"},
		{"a quota's field on a bucket", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"limit": 100}`, 400, "bad_request", "token bucket: its override sets rate and burst"},
		{"no field", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"ttl_seconds": 60}`, 400, "bad_request", "rate or burst"},
		{"fractional ttl", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 3, "ttl_seconds": 1.5}`, 400, "bad_request", "ttl_seconds: a whole number"},
		{"negative ttl", "PUT", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 3, "ttl_seconds": -5}`, 400, "bad_request", "ttl_seconds"},
		{"oversize key", "PUT", "/v1/overrides/per-key?key=" + long, adminCred, `{"rate": 3}`, 400, "bad_request", "key: at most 520 bytes"},
		{"oversize value", "PUT", "/v1/overrides/per-key?value=" + strings.Repeat("v", 5000), adminCred, `{"rate": 3}`, 400, "bad_request", "at most 4096 bytes"},
		{"a key the filter never sends", "PUT", "/v1/overrides/per-key?key=%7Balice%7D", adminCred, `{"rate": 3}`, 400, "bad_request", "not a composite key"},
		{"a key of the wrong arity", "PUT", "/v1/overrides/two?key=acme", adminCred, `{"rate": 3}`, 400, "bad_request", "has 2 limit keys"},
		{"values of the wrong arity", "PUT", "/v1/overrides/two?value=acme", adminCred, `{"rate": 3}`, 400, "bad_request", "give one value= per key, got 1"},
		{"key and value", "PUT", "/v1/overrides/per-key?key=alice&value=alice", adminCred, `{"rate": 3}`, 400, "bad_request", "not both"},
		{"no key", "PUT", "/v1/overrides/per-key", adminCred, `{"rate": 3}`, 400, "bad_request", "name the key"},
		{"an unknown parameter", "PUT", "/v1/overrides/per-key?key=alice&tll=5", adminCred, `{"rate": 3}`, 400, "bad_request", `unknown query parameter "tll"`},
		{"a bucket's fields on a quota", "PUT", "/v1/overrides/monthly?key=alice", adminCred, `{"rate": 3, "burst": 30}`, 400, "bad_request", "is a quota: its override sets limit"},
		{"a quota without limit", "PUT", "/v1/overrides/monthly?key=alice", adminCred, `{"ttl_seconds": 60}`, 400, "bad_request", "limit: required"},
		{"a quota's limit above the bound", "PUT", "/v1/overrides/monthly?key=alice", adminCred, `{"limit": 1.5e12}`, 400, "bad_request", "limit: must be > 0 and <= 1e+12"},
		{"a quota's zero limit", "PUT", "/v1/overrides/monthly?key=alice", adminCred, `{"limit": 0}`, 400, "bad_request", "limit: must be > 0"},
		{"a lease rule", "PUT", "/v1/overrides/leased?key=alice", adminCred, `{"rate": 3}`, 400, "bad_request", "lease mode"},
		{"POST", "POST", "/v1/overrides/per-key?key=alice", adminCred, `{"rate": 3}`, 405, "bad_request", "use GET, PUT or DELETE"},
		{"no rule in the path", "PUT", "/v1/overrides/?key=alice", adminCred, `{"rate": 3}`, 400, "bad_request", "the path is /v1/overrides/<rule>"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := e.calls("overrides", c.outcome)
			st, body := e.call(t, c.method, c.path, c.cred, c.body)
			if st != c.status {
				t.Errorf("status: got %d, want %d (%v)", st, c.status, body)
			}
			msg, _ := body["error"].(string)
			if !strings.Contains(msg, c.errHas) {
				t.Errorf("error: got %q, want it to contain %q", msg, c.errHas)
			}
			if got := e.calls("overrides", c.outcome) - n; got != 1 {
				t.Errorf("tokengate_rls_admin_calls_total{outcome=%q} rose by %v, want 1", c.outcome, got)
			}
			if after := e.snapshot(t); !reflect.DeepEqual(after, before) {
				t.Errorf("redis changed:\n got %v\nwant %v", after, before)
			}
		})
	}
}

// TestAdminOff: without an admin credential, every endpoint answers 403
// naming the flag that turns it on, even to a caller with the proxies'
// credential; nothing reaches Redis.
func TestAdminOff(t *testing.T) {
	e := startAdmin(t, adminConfig, rls.WriteAuth{}, rls.WriteAuth{})
	for _, c := range []struct{ method, path, cred, flag string }{
		{"PUT", "/v1/overrides/per-key?key=alice", "", "-admin-credential-file"},
		{"PUT", "/v1/overrides/per-key?key=alice", proxyCred, "-admin-credential-file"},
		{"GET", "/v1/overrides/per-key?key=alice", adminCred, "-admin-credential-file"},
		{"GET", "/v1/usage/per-key?key=alice", "", "-usage-credential-file"},
	} {
		st, body := e.call(t, c.method, c.path, c.cred, `{"rate": 3}`)
		if msg, _ := body["error"].(string); st != 403 || !strings.Contains(msg, c.flag) {
			t.Errorf("%s %s: %d %q, want 403 naming %s", c.method, c.path, st, msg, c.flag)
		}
	}
	if got := e.calls("overrides", "disabled"); got != 3 {
		t.Errorf("disabled calls counted: %v, want 3", got)
	}
	if s := e.snapshot(t); len(s) != 0 {
		t.Errorf("redis: %v, want empty", s)
	}
}

// TestAdminRoundTrip sets, reads, replaces and removes overrides, checking
// Redis itself after each step: the key layout of the contract
// (ov:{<rule>:<composite>}, a hash of numeric fields), value= composed as
// the filter composes limit-key values, a PUT replacing the whole
// override, DELETE removing it and a second DELETE or a GET finding none.
func TestAdminRoundTrip(t *testing.T) {
	e := startAdmin(t, adminConfig, credAuth(adminCred), rls.WriteAuth{})
	hash := func(key string) map[string]string {
		t.Helper()
		v := e.redis.MustDo("HGETALL", key).([]any)
		m := map[string]string{}
		for i := 0; i+1 < len(v); i += 2 {
			m[v[i].(string)] = v[i+1].(string)
		}
		return m
	}
	steps := []struct {
		method, path, body string
		status             int
		redisKey           string
		wantHash           map[string]string
		wantOverride       map[string]any // the answer's "override"; nil: not checked
	}{
		{"GET", "/v1/overrides/per-key?key=alice", "", 404, "ov:{per-key:alice}", map[string]string{}, nil},
		{"PUT", "/v1/overrides/per-key?key=alice", `{"rate": 2.5, "burst": 25}`, 200, "ov:{per-key:alice}",
			map[string]string{"rate": "2.5", "burst": "25"}, map[string]any{"rate": 2.5, "burst": 25.0}},
		{"GET", "/v1/overrides/per-key?key=alice", "", 200, "ov:{per-key:alice}",
			map[string]string{"rate": "2.5", "burst": "25"}, map[string]any{"rate": 2.5, "burst": 25.0}},
		{"PUT", "/v1/overrides/per-key?value=alice", `{"burst": 40}`, 200, "ov:{per-key:alice}",
			map[string]string{"burst": "40"}, map[string]any{"burst": 40.0}},
		{"PUT", "/v1/overrides/two?value=acme&value=bob%7Cx", `{"rate": 3}`, 200, "ov:{two:acme|bob%7Cx}",
			map[string]string{"rate": "3"}, map[string]any{"rate": 3.0}},
		{"GET", "/v1/overrides/two?key=acme%7Cbob%257Cx", "", 200, "ov:{two:acme|bob%7Cx}",
			map[string]string{"rate": "3"}, map[string]any{"rate": 3.0}},
		{"PUT", "/v1/overrides/global", `{"rate": 50, "burst": 500}`, 200, "ov:{global:}",
			map[string]string{"rate": "50", "burst": "500"}, nil},
		{"PUT", "/v1/overrides/monthly?key=alice", `{"limit": 250000}`, 200, "ov:{monthly:alice}",
			map[string]string{"limit": "250000"}, map[string]any{"limit": 250000.0}},
		{"GET", "/v1/overrides/monthly?value=alice", "", 200, "ov:{monthly:alice}",
			map[string]string{"limit": "250000"}, map[string]any{"limit": 250000.0}},
		{"DELETE", "/v1/overrides/per-key?key=alice", "", 200, "ov:{per-key:alice}", map[string]string{}, nil},
		{"DELETE", "/v1/overrides/per-key?key=alice", "", 404, "ov:{per-key:alice}", map[string]string{}, nil},
		{"GET", "/v1/overrides/per-key?key=alice", "", 404, "ov:{per-key:alice}", map[string]string{}, nil},
	}
	for i, s := range steps {
		st, body := e.call(t, s.method, s.path, adminCred, s.body)
		if st != s.status {
			t.Fatalf("step %d: %s %s: got %d %v, want %d", i, s.method, s.path, st, body, s.status)
		}
		if got := hash(s.redisKey); !reflect.DeepEqual(got, s.wantHash) {
			t.Errorf("step %d: %s %s: redis %s = %v, want %v", i, s.method, s.path, s.redisKey, got, s.wantHash)
		}
		if s.wantOverride != nil && !reflect.DeepEqual(body["override"], s.wantOverride) {
			t.Errorf("step %d: %s %s: answer's override %v, want %v", i, s.method, s.path, body["override"], s.wantOverride)
		}
		if s.status == 200 && s.method != "DELETE" {
			if _, ok := body["ttl_seconds"]; ok {
				t.Errorf("step %d: ttl_seconds %v in the answer of an override without expiry", i, body["ttl_seconds"])
			}
		}
	}
	if got := e.calls("overrides", "ok"); got != 9 {
		t.Errorf("ok calls counted: %v, want 9", got)
	}
	if got := e.calls("overrides", "not_found"); got != 3 {
		t.Errorf("not_found calls counted: %v, want 3", got)
	}
}

// TestAdminTTL: ttl_seconds gives the override an expiry in Redis (and
// GET says what is left of it); a PUT without one makes it permanent
// again; Redis removes an expired override.
func TestAdminTTL(t *testing.T) {
	e := startAdmin(t, adminConfig, credAuth(adminCred), rls.WriteAuth{})
	const key = "ov:{per-key:bob}"
	if st, body := e.call(t, "PUT", "/v1/overrides/per-key?key=bob", adminCred, `{"rate": 3, "ttl_seconds": 600}`); st != 200 || body["ttl_seconds"] != 600.0 {
		t.Fatalf("PUT with a TTL: %d %v, want 200 with ttl_seconds 600", st, body)
	}
	if ms := e.redis.MustDo("PTTL", key).(int64); ms <= 0 || ms > 600_000 {
		t.Errorf("PTTL after a PUT of 600 s: %d ms, want in (0, 600000]", ms)
	}
	if st, body := e.call(t, "GET", "/v1/overrides/per-key?key=bob", adminCred, ""); st != 200 || !(body["ttl_seconds"].(float64) > 0 && body["ttl_seconds"].(float64) <= 600) {
		t.Errorf("GET: %d %v, want ttl_seconds in (0, 600]", st, body)
	}
	if st, _ := e.call(t, "PUT", "/v1/overrides/per-key?key=bob", adminCred, `{"rate": 4}`); st != 200 {
		t.Fatalf("PUT without a TTL: %d", st)
	}
	if ms := e.redis.MustDo("PTTL", key).(int64); ms != -1 {
		t.Errorf("PTTL after a PUT without ttl_seconds: %d, want -1 (no expiry)", ms)
	}
	if st, _ := e.call(t, "PUT", "/v1/overrides/per-key?key=bob", adminCred, `{"rate": 4, "ttl_seconds": 1}`); st != 200 {
		t.Fatalf("PUT with 1 s: %d", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.redis.MustDo("EXISTS", key).(int64) == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the override of 1 s still exists after 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st, _ := e.call(t, "GET", "/v1/overrides/per-key?key=bob", adminCred, ""); st != 404 {
		t.Errorf("GET after expiry: %d, want 404", st)
	}
}

// TestUsageBucket: the usage endpoint reads a token bucket as the decision
// left it, refilled to the clock, under the override in force; the usage
// credential reads it and nothing else, the admin's reads it too.
func TestUsageBucket(t *testing.T) {
	e := startAdmin(t, adminConfig, credAuth(adminCred), credAuth(usageCred))
	now := time.Unix(1_800_000_000, 0)
	e.srv.SetClock(func() time.Time { return now })
	// 3 tokens left 2 s ago at 1 token/s: 5 now, of 10.
	e.redis.MustDo("SET", "tb:{per-key:carol}", "3.000000:1799999998.000000")
	st, body := e.call(t, "GET", "/v1/usage/per-key?key=carol", usageCred, "")
	want := map[string]any{"rule": "per-key", "key": "carol", "kind": "token_bucket", "limit": 10.0, "rate": 1.0,
		"tokens": 5.0, "remaining": 5.0, "used": 5.0, "reset_seconds": 5.0, "reset": "2027-01-15T08:00:05Z", "source": "rule"}
	if st != 200 || !reflect.DeepEqual(body, want) {
		t.Errorf("usage:\n got %d %v\nwant 200 %v", st, body, want)
	}
	if st, _ := e.call(t, "PUT", "/v1/overrides/per-key?key=carol", adminCred, `{"burst": 100, "rate": 10}`); st != 200 {
		t.Fatal(st)
	}
	st, body = e.call(t, "GET", "/v1/usage/per-key?key=carol", adminCred, "")
	if st != 200 || body["limit"] != 100.0 || body["tokens"] != 23.0 || body["source"] != "override" {
		t.Errorf("usage under an override: %d %v, want limit 100, tokens 23 (3 + 2 s × 10), source override", st, body)
	}
	st, body = e.call(t, "GET", "/v1/usage/per-key?key=nobody", usageCred, "")
	if st != 200 || body["tokens"] != 10.0 || body["used"] != 0.0 {
		t.Errorf("usage of a key never seen: %d %v, want a full bucket", st, body)
	}
	for _, c := range []struct {
		method, path, cred string
		status             int
	}{
		{"GET", "/v1/overrides/per-key?key=carol", usageCred, 403},
		{"GET", "/v1/usage/per-key?key=carol", proxyCred, 403},
		{"GET", "/v1/usage/per-key?key=carol", "", 401},
		{"GET", "/v1/usage/nope?key=carol", usageCred, 404},
		{"DELETE", "/v1/usage/per-key?key=carol", adminCred, 405},
	} {
		if st, body := e.call(t, c.method, c.path, c.cred, ""); st != c.status {
			t.Errorf("%s %s: %d %v, want %d", c.method, c.path, st, body, c.status)
		}
	}
}

// TestOverrideBoundsAreTheConfigs pins the admin API's bounds to the
// configuration's: the largest rate and burst a configuration accepts an
// override accepts, and the next larger values both refuse.
func TestOverrideBoundsAreTheConfigs(t *testing.T) {
	e := startAdmin(t, adminConfig, credAuth(adminCred), rls.WriteAuth{})
	rule := func(rate, burst string) string {
		return `{"bundle_version": 1, "settings": {"rls": {"cluster": "rls"}}, "policies": [{"id": "p", "spec": {"rules": [
			{"name": "r", "scope": "cluster", "algorithm_config": {"tokens_per_second": ` + rate + `, "burst": ` + burst + `}}]}}]}`
	}
	for _, c := range []struct {
		rate, burst string
		ok          bool
	}{
		{"1e9", "1e12", true},
		{"1.000001e9", "1e12", false},
		{"1e9", "1.000001e12", false},
	} {
		_, cfgErr := rls.ParseConfig([]byte(rule(c.rate, c.burst)))
		st, body := e.call(t, "PUT", "/v1/overrides/per-key?key=bounds", adminCred, `{"rate": `+c.rate+`, "burst": `+c.burst+`}`)
		if (cfgErr == nil) != c.ok || (st == 200) != c.ok {
			t.Errorf("rate %s burst %s: configuration error %v, admin %d %v; want both accepted: %v", c.rate, c.burst, cfgErr, st, body, c.ok)
		}
	}
}

// TestUsageQuota: the usage endpoint reads the consumption the decision
// stored, in the period the decision computes (a month from the 31st in
// Paris: in February, from January 31 to February 28, the month's last
// day), with the limit in force by precedence: the rule's, an identity's
// (bounded by max_limit), an override's over both.
func TestUsageQuota(t *testing.T) {
	e := startAdmin(t, adminConfig, credAuth(adminCred), credAuth(usageCred))
	// A clock ahead of Redis's: the consumption expires at the period's
	// end (+ 1 h and a jitter), which must not be past for Redis.
	now := time.Date(2027, 2, 10, 12, 0, 0, 0, time.UTC)
	e.srv.SetClock(func() time.Time { return now })
	for _, hits := range []uint64{100, 200, 120} {
		resp, err := e.srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("monthly", "dave", hits)}})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("decision of %d: %v %v", hits, resp, err)
		}
	}
	start := time.Date(2027, 1, 31, 0, 0, 0, 0, time.FixedZone("CET", 3600))
	if u := e.redis.MustDo("HGET", "qt:{monthly:dave}:"+strconv.FormatInt(start.Unix(), 10), "u"); u != "420" {
		t.Fatalf("the decision's consumption: %v, want 420 in the period from %v", u, start)
	}
	base := map[string]any{"rule": "monthly", "key": "dave", "kind": "quota", "period": "month", "used": 420.0,
		"period_start": "2027-01-31T00:00:00+01:00", "reset": "2027-02-28T00:00:00+01:00", "reset_seconds": 1508400.0}
	with := func(limit, remaining float64, source string) map[string]any {
		m := map[string]any{"limit": limit, "remaining": remaining, "source": source}
		for k, v := range base {
			m[k] = v
		}
		return m
	}
	steps := []struct {
		name, path, cred string
		put              string // an override PUT first
		want             map[string]any
	}{
		{"the rule's", "/v1/usage/monthly?key=dave", usageCred, "", with(1000, 580, "rule")},
		{"an identity's", "/v1/usage/monthly?value=dave&identity_limit=3000", usageCred, "", with(3000, 2580, "identity")},
		{"an identity's, bounded", "/v1/usage/monthly?key=dave&identity_limit=9000", adminCred, "", with(5000, 4580, "identity")},
		{"an override's over an identity's", "/v1/usage/monthly?key=dave&identity_limit=3000", usageCred, `{"limit": 100}`, with(100, 0, "override")},
	}
	for _, st := range steps {
		if st.put != "" {
			if code, body := e.call(t, "PUT", "/v1/overrides/monthly?key=dave", adminCred, st.put); code != 200 {
				t.Fatalf("%s: PUT: %d %v", st.name, code, body)
			}
		}
		code, body := e.call(t, "GET", st.path, st.cred, "")
		if code != 200 || !reflect.DeepEqual(body, st.want) {
			t.Errorf("%s:\n got %d %v\nwant 200 %v", st.name, code, body, st.want)
		}
	}
	for _, c := range []struct {
		path string
		want string
	}{
		{"/v1/usage/monthly?key=dave&identity_limit=-3", "identity_limit: one positive number"},
		{"/v1/usage/monthly?key=dave&identity_limit=x", "identity_limit: one positive number"},
		{"/v1/usage/per-key?key=dave&identity_limit=3", "is not a quota"},
	} {
		code, body := e.call(t, "GET", c.path, usageCred, "")
		if msg, _ := body["error"].(string); code != 400 || !strings.Contains(msg, c.want) {
			t.Errorf("%s: %d %q, want 400 with %q", c.path, code, msg, c.want)
		}
	}
}
