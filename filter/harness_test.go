package filter_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// This file holds the fixture shared by the reliability tests
// (hostile_test.go, clock_test.go, reload_test.go, faults_test.go and the fuzz
// targets). It reads shared data only through keys of rules without
// limit_keys ("tb:<rule>:"), whose key format is fixed, and parses only the
// first two fields of a stored value, so that the tests survive an extension
// of the value format (a third ":owner" field).

// epoch is a fixed instant, 2025-01-15T11:20:00Z, in seconds since the Unix
// epoch.
const epoch = 1736940000.0

// fixture is one configured plugin on a fake host with a settable clock.
type fixture struct {
	t   testing.TB
	h   *filtertest.Host
	p   *filter.Plugin
	now float64 // what the plugin's clock returns
}

// newFixture returns a plugin configured with config at epoch; it fails the
// test if the configuration is refused.
func newFixture(t testing.TB, config string) *fixture {
	t.Helper()
	f := &fixture{t: t, h: filtertest.New(), now: epoch}
	f.p = filter.NewPlugin(f.h)
	f.p.Clock = func() float64 { return f.now }
	if !f.p.OnConfigure([]byte(config)) {
		t.Fatalf("OnConfigure refused the configuration: %q", f.h.Logs(filter.LogError))
	}
	return f
}

// mem returns the fixture's in-memory store, under any FaultStore wrapper.
func (f *fixture) mem() *sharedstatetest.Store {
	f.t.Helper()
	s := f.h.Store
	if fs, ok := s.(*sharedstatetest.FaultStore); ok {
		s = fs.Store
	}
	m, ok := s.(*sharedstatetest.Store)
	if !ok {
		f.t.Fatalf("store is a %T, not a MemStore", s)
	}
	return m
}

// do runs one request through the plugin.
func (f *fixture) do(req filtertest.Request) filtertest.Result {
	return f.h.Do(f.p, req)
}

// get runs a GET / from 192.0.2.1 with the given extra headers.
func (f *fixture) get(headers ...string) filtertest.Result {
	return f.do(filtertest.Get("/", "192.0.2.1:5000", headers...))
}

// counter returns a rule's counter; an undefined counter fails the test.
func (f *fixture) counter(rule, name string) int64 {
	f.t.Helper()
	v, ok := f.h.Counter(filter.RuleMetricName(rule, name))
	if !ok {
		f.t.Fatalf("counter %s of rule %s is not defined", name, rule)
	}
	return v
}

// global returns a plugin-wide counter such as filter.MetricCorruptState.
func (f *fixture) global(name string) int64 {
	f.t.Helper()
	v, ok := f.h.Counter(name)
	if !ok {
		f.t.Fatalf("counter %s is not defined", name)
	}
	return v
}

// put writes a raw value into the store, unconditionally.
func (f *fixture) put(key, value string) {
	f.t.Helper()
	if err := f.mem().Set(key, []byte(value), 0); err != nil {
		f.t.Fatal(err)
	}
}

// raw returns the value stored under key, or "<missing>".
func (f *fixture) raw(key string) string {
	f.t.Helper()
	v, _, err := f.mem().Get(key)
	if err != nil {
		return "<missing>"
	}
	return string(v)
}

// state parses the value stored under key; a missing or unreadable value
// fails the test.
func (f *fixture) state(key string) (tokens, last float64) {
	f.t.Helper()
	v := f.raw(key)
	tokens, last, err := parseStored(v)
	if err != nil {
		f.t.Fatalf("value under %q: %v", key, err)
	}
	return tokens, last
}

// parseStored parses the first two fields of a stored bucket value,
// "tokens:last_refill[:...]", with sharedstate.ParseState.
func parseStored(v string) (tokens, last float64, err error) {
	a, rest, _ := strings.Cut(v, ":")
	b, _, _ := strings.Cut(rest, ":")
	s, err := sharedstate.ParseState([]byte(a + ":" + b))
	return s.Tokens, s.Last, err
}

// ruleOfKey returns the rule name of a shared-data key "tb:<rule>:..." or
// "shadow:tb:<rule>:...", and whether it is a shadow key.
func ruleOfKey(key string) (rule string, shadow bool, ok bool) {
	rest, shadow := strings.CutPrefix(key, "shadow:")
	rest, ok = strings.CutPrefix(rest, "tb:")
	if !ok {
		return "", false, false
	}
	rule, _, ok = strings.Cut(rest, ":")
	return rule, shadow, ok
}

// remaining returns RateLimit-Remaining as a number, or -1 if it is absent.
func remaining(res filtertest.Result) int64 {
	v := res.Header("ratelimit-remaining")
	if v == "" {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return -2
	}
	return n
}

// clip shortens a test input for a subtest name or message.
func clip(s string) string {
	if len(s) > 24 {
		return s[:24] + "…(" + strconv.Itoa(len(s)) + " bytes)"
	}
	return s
}
