package filter_test

import (
	"encoding/base64"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// t0 is a fixed instant: 2025-01-15T11:20:00Z.
const t0 = 1736940000.0

// clock is a settable test clock.
type clock struct{ now float64 }

func (c *clock) Now() float64 { return c.now }

func newPlugin(t *testing.T, h *filtertest.Host, config string) (*filter.Plugin, *clock) {
	t.Helper()
	p := filter.NewPlugin(h)
	c := &clock{now: t0}
	p.Clock = c.Now
	if !p.OnConfigure([]byte(config)) {
		t.Fatalf("OnConfigure refused the configuration: %q", h.Logs(filter.LogError))
	}
	return p, c
}

func counter(t *testing.T, h *filtertest.Host, rule, name string) int64 {
	t.Helper()
	v, ok := h.Counter(filter.RuleMetricName(rule, name))
	if !ok {
		t.Fatalf("counter %s of rule %s is not defined", name, rule)
	}
	return v
}

// golden compares got with testdata/name.golden.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./filter -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func dump(headers [][2]string) string {
	var b strings.Builder
	for _, kv := range headers {
		b.WriteString(kv[0] + ": " + kv[1] + "\n")
	}
	return b.String()
}

const perIP = `{"name":"global-rps","limit_keys":["ip:address"],"algorithm":"token_bucket","algorithm_config":{"rps":5,"burst":10}}`

func TestBurstThen429(t *testing.T) {
	h := filtertest.New()
	p, _ := newPlugin(t, h, perIP)
	req := filtertest.Get("/", "10.0.0.1:5555")
	for i := 0; i < 10; i++ {
		res := h.Do(p, req)
		if res.Status() != 200 {
			t.Fatalf("request %d: got status %d, want 200", i, res.Status())
		}
		if got, want := res.Header("ratelimit-remaining"), strconv.Itoa(9-i); got != want {
			t.Errorf("request %d: RateLimit-Remaining got %s, want %s", i, got, want)
		}
		if i == 0 {
			golden(t, "allowed_headers", dump(res.Headers))
		}
	}
	res := h.Do(p, req)
	if res.Status() != 429 || res.RequestAction != filter.Pause {
		t.Fatalf("11th request: got status %d action %d, want 429 and Pause", res.Status(), res.RequestAction)
	}
	golden(t, "rejected_reply", "status: "+strconv.Itoa(int(res.Local.Status))+"\ndetails: "+res.Local.Details+
		"\n"+dump(res.Local.Headers)+"\n"+res.Local.Body)
	if got := counter(t, h, "global-rps", filter.CounterAllowed); got != 10 {
		t.Errorf("allowed counter: got %d, want 10", got)
	}
	if got := counter(t, h, "global-rps", filter.CounterRejected); got != 1 {
		t.Errorf("rejected counter: got %d, want 1", got)
	}
	// The stored value has the documented format, key and exact numbers:
	// one of the identity's two slots, owned by its client IP.
	key, v, err := sharedstatetest.Lookup(h.Store, false, "global-rps", "10.0.0.1", config.DefaultMaxKeys)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, "tb:global-rps:$") {
		t.Errorf("key: got %q, want a slot key tb:global-rps:$<slot>", key)
	}
	if got, want := string(v), "0.000000:1736940000.000000:10.0.0.1"; got != want {
		t.Errorf("stored value: got %q, want %q", got, want)
	}
	if got := h.Store.(*sharedstatetest.Store).Len(); got != 2 {
		t.Errorf("keys: got %d, want 2 (the bucket and the slot seed)", got)
	}
}

func TestUnboundedKeys(t *testing.T) {
	h := filtertest.New()
	p, _ := newPlugin(t, h, `{"name":"global-rps","limit_keys":["ip:address","header:x-tenant"],"max_keys":0,"algorithm_config":{"rps":5,"burst":10}}`)
	h.Do(p, filtertest.Get("/", "[2001:db8::7]:1", "x-tenant", "acme|corp"))
	v, _, err := h.Store.Get("tb:global-rps:2001:db8::/64|acme%7Ccorp") // an IPv6 client is its /64
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(v), "9.000000:1736940000.000000"; got != want {
		t.Errorf("stored value: got %q, want %q", got, want)
	}
}

func TestRefillAndIsolation(t *testing.T) {
	h := filtertest.New()
	p, c := newPlugin(t, h, perIP)
	a, b := filtertest.Get("/", "10.0.0.1:1"), filtertest.Get("/", "[2001:db8::1]:2")
	for i := 0; i < 10; i++ {
		h.Do(p, a)
	}
	if got := h.Do(p, a).Status(); got != 429 {
		t.Fatalf("a after burst: got %d, want 429", got)
	}
	if got := h.Do(p, b).Status(); got != 200 {
		t.Fatalf("b is limited by a's bucket: got %d, want 200", got)
	}
	if _, _, err := sharedstatetest.Lookup(h.Store, false, "global-rps", "2001:db8::/64", config.DefaultMaxKeys); err != nil {
		t.Errorf("IPv6 bucket: %v", err)
	}
	c.now += 0.4 // 2 tokens at 5/s
	for i := 0; i < 2; i++ {
		if got := h.Do(p, a).Status(); got != 200 {
			t.Fatalf("a after 0.4 s, request %d: got %d, want 200", i, got)
		}
	}
	if got := h.Do(p, a).Status(); got != 429 {
		t.Fatalf("a third request after 0.4 s: got %d, want 429", got)
	}
}

func TestRetryAfterJitter(t *testing.T) {
	if a, b := filter.RetryAfter(10, "ip:1.2.3.4"), filter.RetryAfter(10, "ip:1.2.3.4"); a != b {
		t.Fatalf("same identity: got %d and %d", a, b)
	}
	seen := map[int64]int{}
	for i := 0; i < 1000; i++ {
		v := filter.RetryAfter(9.2, "ip:10.0."+strconv.Itoa(i/256)+"."+strconv.Itoa(i%256))
		if v < 10 || v > 15 {
			t.Fatalf("RetryAfter(9.2) = %d, want within [10, 15]", v)
		}
		seen[v]++
	}
	for v := int64(10); v <= 15; v++ {
		if seen[v] < 100 {
			t.Errorf("offset %d chosen %d times out of 1000: clients do not spread", v-10, seen[v])
		}
	}
	for _, tc := range []struct {
		wait float64
		want int64
	}{{0, 1}, {0.01, 1}, {1, 1}, {1.5, 2}} {
		if got := filter.RetryAfter(tc.wait, "x"); got < tc.want || got > tc.want+tc.want/2 {
			t.Errorf("RetryAfter(%v): got %d, want %d plus at most 50%%", tc.wait, got, tc.want)
		}
	}
}

func TestVariableCost(t *testing.T) {
	const cfg = `{"name":"weighted","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1,"burst":10,"cost_source":"header:x-weight","default_cost":2}}`
	tests := []struct {
		weight    string // "" = header absent
		wantLeft  string // RateLimit-Remaining after one request on a full bucket
		wantCode  uint32
		wantReaso string
	}{
		{"", "8", 200, ""},
		{"3", "7", 200, ""},
		{" 4 ", "6", 200, ""},
		{"2.5", "7", 200, ""},
		{"abc", "8", 200, ""},
		{"-1", "8", 200, ""},
		{"0", "8", 200, ""},
		{"1e309", "8", 200, ""},
		{"NaN", "8", 200, ""},
		{"0x10", "8", 200, ""},
		{"10", "0", 200, ""},
		{"11", "", 413, filter.ReasonCostExceedsBurst}, // can never pass: not a 429 clients retry
		{strings.Repeat("9", 10000), "8", 200, ""},
	}
	for _, tc := range tests {
		t.Run(strconv.Quote(tc.weight[:min(len(tc.weight), 8)]), func(t *testing.T) {
			h := filtertest.New()
			p, _ := newPlugin(t, h, cfg)
			hdrs := []string{"x-api-key", "k1"}
			if tc.weight != "" {
				hdrs = append(hdrs, "x-weight", tc.weight)
			}
			res := h.Do(p, filtertest.Get("/", "1.1.1.1:1", hdrs...))
			if res.Status() != tc.wantCode {
				t.Fatalf("status: got %d, want %d", res.Status(), tc.wantCode)
			}
			if tc.wantCode == 200 {
				if got := res.Header("ratelimit-remaining"); got != tc.wantLeft {
					t.Errorf("remaining: got %s, want %s", got, tc.wantLeft)
				}
				return
			}
			if got := res.Header("x-tokengate-reason"); got != tc.wantReaso {
				t.Errorf("reason: got %q, want %q", got, tc.wantReaso)
			}
			if got := res.Header("retry-after"); got != "" {
				t.Errorf("retry-after: got %q, want none when the cost exceeds the burst", got)
			}
		})
	}
}

func jwt(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return "Bearer " + enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(claims)) + ".sig"
}

func TestMatchTiersWithJWT(t *testing.T) {
	const cfg = `{"rules":[
		{"name":"enterprise","limit_keys":["jwt:sub"],"algorithm_config":{"rps":100,"burst":100},"match":{"jwt:plan":"enterprise"}},
		{"name":"free","limit_keys":["jwt:sub"],"algorithm_config":{"rps":1,"burst":2},"match":{"jwt:plan":"free"}}]}`
	h := filtertest.New()
	p, _ := newPlugin(t, h, cfg)
	ent := filtertest.Get("/", "1.1.1.1:1", "authorization", jwt(`{"sub":"acme","plan":"enterprise"}`))
	free := filtertest.Get("/", "1.1.1.1:1", "authorization", jwt(`{"sub":"bob","plan":"free"}`))
	for i := 0; i < 2; i++ {
		if got := h.Do(p, free).Status(); got != 200 {
			t.Fatalf("free request %d: got %d, want 200", i, got)
		}
	}
	res := h.Do(p, free)
	if res.Status() != 429 || res.Header("x-tokengate-rule") != "free" {
		t.Fatalf("free request 3: got %d rule %q, want 429 by free", res.Status(), res.Header("x-tokengate-rule"))
	}
	for i := 0; i < 50; i++ {
		if res := h.Do(p, ent); res.Status() != 200 || res.Header("ratelimit-limit") != "100" {
			t.Fatalf("enterprise request %d: got %d limit %q", i, res.Status(), res.Header("ratelimit-limit"))
		}
	}
	// No JWT: no rule matches, so nothing is limited and nothing is stored.
	before := h.Store.(*sharedstatetest.Store).Len()
	if res := h.Do(p, filtertest.Get("/", "1.1.1.1:1")); res.Status() != 200 || len(res.Headers) != 0 {
		t.Fatalf("no JWT: got %d with headers %v, want 200 without headers", res.Status(), res.Headers)
	}
	if after := h.Store.(*sharedstatetest.Store).Len(); after != before {
		t.Errorf("no JWT created %d keys", after-before)
	}
}

func TestShadowMode(t *testing.T) {
	const cfg = `{"bundle_version":1,"policies":[{"id":"watch","spec":{"mode":"shadow","rules":[
		{"name":"watch-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":2}}]}}]}`
	h := filtertest.New()
	p, _ := newPlugin(t, h, cfg)
	req := filtertest.Get("/", "10.1.1.1:1")
	for i := 0; i < 5; i++ {
		res := h.Do(p, req)
		if res.Status() != 200 || len(res.Headers) != 0 {
			t.Fatalf("request %d: got %d with headers %v, want 200 and no headers", i, res.Status(), res.Headers)
		}
	}
	if got := counter(t, h, "watch-ip", filter.CounterShadowRejected); got != 3 {
		t.Errorf("shadow_rejected: got %d, want 3", got)
	}
	if got := counter(t, h, "watch-ip", filter.CounterAllowed); got != 2 {
		t.Errorf("allowed: got %d, want 2", got)
	}
	if _, _, err := sharedstatetest.Lookup(h.Store, true, "watch-ip", "10.1.1.1", config.DefaultMaxKeys); err != nil {
		t.Errorf("shadow bucket: %v", err)
	}
	for _, e := range h.Store.(*sharedstatetest.Store).Snapshot("tb:") {
		t.Errorf("a shadow rule wrote an enforce bucket: %s = %s", e.Key, e.Value)
	}
}

func TestAllOrNothing(t *testing.T) {
	const cfg = `{"rules":[
		{"name":"wide","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":100}},
		{"name":"narrow","limit_keys":["path"],"algorithm_config":{"rps":1,"burst":2}}]}`
	h := filtertest.New()
	p, _ := newPlugin(t, h, cfg)
	for i := 0; i < 2; i++ {
		res := h.Do(p, filtertest.Get("/x", "1.1.1.1:1"))
		if res.Status() != 200 {
			t.Fatalf("request %d: got %d", i, res.Status())
		}
		// RateLimit lists both rules; the legacy headers describe the
		// bucket with the fewest tokens left.
		want := `"wide";r=` + strconv.Itoa(99-i) + ";t=" + strconv.Itoa(i+1) + `, "narrow";r=` + strconv.Itoa(1-i) + ";t=" + strconv.Itoa(i+1)
		if got := res.Header("ratelimit"); got != want {
			t.Errorf("request %d: RateLimit got %q, want %q", i, got, want)
		}
		if got := res.Header("ratelimit-remaining"); got != strconv.Itoa(1-i) {
			t.Errorf("request %d: RateLimit-Remaining got %q, want narrow's %d", i, got, 1-i)
		}
		if got, want := res.Header("ratelimit-policy"), `"wide";q=100;w=100, "narrow";q=2;w=2`; got != want {
			t.Errorf("request %d: RateLimit-Policy got %q, want %q", i, got, want)
		}
	}
	_, wide, _ := sharedstatetest.Lookup(h.Store, false, "wide", "1.1.1.1", config.DefaultMaxKeys)
	res := h.Do(p, filtertest.Get("/x", "1.1.1.1:1"))
	if res.Status() != 429 || res.Header("x-tokengate-rule") != "narrow" {
		t.Fatalf("third request: got %d rule %q, want 429 by narrow", res.Status(), res.Header("x-tokengate-rule"))
	}
	if _, after, _ := sharedstatetest.Lookup(h.Store, false, "wide", "1.1.1.1", config.DefaultMaxKeys); string(after) != string(wide) {
		t.Errorf("the rejected request took from the wide bucket: %q → %q", wide, after)
	}
	if got := counter(t, h, "wide", filter.CounterRejected); got != 0 {
		t.Errorf("wide rejected counter: got %d, want 0", got)
	}
}

func TestFallbackAndMissingDescriptor(t *testing.T) {
	const cfg = `{"bundle_version":1,"policies":[{"id":"api","spec":{"selector":{"pathPrefix":"/api/","methods":["GET"]},
		"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1,"burst":5}}],
		"fallback_limit":{"limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":1}}}}]}`
	h := filtertest.New()
	p, _ := newPlugin(t, h, cfg)
	if res := h.Do(p, filtertest.Get("/api/a", "2.2.2.2:1", "x-api-key", "k")); res.Header("ratelimit-limit") != "5" {
		t.Errorf("with key: got limit %q, want 5", res.Header("ratelimit-limit"))
	}
	anon := filtertest.Get("/api/a", "2.2.2.2:1")
	if res := h.Do(p, anon); res.Status() != 200 || res.Header("ratelimit-limit") != "1" {
		t.Errorf("anonymous: got %d limit %q, want 200 from the fallback", res.Status(), res.Header("ratelimit-limit"))
	}
	if res := h.Do(p, anon); res.Status() != 429 || res.Header("x-tokengate-rule") != "api-fallback" {
		t.Errorf("anonymous again: got %d rule %q, want 429 by api-fallback", res.Status(), res.Header("x-tokengate-rule"))
	}
	if got := counter(t, h, "per-key", filter.CounterDescriptorMissing); got != 2 {
		t.Errorf("descriptor_missing: got %d, want 2", got)
	}
	for _, req := range []filtertest.Request{filtertest.Get("/other", "2.2.2.2:1"), {
		Headers: [][2]string{{":method", "POST"}, {":path", "/api/a"}}, Properties: map[string]string{"source.address": "2.2.2.2:1"}}} {
		if res := h.Do(p, req); res.Status() != 200 || len(res.Headers) != 0 {
			t.Errorf("outside the selector: got %d with headers %v", res.Status(), res.Headers)
		}
	}
}

func TestFailOpen(t *testing.T) {
	h := filtertest.New()
	mem := h.Store
	fail := &sharedstatetest.FaultStore{Store: mem}
	h.Store = fail
	p, _ := newPlugin(t, h, perIP)
	req := filtertest.Get("/", "3.3.3.3:1")
	h.Do(p, req)
	before := mem.(*sharedstatetest.Store).Snapshot("")
	boom := errors.New("internal failure")
	for _, tc := range []struct {
		name  string
		fault func()
	}{
		{"get fails", func() { fail.GetErr, fail.SetErr = func(string) error { return boom }, nil }},
		{"set fails", func() { fail.GetErr, fail.SetErr = nil, func(string, []byte, uint32) error { return boom } }},
		{"cas storm", func() {
			fail.GetErr, fail.SetErr = nil, func(string, []byte, uint32) error { return sharedstate.ErrCASMismatch }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fault()
			prev := counter(t, h, "global-rps", filter.CounterFailOpen)
			for i := 0; i < 20; i++ {
				if res := h.Do(p, req); res.Status() != 200 || len(res.Headers) != 0 {
					t.Fatalf("request %d: got %d headers %v, want 200 without headers", i, res.Status(), res.Headers)
				}
			}
			if got := counter(t, h, "global-rps", filter.CounterFailOpen) - prev; got != 20 {
				t.Errorf("fail_open: got %d, want 20", got)
			}
			if after := mem.(*sharedstatetest.Store).Snapshot(""); !reflect.DeepEqual(after, before) {
				t.Errorf("state changed: %v → %v", before, after)
			}
		})
	}
	if len(h.Logs(filter.LogWarn)) == 0 {
		t.Error("fail open was not logged")
	}
}

func TestDenyOnStoreError(t *testing.T) {
	h := filtertest.New()
	h.Store = &sharedstatetest.FaultStore{Store: h.Store, GetErr: func(string) error { return errors.New("down") }}
	p, _ := newPlugin(t, h, `{"name":"strict","on_store_error":"deny","algorithm_config":{"rps":1,"burst":1}}`)
	res := h.Do(p, filtertest.Get("/", "1.1.1.1:1"))
	if res.Status() != 503 || res.Header("x-tokengate-reason") != filter.ReasonStoreError {
		t.Fatalf("got %d reason %q, want 503 %s", res.Status(), res.Header("x-tokengate-reason"), filter.ReasonStoreError)
	}
	if got := counter(t, h, "strict", filter.CounterStoreDenied); got != 1 {
		t.Errorf("store_denied: got %d, want 1", got)
	}
}

func TestGRPCRejection(t *testing.T) {
	h := filtertest.New()
	p, _ := newPlugin(t, h, `{"name":"g","algorithm_config":{"rps":1,"burst":1}}`)
	req := filtertest.Get("/pkg.Svc/Call", "1.1.1.1:1", "content-type", "application/grpc+proto")
	h.Do(p, req)
	res := h.Do(p, req)
	if res.Local == nil || res.Local.GRPCStatus != 8 {
		t.Fatalf("got %+v, want a local reply with grpc status 8", res.Local)
	}
	if res.Header("content-type") != "" {
		t.Errorf("a gRPC reply must not carry the JSON content-type")
	}
	if res.Header("retry-after") == "" {
		t.Errorf("missing retry-after")
	}
}

func TestReconfigure(t *testing.T) {
	h := filtertest.New()
	p, _ := newPlugin(t, h, perIP)
	req := filtertest.Get("/", "4.4.4.4:1")
	for i := 0; i < 4; i++ {
		h.Do(p, req)
	}
	if p.OnConfigure([]byte(`{"name":"global-rps","algorithm_config":{"rps":5}}`)) {
		t.Fatal("a bad configuration was accepted")
	}
	if got := h.Do(p, req).Header("ratelimit-remaining"); got != "5" {
		t.Errorf("after a refused reload: remaining got %s, want 5 (old config, balance kept)", got)
	}
	if v, _ := h.Counter(filter.MetricConfigRejected); v != 1 {
		t.Errorf("config_rejected: got %d, want 1", v)
	}
	if !p.OnConfigure([]byte(`{"name":"global-rps","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}}`)) {
		t.Fatal("a good configuration was refused")
	}
	if got := h.Do(p, req).Header("ratelimit-remaining"); got != "2" {
		t.Errorf("after shrinking burst to 3: remaining got %s, want 2 (clamped to the new burst, minus one)", got)
	}
	if !p.OnConfigure([]byte(`{"name":"renamed","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}}`)) {
		t.Fatal("a good configuration was refused")
	}
	if got := h.Do(p, req).Header("ratelimit"); got != `"renamed";r=2;t=1` {
		t.Errorf("after renaming: RateLimit got %q, want the new rule's fresh bucket", got)
	}
}

func TestInvalidConfigLogged(t *testing.T) {
	h := filtertest.New()
	p := filter.NewPlugin(h)
	if p.OnConfigure([]byte(`{"rules":[{"name":"a","algorithm_config":{"tokens_per_second":100,"burst":50}}]}`)) {
		t.Fatal("accepted")
	}
	logs := h.Logs(filter.LogError)
	want := "error: tokengate: invalid configuration: rules[0].algorithm_config.burst: must be >= tokens_per_second (100), got 50"
	if len(logs) != 1 || logs[0] != want {
		t.Errorf("got logs %q, want [%q]", logs, want)
	}
	if res := h.Do(p, filtertest.Get("/", "1.1.1.1:1")); res.Status() != 200 {
		t.Errorf("unconfigured plugin: got %d, want 200", res.Status())
	}
}

func TestPanicFailsOpen(t *testing.T) {
	h := filtertest.New()
	p, _ := newPlugin(t, h, `{"name":"k","limit_keys":["header:x-boom"],"algorithm_config":{"rps":1,"burst":1}}`)
	h.PanicOn = "x-boom"
	res := h.Do(p, filtertest.Get("/", "1.1.1.1:1", "x-boom", "1"))
	if res.Status() != 200 || res.RequestAction != filter.Continue {
		t.Fatalf("got %d action %d, want 200 Continue", res.Status(), res.RequestAction)
	}
	if v, _ := h.Counter(filter.MetricPanics); v != 1 {
		t.Errorf("panics: got %d, want 1", v)
	}
	if logs := h.Logs(filter.LogCritical); len(logs) != 1 || !strings.Contains(logs[0], "injected panic") {
		t.Errorf("critical logs: got %q", logs)
	}
}

func TestMetricNames(t *testing.T) {
	h := filtertest.New()
	newPlugin(t, h, perIP)
	want := []string{
		"tokengate.config_rejected", "tokengate.corrupt_state", "tokengate.lease_calls", "tokengate.local_state", "tokengate.panics", "tokengate.rls_errors", "tokengate.rls_settle_calls", "tokengate.rls_settle_errors",
		"tokengate.rule.global-rps.allowed", "tokengate.rule.global-rps.cas_retries", "tokengate.rule.global-rps.contention",
		"tokengate.rule.global-rps.descriptor_missing", "tokengate.rule.global-rps.fail_open",
		"tokengate.rule.global-rps.rejected", "tokengate.rule.global-rps.shadow_rejected",
		"tokengate.rule.global-rps.slot_collisions", "tokengate.rule.global-rps.slot_takeovers",
		"tokengate.rule.global-rps.store_denied", "tokengate.seed_errors",
	}
	got := h.CounterNames()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("metric names:\n got %q\nwant %q", got, want)
	}
}

// On a host without shared data (APISIX answers UNIMPLEMENTED) the buckets
// are kept in the worker's VM: limits hold per worker instead of vanishing.
func TestNoSharedDataLimitsPerWorker(t *testing.T) {
	h := filtertest.New()
	unimplemented := func(string) error { return sharedstate.ErrUnimplemented }
	h.Store = &sharedstatetest.FaultStore{Store: h.Store, GetErr: unimplemented,
		SetErr: func(string, []byte, uint32) error { return sharedstate.ErrUnimplemented }}
	p, _ := newPlugin(t, h, `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":2}}`)
	req := filtertest.Get("/", "10.9.9.9:1")
	for i, want := range []uint32{200, 200, 429} {
		if got := h.Do(p, req).Status(); got != want {
			t.Fatalf("request %d: got %d, want %d", i, got, want)
		}
	}
	if v, _ := h.Counter(filter.MetricLocalState); v != 1 {
		t.Errorf("local_state: got %d, want 1", v)
	}
	if got := counter(t, h, "per-ip", filter.CounterFailOpen); got != 0 {
		t.Errorf("fail_open: got %d, want 0", got)
	}
	if logs := h.Logs(filter.LogWarn); len(logs) != 1 || !strings.Contains(logs[0], "does not implement shared data") {
		t.Errorf("warn logs: got %q, want one line about the missing shared data", logs)
	}
}
