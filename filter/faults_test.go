package filter_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// Store faults and injected panics with two rules, a and b, without limit
// keys, so that the state of each bucket can be read under "tb:a:" and
// "tb:b:". TestFailOpen covers one rule; these cover what happens to the
// other bucket of an all-or-nothing update.

func twoRules(bPolicy string) string {
	return `{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":10}},
		{"name":"b","on_store_error":"` + bPolicy + `","algorithm_config":{"rps":1,"burst":10}}],
		"settings":{"cas_max_attempts":5}}`
}

// vanishingStore is a store that never keeps anything, like a Kong shm_kv
// zone evicting every key at once.
type vanishingStore struct{ gets, sets int }

func (v *vanishingStore) Get(string) ([]byte, uint32, error) {
	v.gets++
	return nil, 0, sharedstate.ErrNotFound
}

func (v *vanishingStore) Set(string, []byte, uint32) error {
	v.sets++
	return nil
}

func TestStoreFaultsTwoRules(t *testing.T) {
	boom := errors.New("internal failure")
	onKey := func(key string, err error) func(string) error {
		return func(k string) error {
			if k == key {
				return err
			}
			return nil
		}
	}
	tests := []struct {
		name        string
		bPolicy     string
		getErr      func(string) error
		setErr      func(string, []byte, uint32) error
		wantStatus  uint32
		wantCounter string // counted once per request: on each rule (fail_open), or on b, the denying rule
		wantCAS     int64  // cas_retries counted on each rule
	}{
		{"get of b fails, allow", "allow", onKey("tb:b:", boom), nil, 200, filter.CounterFailOpen, 0},
		{"get of b fails, deny", "deny", onKey("tb:b:", boom), nil, 503, filter.CounterStoreDenied, 0},
		{"set of b fails after a was written: a is refunded", "allow", nil,
			func(k string, _ []byte, _ uint32) error { return onKey("tb:b:", boom)(k) }, 200, filter.CounterFailOpen, 0},
		{"set of b fails, deny", "deny", nil,
			func(k string, _ []byte, _ uint32) error { return onKey("tb:b:", boom)(k) }, 503, filter.CounterStoreDenied, 0},
		{"CAS storm on b: a is refunded every round", "allow", nil,
			func(k string, _ []byte, _ uint32) error { return onKey("tb:b:", sharedstate.ErrCASMismatch)(k) }, 200, filter.CounterFailOpen, 5},
		{"CAS storm on a, deny on b", "deny", nil,
			func(k string, _ []byte, _ uint32) error { return onKey("tb:a:", sharedstate.ErrCASMismatch)(k) }, 503, filter.CounterStoreDenied, 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, twoRules(tc.bPolicy))
			if res := f.get(); res.Status() != 200 || remaining(res) != 9 {
				t.Fatalf("warm-up: got %d remaining %d", res.Status(), remaining(res))
			}
			mem := f.mem()
			before := mem.Snapshot("")
			f.h.Store = &sharedstatetest.FaultStore{Store: mem, GetErr: tc.getErr, SetErr: tc.setErr}
			for i := 0; i < 3; i++ {
				res := f.get()
				if res.Status() != tc.wantStatus {
					t.Fatalf("request %d: got %d, want %d", i, res.Status(), tc.wantStatus)
				}
				if tc.wantStatus == 200 && len(res.Headers) != 0 {
					t.Errorf("request %d: a failed-open request carries headers %v", i, res.Headers)
				}
				wantReason := filter.ReasonStoreError
				if tc.wantCAS > 0 {
					wantReason = filter.ReasonContention // the store works; the key is too hot
				}
				if tc.wantStatus == 503 && (res.Header("x-tokengate-reason") != wantReason || res.Header("x-tokengate-rule") != "b") {
					t.Errorf("request %d: reason %q rule %q, want %q from b, the rule that denies", i,
						res.Header("x-tokengate-reason"), res.Header("x-tokengate-rule"), wantReason)
				}
			}
			if after := mem.Snapshot(""); !sameValues(before, after) {
				t.Errorf("state changed:\n before %v\n  after %v", before, after)
			}
			for _, r := range []string{"a", "b"} {
				want := int64(3)
				if tc.wantCounter == filter.CounterStoreDenied && r == "a" {
					want = 0 // a allows on store errors: only b denies, and counts
				}
				if got := f.counter(r, tc.wantCounter); got != want {
					t.Errorf("%s %s: got %d, want %d", r, tc.wantCounter, got, want)
				}
				wantContention := int64(0)
				if tc.wantCAS > 0 {
					wantContention = 3
				}
				if got := f.counter(r, filter.CounterContention); got != wantContention {
					t.Errorf("%s contention: got %d, want %d", r, got, wantContention)
				}
				if got := f.counter(r, filter.CounterCASRetries); got != 3*tc.wantCAS {
					t.Errorf("%s cas_retries: got %d, want %d", r, got, 3*tc.wantCAS)
				}
				if got := f.counter(r, filter.CounterAllowed); got != 1 {
					t.Errorf("%s allowed: got %d, want 1 (the warm-up)", r, got)
				}
			}
			if len(f.h.Logs(filter.LogWarn)) < 3 {
				t.Errorf("store failures were not logged: %q", f.h.Logs(filter.LogWarn))
			}
			checkNoPanics(t, f)
		})
	}
}

// sameValues reports whether two snapshots hold the same values under the
// same keys; CAS values are ignored (a refund writes the value back).
func sameValues(a, b []sharedstatetest.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}

// TestTransientCASMismatch: a few lost races cost retries, never a second
// token.
func TestTransientCASMismatch(t *testing.T) {
	f := newFixture(t, twoRules("allow"))
	f.get()
	lose := 3
	f.h.Store = &sharedstatetest.FaultStore{Store: f.mem(), SetErr: func(k string, _ []byte, _ uint32) error {
		if k == "tb:b:" && lose > 0 {
			lose--
			return sharedstate.ErrCASMismatch
		}
		return nil
	}}
	if res := f.get(); res.Status() != 200 || remaining(res) != 8 {
		t.Fatalf("got %d remaining %d, want 200 and 8", res.Status(), remaining(res))
	}
	for _, r := range []string{"a", "b"} {
		if tokens, _ := f.state("tb:" + r + ":"); tokens != 8 {
			t.Errorf("%s: got %v tokens, want 8 (one token per request, however many rounds)", r, tokens)
		}
		if got := f.counter(r, filter.CounterCASRetries); got != 3 {
			t.Errorf("%s cas_retries: got %d, want 3", r, got)
		}
	}
}

// TestVanishingStore: a store that loses every key (Kong evicting, or a
// broken host) costs a bounded number of calls per request and fails open,
// or closed for on_store_error "deny".
func TestVanishingStore(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   uint32
	}{{"allow", 200}, {"deny", 503}} {
		t.Run(tc.policy, func(t *testing.T) {
			f := newFixture(t, twoRules(tc.policy))
			v := &vanishingStore{}
			f.h.Store = v
			for i := 0; i < 10; i++ {
				if got := f.get().Status(); got != tc.want {
					t.Fatalf("request %d: got %d, want %d", i, got, tc.want)
				}
			}
			// cas_max_attempts is 5: at most 5 seeds and 6 reads per request.
			if v.sets > 10*5 || v.gets > 10*6 {
				t.Errorf("10 requests made %d gets and %d sets, want at most 60 and 50", v.gets, v.sets)
			}
		})
	}
}

// TestKongSemantics runs burst-then-429 against ngx_wasm_module's CAS rules
// (cas 0 means "must be absent").
func TestKongSemantics(t *testing.T) {
	for _, config := range []string{
		`{"name":"k","algorithm_config":{"rps":1,"burst":3}}`,
		`{"name":"k","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}}`,
	} {
		f := newFixture(t, config)
		f.h.Store = sharedstatetest.New(sharedstate.Kong)
		for i, want := range []int64{2, 1, 0, -1} {
			res := f.get()
			if want < 0 {
				if res.Status() != 429 {
					t.Errorf("%s request %d: got %d, want 429", config, i, res.Status())
				}
				continue
			}
			if res.Status() != 200 || remaining(res) != want {
				t.Errorf("%s request %d: got %d remaining %d, want 200 and %d", config, i, res.Status(), remaining(res), want)
			}
		}
		if got := f.counter("k", filter.CounterFailOpen); got != 0 {
			t.Errorf("%s: fail_open %d", config, got)
		}
	}
}

// hookHost is a filtertest.Host whose calls can be made to panic.
type hookHost struct {
	*filtertest.Host
	onProperty, onSetHeader, onSend, onDefine func()
}

func (h *hookHost) Property(path ...string) ([]byte, bool) {
	if h.onProperty != nil {
		h.onProperty()
	}
	return h.Host.Property(path...)
}

func (h *hookHost) PropertyString(path ...string) (string, bool) {
	if h.onProperty != nil {
		h.onProperty()
	}
	return h.Host.PropertyString(path...)
}

func (h *hookHost) SetResponseHeader(name, value string) {
	if h.onSetHeader != nil {
		h.onSetHeader()
	}
	h.Host.SetResponseHeader(name, value)
}

func (h *hookHost) AddResponseHeader(name, value string) {
	if h.onSetHeader != nil {
		h.onSetHeader()
	}
	h.Host.AddResponseHeader(name, value)
}

func (h *hookHost) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpc int32) error {
	if h.onSend != nil {
		h.onSend()
	}
	return h.Host.SendLocalResponse(status, details, body, headers, grpc)
}

func (h *hookHost) DefineCounter(name string) (uint32, error) {
	if h.onDefine != nil {
		h.onDefine()
	}
	return h.Host.DefineCounter(name)
}

// TestInjectedPanics makes one host call at a time panic, with a string, an
// error, a runtime error or another value, and checks that the callback
// recovers, fails open, counts and logs it, and leaves the buckets as a
// failed-open request leaves them.
func TestInjectedPanics(t *testing.T) {
	const cfg = `{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":2}},
		{"name":"ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":100}}]}`
	runtimeErr := func() {
		var m map[string]int
		//lint:ignore SA5000 the point: a runtime error to inject
		m["x"] = 1
	}
	tests := []struct {
		name       string
		inject     func(h *hookHost, fs *sharedstatetest.FaultStore, fire func())
		drainFirst bool   // drain a so that the request is rejected
		wantMsg    string // in the critical log
		wantTokens float64
		callback   string
	}{
		{"store get", func(h *hookHost, fs *sharedstatetest.FaultStore, fire func()) {
			fs.GetErr = func(string) error { fire(); return nil }
		}, false, "injected", 1, "proxy_on_request_headers"},
		{"store set of the first bucket", func(h *hookHost, fs *sharedstatetest.FaultStore, fire func()) {
			fs.SetErr = func(k string, _ []byte, _ uint32) error {
				if k == "tb:a:" {
					fire()
				}
				return nil
			}
		}, false, "injected", 1, "proxy_on_request_headers"},
		{"source.address property", func(h *hookHost, fs *sharedstatetest.FaultStore, fire func()) {
			h.onProperty = fire
		}, false, "injected", 1, "proxy_on_request_headers"},
		{"response headers", func(h *hookHost, fs *sharedstatetest.FaultStore, fire func()) {
			h.onSetHeader = fire
		}, false, "injected", 0, "proxy_on_response_headers"},
		{"local reply of a rejection", func(h *hookHost, fs *sharedstatetest.FaultStore, fire func()) {
			h.onSend = fire
		}, true, "injected", 0, "proxy_on_request_headers"},
	}
	panics := []struct {
		name    string
		fire    func()
		wantMsg string
	}{
		{"string", func() { panic("injected") }, "injected"},
		{"error", func() { panic(errors.New("injected error")) }, "injected error"},
		{"runtime error", runtimeErr, "assignment to entry in nil map"},
		{"other value", func() { panic(42) }, "unknown value"},
	}
	for _, tc := range tests {
		for _, pv := range panics {
			t.Run(tc.name+"/"+pv.name, func(t *testing.T) {
				h := &hookHost{Host: filtertest.New()}
				mem := h.Store
				fs := &sharedstatetest.FaultStore{Store: mem}
				h.Store = fs
				p := filter.NewPlugin(h)
				now := epoch
				p.Clock = func() float64 { return now }
				if !p.OnConfigure([]byte(cfg)) {
					t.Fatal("configuration refused")
				}
				req := filtertest.Get("/", "192.0.2.1:1")
				if res := h.Do(p, req); res.Status() != 200 {
					t.Fatalf("warm-up: %d", res.Status())
				}
				if tc.drainFirst {
					h.Do(p, req)
				}
				armed := true
				tc.inject(h, fs, func() {
					if armed {
						armed = false
						pv.fire()
					}
				})
				res := h.Do(p, req)
				if res.Status() != 200 || res.RequestAction != filter.Continue || res.ResponseAction != filter.Continue {
					t.Fatalf("got %d actions %d/%d, want 200 Continue/Continue", res.Status(), res.RequestAction, res.ResponseAction)
				}
				if armed {
					t.Fatal("the panic was never injected")
				}
				if v, _ := h.Counter(filter.MetricPanics); v != 1 {
					t.Errorf("panics: got %d, want 1", v)
				}
				logs := h.Logs(filter.LogCritical)
				if len(logs) != 1 || !strings.Contains(logs[0], tc.callback) || !strings.Contains(logs[0], pv.wantMsg) {
					t.Errorf("critical logs: got %q, want one naming %s and %q", logs, tc.callback, pv.wantMsg)
				}
				v, _, _ := mem.Get("tb:a:")
				if tokens, _, err := parseStored(string(v)); err != nil || tokens != tc.wantTokens {
					t.Errorf("bucket a: got %q, want %v tokens", v, tc.wantTokens)
				}
				// The next request works normally.
				tc.inject(h, fs, func() {})
				if res := h.Do(p, req); res.Status() != 200 && res.Status() != 429 {
					t.Errorf("next request: got %d", res.Status())
				}
			})
		}
	}
}

// TestPanicDuringReloadKeepsOld: a panic while a new configuration is put in
// force (here defining its metrics) refuses it; the old one stays.
func TestPanicDuringReloadKeepsOld(t *testing.T) {
	h := &hookHost{Host: filtertest.New()}
	p := filter.NewPlugin(h)
	p.Clock = func() float64 { return epoch }
	if !p.OnConfigure([]byte(ruleG("1", "3"))) {
		t.Fatal("configuration refused")
	}
	old := p.Config()
	h.onDefine = func() { panic("injected") }
	if p.OnConfigure([]byte(`{"name":"new","algorithm_config":{"rps":1,"burst":100}}`)) {
		t.Fatal("a configuration whose setup panicked was accepted")
	}
	h.onDefine = nil
	if p.Config() != old {
		t.Fatal("the configuration in force changed")
	}
	for i, want := range []uint32{200, 200, 200, 429} {
		if res := h.Do(p, filtertest.Get("/", "192.0.2.1:1")); res.Status() != want {
			t.Errorf("request %d: got %d, want %d from the old rule g", i, res.Status(), want)
		}
	}
	if v, _ := h.Counter(filter.MetricPanics); v != 1 {
		t.Errorf("panics: got %d, want 1", v)
	}
}
