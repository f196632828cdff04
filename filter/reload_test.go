package filter_test

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
)

// Configuration reload (proxy_on_configure again), beyond TestReconfigure.
// Buckets live in shared data, keyed by rule name, so a reload keeps them.

func ruleG(rps, burst string) string {
	return `{"name":"g","algorithm_config":{"rps":` + rps + `,"burst":` + burst + `}}`
}

// TestReloadKeepsBalances walks a step table: each step optionally reloads,
// moves the clock, sends one request and checks RateLimit-Remaining.
func TestReloadKeepsBalances(t *testing.T) {
	tests := []struct {
		config  string // "" = no reload
		advance float64
		left    int64
		tokens  float64 // stored afterwards
	}{
		{"", 0, 9, 9},
		{"", 0, 8, 8},
		// A faster rate keeps the balance; refill goes at the new rate.
		{ruleG("5", "10"), 0, 7, 7},
		{"", 0.5, 8, 8.5},
		// A smaller burst clamps the balance; the clamped value is stored.
		{ruleG("1", "3"), 0, 2, 2},
		// Growing the burst back does not give the clamped tokens back.
		{ruleG("1", "10"), 0, 1, 1},
		// A slower rate: the whole time since the last write refills at the
		// rate in force when the bucket is next used (lazy refill).
		{"", 2, 2, 2},
		{ruleG("0.5", "10"), 4, 3, 3},
		{ruleG("100", "100"), 0.25, 27, 27}, // 3 + 0.25*100 - 1
	}
	f := newFixture(t, ruleG("1", "10"))
	for i, tc := range tests {
		if tc.config != "" && !f.p.OnConfigure([]byte(tc.config)) {
			t.Fatalf("step %d: reload refused: %q", i, f.h.Logs(filter.LogError))
		}
		f.now += tc.advance
		res := f.get()
		if res.Status() != 200 {
			t.Fatalf("step %d: got status %d, want 200", i, res.Status())
		}
		if got := remaining(res); got != tc.left {
			t.Errorf("step %d: got RateLimit-Remaining %d, want %d", i, got, tc.left)
		}
		if tokens, _ := f.state("tb:g:"); tokens != tc.tokens {
			t.Errorf("step %d: stored %v tokens, want %v", i, tokens, tc.tokens)
		}
	}
}

// TestReloadRemovedAndRenamedRules: a rule that is removed or renamed stops
// being enforced at once, its counters stop moving and its bucket is left
// as it was. Putting the rule back resumes its old bucket.
func TestReloadRemovedAndRenamedRules(t *testing.T) {
	const (
		both    = `{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":2}},{"name":"b","algorithm_config":{"rps":1,"burst":100}}]}`
		onlyB   = `{"rules":[{"name":"b","algorithm_config":{"rps":1,"burst":100}}]}`
		renamed = `{"rules":[{"name":"a2","algorithm_config":{"rps":1,"burst":2}},{"name":"b","algorithm_config":{"rps":1,"burst":100}}]}`
	)
	f := newFixture(t, both)
	for i := 0; i < 2; i++ {
		if res := f.get(); res.Status() != 200 {
			t.Fatalf("request %d: got %d", i, res.Status())
		}
	}
	if res := f.get(); res.Status() != 429 || res.Header("x-tokengate-rule") != "a" {
		t.Fatalf("third request: got %d by %q, want 429 by a", res.Status(), res.Header("x-tokengate-rule"))
	}
	aBucket := f.raw("tb:a:")
	aCounters := func() [2]int64 {
		return [2]int64{f.counter("a", filter.CounterAllowed), f.counter("a", filter.CounterRejected)}
	}
	frozen := aCounters()

	for _, step := range []struct {
		name, config, wantRule string
		wantLeft               int64
	}{
		{"removed", onlyB, "b", 97},
		{"renamed", renamed, "a2", 1},
	} {
		if !f.p.OnConfigure([]byte(step.config)) {
			t.Fatalf("%s: reload refused", step.name)
		}
		res := f.get()
		if res.Status() != 200 || !strings.HasPrefix(res.Header("ratelimit"), `"`+step.wantRule+`";r=`) || remaining(res) != step.wantLeft {
			t.Errorf("%s: got %d RateLimit %q, want 200 from %s with %d left", step.name, res.Status(), res.Header("ratelimit"), step.wantRule, step.wantLeft)
		}
		if got := aCounters(); got != frozen {
			t.Errorf("%s: counters of a moved: %v → %v", step.name, frozen, got)
		}
		if got := f.raw("tb:a:"); got != aBucket {
			t.Errorf("%s: a's bucket changed: %q → %q", step.name, aBucket, got)
		}
	}
	// Back to the original configuration at the same instant: a's empty
	// bucket is still in shared data and still empty.
	if !f.p.OnConfigure([]byte(both)) {
		t.Fatal("reload refused")
	}
	if res := f.get(); res.Status() != 429 || res.Header("x-tokengate-rule") != "a" {
		t.Errorf("a restored: got %d by %q, want 429 by a (its old bucket)", res.Status(), res.Header("x-tokengate-rule"))
	}
}

// TestReloadBadConfigKeepsOld: every invalid reload is refused, counted and
// logged, and the configuration in force keeps enforcing with its balances.
func TestReloadBadConfigKeepsOld(t *testing.T) {
	bad := []struct{ name, config string }{
		{"empty", ``},
		{"whitespace", " \n\t"},
		{"not JSON", `{"name":`},
		{"JSON array", `[]`},
		{"no rules", `{"rules":[]}`},
		{"burst below rate", ruleG("10", "5")},
		{"zero rate", ruleG("0", "5")},
		{"negative burst", ruleG("1", "-5")},
		{"huge burst", ruleG("1", "1e400")},
		{"string rate", ruleG(`"1"`, "5")},
		{"unknown field", `{"name":"g","algorithm_config":{"rps":1,"burst":5},"burts":5}`},
		{"unknown algorithm", `{"name":"g","algorithm":"leaky_bucket","algorithm_config":{"rps":1,"burst":5}}`},
		{"duplicate names", `{"rules":[` + ruleG("1", "5") + `,` + ruleG("1", "5") + `]}`},
		{"bad descriptor", `{"name":"g","limit_keys":["cookie:x"],"algorithm_config":{"rps":1,"burst":5}}`},
		{"bad name", `{"name":"g:h","algorithm_config":{"rps":1,"burst":5}}`},
		{"NUL byte", "{\"name\":\"g\x00\",\"algorithm_config\":{\"rps\":1,\"burst\":5}}"},
		{"binary", "\xff\xfe\x00"},
	}
	f := newFixture(t, ruleG("1", "20"))
	cfg := f.p.Config()
	left := int64(19)
	for i, tc := range bad {
		if f.p.OnConfigure([]byte(tc.config)) {
			t.Fatalf("%s: accepted", tc.name)
		}
		if f.p.Config() != cfg {
			t.Fatalf("%s: the configuration in force changed", tc.name)
		}
		if got := f.global(filter.MetricConfigRejected); got != int64(i+1) {
			t.Errorf("%s: config_rejected %d, want %d", tc.name, got, i+1)
		}
		logs := f.h.Logs(filter.LogError)
		if len(logs) != i+1 || !strings.Contains(logs[i], "tokengate: invalid configuration: ") {
			t.Errorf("%s: error logs %q", tc.name, logs)
		}
		if got := remaining(f.get()); got != left {
			t.Errorf("%s: after the refused reload, remaining %d, want %d (old rule, balance kept)", tc.name, got, left)
		}
		left--
	}
	for left >= 0 {
		f.get()
		left--
	}
	if res := f.get(); res.Status() != 429 || res.Header("x-tokengate-rule") != "g" {
		t.Errorf("the old rule no longer enforces: got %d by %q", res.Status(), res.Header("x-tokengate-rule"))
	}
}

// TestReloadShadowEnforce switches a policy between shadow and enforce.
// Shadow buckets live under "shadow:tb:", apart from the enforce buckets,
// so a switch starts from the other mode's buckets: what a shadow trial
// consumed is not carried into enforcement, and back.
func TestReloadShadowEnforce(t *testing.T) {
	cfg := func(mode string) string {
		return `{"bundle_version":1,"policies":[{"id":"p","spec":{"mode":"` + mode + `",
			"rules":[{"name":"w","algorithm_config":{"rps":1,"burst":2}}]}}]}`
	}
	f := newFixture(t, cfg("shadow"))
	for i := 0; i < 5; i++ {
		if res := f.get(); res.Status() != 200 || len(res.Headers) != 0 {
			t.Fatalf("shadow request %d: got %d headers %v, want 200 without headers", i, res.Status(), res.Headers)
		}
	}
	if got := f.counter("w", filter.CounterShadowRejected); got != 3 {
		t.Errorf("shadow_rejected: got %d, want 3", got)
	}
	if !f.p.OnConfigure([]byte(cfg("enforce"))) {
		t.Fatal("reload refused")
	}
	for i, want := range []uint32{200, 200, 429} {
		if got := f.get().Status(); got != want {
			t.Errorf("enforce request %d: got %d, want %d (a fresh enforce bucket of 2)", i, got, want)
		}
	}
	if got := f.counter("w", filter.CounterRejected); got != 1 {
		t.Errorf("rejected: got %d, want 1", got)
	}
	if !f.p.OnConfigure([]byte(cfg("shadow"))) {
		t.Fatal("reload refused")
	}
	if res := f.get(); res.Status() != 200 || len(res.Headers) != 0 {
		t.Errorf("back in shadow mode: got %d headers %v, want 200 without headers", res.Status(), res.Headers)
	}
	if got, want := f.counter("w", filter.CounterShadowRejected), int64(4); got != want {
		t.Errorf("shadow_rejected: got %d, want %d (the shadow bucket is still empty)", got, want)
	}
	if got := f.counter("w", filter.CounterRejected); got != 1 {
		t.Errorf("rejected moved in shadow mode: got %d, want 1", got)
	}
	if tokens, _ := f.state("tb:w:"); tokens != 0 {
		t.Errorf("enforce bucket: got %v tokens, want 0 (untouched in shadow mode)", tokens)
	}
}
