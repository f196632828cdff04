package filter_test

import (
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

func finitePositive(x float64) bool { return x > 0 && !math.IsInf(x, 0) }

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
				if err := res.HeaderNumbersError(); err != nil {
					t.Fatal(err)
				}
				lim, _ := strconv.ParseInt(res.Header("ratelimit-limit"), 10, 64)
				if left := remaining(res); left < 0 || left > lim {
					t.Fatalf("request %d: RateLimit-Remaining %d of %d", i, left, lim)
				}
			case 429, 413:
				if err := res.HeaderNumbersError(); err != nil {
					t.Fatal(err)
				}
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
