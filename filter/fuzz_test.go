package filter_test

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// Fuzz targets of package filter (issue 6, "Fuzzing"). Seed corpora are in
// testdata/fuzz/<target>; `make test` runs them, `make fuzz` fuzzes.

// FuzzParseConfig: no panic; an accepted configuration is fully valid, parses
// the same way twice, and serves a request; a refused one says where.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","algorithm_config":{"rps":1,"burst":1}}`,
		`{"rules":[{"name":"a","limit_keys":["ip:address","header:x"],"algorithm_config":{"tokens_per_second":0.5,"burst":1e12,"cost_source":"query:c","default_cost":3}}],"settings":{"cas_max_attempts":1000,"xff_trusted_hops":10,"max_keys_per_rule":0}}`,
		`{"bundle_version":1,"policies":[{"id":"p","spec":{"mode":"shadow","selector":{"pathPrefix":"/a","methods":["get"],"hosts":["*.x.com"]},"fallback_limit":{"algorithm_config":{"rps":1,"burst":2}}}}]}`,
		`{"name":"a","algorithm_config":{"rps":1e-320,"burst":1}}`,
		`{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":1}}],"rls_descriptors":[{"domain":"d","descriptors":[{"key":"k","value":"v","shadow":true,"rule":{"name":"b","algorithm_config":{"rps":1,"burst":2}},"descriptors":[{"key":"j","rule":{"name":"c","algorithm_config":{"rps":1,"burst":1}}}]}]}]}`,
		`{"rls_descriptors":[{"domain":"d","descriptors":[{"key":"remote_address","rule":{"name":"b","algorithm_config":{"rps":1,"burst":2}}}]}]}`,
		`{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":9,"cost_source":"response_sse:/a/0+/b","pre_charge":2,"max_debt":0,"count_statuses":["4xx",200]}},` +
			`{"name":"b","algorithm":"concurrency","algorithm_config":{"max_in_flight":2,"lease_seconds":1}}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := filter.ParseConfig(data)
		if err != nil {
			var ce *filter.ConfigError
			if !errors.As(err, &ce) || err.Error() == "" {
				t.Fatalf("error %v (%T) is not a non-empty *ConfigError", err, err)
			}
			return
		}
		checkConfig(t, cfg)
		again, err := filter.ParseConfig(data)
		if err != nil {
			t.Fatalf("accepted once, refused the second time: %v", err)
		}
		if a, b := ruleNames(cfg), ruleNames(again); a != b {
			t.Fatalf("rule names differ between two parses: %q and %q", a, b)
		}
		// The configuration serves requests, with headers in range. Fill
		// times beyond 2^53 s overflow the headers: a known bug pinned by
		// TestHugeFillTimeOverflowsHeaders; drop this guard once it is fixed.
		representable := true
		for _, r := range cfg.Rules() {
			representable = representable && r.Limit.FillTime() <= 1<<53
		}
		h := filtertest.New()
		p := filter.NewPlugin(h)
		p.Clock = func() float64 { return epoch }
		if !p.OnConfigure(data) {
			t.Fatalf("ParseConfig accepted it, OnConfigure refused: %q", h.Logs(filter.LogError))
		}
		for i := 0; i < 2; i++ {
			res := h.Do(p, filtertest.Get("/a/b?c=2&q=1", "192.0.2.1:1", "x", "1", "c", "2",
				"authorization", jwtOf(`{"sub":"s","plan":"free"}`)))
			if s := res.Status(); s != 200 && s != 429 {
				t.Fatalf("request %d: status %d", i, s)
			}
			if representable {
				checkHeaderNumbers(t, res)
			}
		}
		if v, _ := h.Counter(filter.MetricPanics); v != 0 {
			t.Fatalf("panics: %q", h.Logs(filter.LogCritical))
		}
	})
}

// checkHeaderNumbers checks that every number in the RateLimit headers and
// Retry-After is a non-negative integer.
func checkHeaderNumbers(t *testing.T, res filtertest.Result) {
	t.Helper()
	for _, name := range []string{"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"} {
		if v := res.Header(name); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
				t.Fatalf("%s: %q, want a non-negative integer", name, v)
			}
		}
	}
	for _, name := range []string{"ratelimit", "ratelimit-policy"} {
		if v := res.Header(name); strings.Contains(v, "=-") {
			t.Fatalf("%s: %q has a negative parameter", name, v)
		}
	}
}

// checkRLSNodes checks an rls_descriptors tree: keys set, depth bounded,
// every node with a rule or children, every rule a valid token bucket.
func checkRLSNodes(t *testing.T, nodes []*filter.RLSDescriptor, depth int) {
	t.Helper()
	if len(nodes) > 0 && depth > 8 {
		t.Fatalf("rls_descriptors nest %d deep", depth)
	}
	for _, n := range nodes {
		if n.Key == "" || n.Rule == nil && len(n.Descriptors) == 0 {
			t.Fatalf("rls_descriptors node %+v", n)
		}
		if n.Rule != nil && (!n.Rule.Limit.Valid() || n.Rule.Limit.Window > 0 || !n.Rule.Cluster) {
			t.Fatalf("rls_descriptors rule %+v", n.Rule)
		}
		checkRLSNodes(t, n.Descriptors, depth+1)
	}
}

func ruleNames(cfg *filter.Config) string {
	var names []string
	for _, r := range cfg.Rules() {
		names = append(names, r.Name)
	}
	return strings.Join(names, ",")
}

func finitePositive(x float64) bool { return x > 0 && !math.IsInf(x, 0) }

// checkConfig checks the invariants of a parsed configuration.
func checkConfig(t *testing.T, cfg *filter.Config) {
	t.Helper()
	rules := cfg.Rules()
	if (len(rules) == 0 || len(cfg.Policies) == 0) && len(cfg.RLSDescriptors) == 0 {
		t.Fatalf("accepted with %d rules in %d policies and no rls_descriptors", len(rules), len(cfg.Policies))
	}
	checkRLSNodes(t, nil, 1)
	for _, d := range cfg.RLSDescriptors {
		checkRLSNodes(t, d.Descriptors, 1)
	}
	s := cfg.Settings
	if s.MaxAttempts < 1 || s.MaxAttempts > 1000 || s.XFFTrustedHops < 0 || s.XFFTrustedHops > 10 || s.MaxKeysPerRule < 0 {
		t.Fatalf("settings out of range: %+v", s)
	}
	seen := map[string]bool{}
	inPolicies := 0
	for _, pol := range cfg.Policies {
		inPolicies += len(pol.Rules)
		if pol.Fallback != nil {
			inPolicies++
		}
		if len(pol.Rules) == 0 && pol.Fallback == nil {
			t.Fatalf("policy %q has no rules", pol.ID)
		}
		if pol.Selector.PathPrefix != "" && pol.Selector.PathPrefix[0] != '/' {
			t.Fatalf("policy %q: pathPrefix %q", pol.ID, pol.Selector.PathPrefix)
		}
	}
	if inPolicies != len(rules) {
		t.Fatalf("%d rules in policies, %d in Rules()", inPolicies, len(rules))
	}
	for _, r := range rules {
		if seen[r.Name] {
			t.Fatalf("duplicate rule name %q", r.Name)
		}
		seen[r.Name] = true
		if r.Name == "" || len(r.Name) > 64 || strings.Trim(r.Name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
			t.Fatalf("rule name %q", r.Name)
		}
		l := r.Limit
		if !finitePositive(l.Rate) || !finitePositive(l.Burst) || l.Burst < l.Rate || l.Rate > 1e9 || l.Burst > 1e12 || !l.Valid() {
			t.Fatalf("rule %q: limit %+v", r.Name, l)
		}
		if !finitePositive(r.Cost.Fixed) || !finitePositive(r.Cost.Default) {
			t.Fatalf("rule %q: cost %+v", r.Name, r.Cost)
		}
		if len(r.Keys) > 8 || r.MaxKeys < 0 || (len(r.Keys) == 0 && r.MaxKeys != 0) {
			t.Fatalf("rule %q: %d keys, max_keys %d", r.Name, len(r.Keys), r.MaxKeys)
		}
		for _, d := range r.Keys {
			if back, err := filter.ParseDescriptor(d.String()); err != nil || back != d {
				t.Fatalf("rule %q: descriptor %+v does not round-trip: %+v %v", r.Name, d, back, err)
			}
		}
	}
}

// FuzzParseCost: an accepted cost is a finite number >= 0.000001, exactly
// the decimal written; every plain decimal of at most 32 characters and at
// least 0.000001 is accepted.
func FuzzParseCost(f *testing.F) {
	for _, s := range []string{"1", "2.5", " 7 ", "0", "-1", "1e309", "NaN", "0x10", "00000000000000000000000000000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, ok := filter.ParseCost(s)
		trimmed := strings.Trim(s, " \t")
		plain := plainDecimal(trimmed) && len(trimmed) <= 32
		want, err := strconv.ParseFloat(trimmed, 64)
		if ok {
			if !finitePositive(v) || v < 1e-6 {
				t.Fatalf("ParseCost(%q) = %v", s, v)
			}
			if !plain || err != nil || v != want {
				t.Fatalf("ParseCost(%q) = %v, want rejected or %v", s, v, want)
			}
			return
		}
		if plain && err == nil && finitePositive(want) && want >= 1e-6 {
			t.Fatalf("ParseCost(%q) rejected the plain decimal %v", s, want)
		}
	})
}

// plainDecimal reports whether s is digits with at most one '.' between
// digits.
func plainDecimal(s string) bool {
	a, b, dot := strings.Cut(s, ".")
	digits := func(x string) bool {
		return x != "" && strings.Trim(x, "0123456789") == ""
	}
	return digits(a) && (!dot || digits(b))
}

// fuzzConfig has rules of every descriptor kind and cost source, a slotted
// rule with 4 slots (collisions and takeovers), a fallback, a global rule
// without limit keys ("tb:global:") and a shadow policy.
const fuzzConfig = `{"bundle_version":1,"settings":{"xff_trusted_hops":1},"policies":[
 {"id":"api","spec":{"selector":{"pathPrefix":"/api/"},"rules":[
   {"name":"per-key","limit_keys":["header:x-api-key"],"max_keys":4,"algorithm_config":{"rps":2,"burst":5,"cost_source":"header:x-cost"}},
   {"name":"per-sub","limit_keys":["jwt:sub"],"match":{"jwt:plan":"free"},"algorithm_config":{"rps":1,"burst":3}},
   {"name":"per-tenant","limit_keys":["query:tenant","method"],"max_keys":0,"algorithm_config":{"rps":5,"burst":10,"cost_source":"query:cost","default_cost":2}}],
  "fallback_limit":{"name":"api-anon","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":2}}}},
 {"id":"global","spec":{"rules":[{"name":"global","algorithm_config":{"rps":100,"burst":200,"cost_source":"header:x-cost"}}]}},
 {"id":"watch","spec":{"mode":"shadow","rules":[
   {"name":"watch-ip","limit_keys":["ip:address","host"],"max_keys":2,"algorithm_config":{"rps":1,"burst":1}}]}}]}`

// Bits of FuzzRequest's flags.
const (
	withAPIKey = 1 << iota
	withCost
	withAuth
	authIsPayload // auth is a JWT payload, sent as a bearer token
	withXFF
	withStored // stored is written under "tb:global:" first
)

// FuzzRequest sends fuzzed requests through the whole request path on the
// fake host: the status is 200 or 429; a 429 takes nothing from any enforce
// bucket (values unchanged, except new buckets seeded full and corrupt ones
// repaired to full); after a 200 every bucket holds tokens within [0, burst];
// a request that failed open changed nothing; headers stay in range.
func FuzzRequest(f *testing.F) {
	f.Add("/api/x?tenant=t&cost=3", "192.0.2.1:1", "k", "2", `{"sub":"u","plan":"free"}`, "203.0.113.1", []byte("1:1"), 0.1, uint8(0xff), uint8(3))
	f.Add("/", "[::1]:1", "", "", "", "", []byte(nil), 0.0, uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, path, addr, apiKey, cost, auth, xff string, stored []byte, dt float64, flags, n uint8) {
		fx := newFixture(t, fuzzConfig)
		bursts, rates := map[string]float64{}, map[string]float64{}
		for _, r := range fx.p.Config().Rules() {
			bursts[r.Name], rates[r.Name] = r.Limit.Burst, r.Limit.Rate
		}
		if flags&withStored != 0 {
			fx.put("tb:global:", string(stored))
		}
		req := filtertest.Get(path, addr)
		add := func(bit uint8, name, value string) {
			if flags&bit != 0 {
				req.Headers = append(req.Headers, [2]string{name, value})
			}
		}
		add(withAPIKey, "x-api-key", apiKey)
		add(withCost, "x-cost", cost)
		if flags&authIsPayload != 0 {
			auth = jwtOf(auth)
		}
		add(withAuth, "authorization", auth)
		add(withXFF, "x-forwarded-for", xff)
		mem := fx.mem()
		for i := 0; i <= int(n%4); i++ {
			fx.now = epoch + float64(i)*dt
			before := mem.Snapshot("")
			res := fx.do(req)
			after := mem.Snapshot("")
			switch res.Status() {
			case 200:
				if res.Header("ratelimit-limit") == "" {
					// No enforce rule applies (impossible: global always
					// does) or the request failed open: nothing changed.
					if !sameValues(before, after) {
						t.Fatalf("request %d failed open but changed the store:\n%v\n%v", i, before, after)
					}
					continue
				}
				checkBuckets(t, i, after, bursts)
				checkHeaderNumbers(t, res)
				lim, _ := strconv.ParseInt(res.Header("ratelimit-limit"), 10, 64)
				if left := remaining(res); left < 0 || left > lim {
					t.Fatalf("request %d: RateLimit-Remaining %d of %d", i, left, lim)
				}
			case 429, 413:
				checkHeaderNumbers(t, res)
				if (res.Status() == 413) != (res.Header("x-tokengate-reason") == filter.ReasonCostExceedsBurst) {
					t.Fatalf("request %d: status %d with reason %q: 413 is for cost_exceeds_burst only", i, res.Status(), res.Header("x-tokengate-reason"))
				}
				rule := res.Header("x-tokengate-rule")
				if _, ok := bursts[rule]; !ok {
					t.Fatalf("request %d: rejected by unknown rule %q", i, rule)
				}
				checkRejectedTookNothing(t, i, before, after, bursts, fx.now)
				if res.Header("x-tokengate-reason") == filter.ReasonExceeded {
					limit := int(math.Ceil(bursts[rule]/rates[rule])*1.5 + 1)
					if ra, err := strconv.Atoi(res.Header("retry-after")); err != nil || ra < 1 || ra > limit {
						t.Fatalf("request %d: Retry-After %q, want 1 to %d", i, res.Header("retry-after"), limit)
					}
				}
			default:
				t.Fatalf("request %d: status %d", i, res.Status())
			}
			for _, e := range after {
				if len(e.Key) > 256 || len(e.Value) > 600 {
					t.Fatalf("request %d: entry too big: key %d bytes, value %d bytes", i, len(e.Key), len(e.Value))
				}
			}
			if len(after) > len(before)+12 {
				t.Fatalf("request %d created %d keys", i, len(after)-len(before))
			}
		}
		checkNoPanicsTB(t, fx)
	})
}

func checkNoPanicsTB(t *testing.T, f *fixture) {
	t.Helper()
	if n := f.global(filter.MetricPanics); n != 0 {
		t.Fatalf("tokengate.panics = %d: %q", n, f.h.Logs(filter.LogCritical))
	}
}

// checkBuckets checks that every bucket in the snapshot parses and holds
// tokens within [0, burst] of its rule.
func checkBuckets(t *testing.T, i int, snap []sharedstatetest.Entry, bursts map[string]float64) {
	t.Helper()
	for _, e := range snap {
		rule, _, ok := ruleOfKey(e.Key)
		if !ok {
			continue // the slot seed
		}
		burst, known := bursts[rule]
		if !known {
			t.Fatalf("request %d: key %q of no rule", i, e.Key)
		}
		tokens, _, err := parseStored(e.Value)
		if err != nil || tokens < 0 || tokens > burst {
			t.Fatalf("request %d: %s = %q: tokens outside [0, %v] (%v)", i, e.Key, e.Value, burst, err)
		}
	}
}

// checkRejectedTookNothing compares the enforce buckets before and after a
// rejected request. A rejection may write only: a full bucket in place of a
// missing or unreadable value, or the same tokens re-anchored at now when
// the clock has stepped back (see Updater).
func checkRejectedTookNothing(t *testing.T, i int, before, after []sharedstatetest.Entry, bursts map[string]float64, now float64) {
	t.Helper()
	old := map[string]string{}
	for _, e := range before {
		old[e.Key] = e.Value
	}
	now = sharedstate.Quantize(now)
	for _, e := range after {
		rule, shadow, ok := ruleOfKey(e.Key)
		if !ok || shadow {
			continue // shadow buckets observe every request
		}
		prev, existed := old[e.Key]
		if existed && prev == e.Value {
			continue
		}
		tokens, last, err := parseStored(e.Value)
		if err != nil {
			t.Fatalf("request %d was rejected and wrote %s = %q: %v", i, e.Key, e.Value, err)
		}
		pt, pl, perr := parseStored(prev)
		readable := existed && perr == nil && pl <= now+sharedstate.DefaultMaxFuture
		switch {
		case !readable && tokens == bursts[rule] && last == now:
			// seeded or repaired: a full bucket
		case readable && pl > now && last == now && tokens == min(pt, bursts[rule]):
			// re-anchored after the clock stepped back
		default:
			t.Fatalf("request %d was rejected but %s changed from %q to %q", i, e.Key, prev, e.Value)
		}
	}
}
