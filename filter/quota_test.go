package filter_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// quotaCfg is one quota rule per API key whose identity may carry its own
// limit in x-plan-limit (bounded by max_limit in the service), and
// settings.rls.on_error ON_ERROR.
const quotaCfg = `{"rules":[
	{"name":"monthly","scope":"cluster","algorithm":"quota","limit_keys":["header:x-api-key"],
	 "algorithm_config":{"limit":1000,"period":"month","limit_source":"header:x-plan-limit","max_limit":5000}}],
	"settings":{"rls":{"cluster":"rls","domain":"edge","timeout_ms":25,"on_error":"ON_ERROR"}}}`

// TestQuotaDescriptor: a quota rule is asked of the service as a cluster
// rule is, and the identity's limit, read where limit_source says, travels
// as the descriptor's third entry (tokengate_limit) as the request states
// it; a request without it sends the two entries of any cluster rule.
func TestQuotaDescriptor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []string
		want    []string // parts the call's body must hold
		absent  []string // and must not
	}{
		{"identity limit", []string{"x-api-key", "acme", "x-plan-limit", "2500"},
			[]string{"tokengate_rule", "monthly", "acme", "tokengate_limit", "2500"}, nil},
		{"no identity limit", []string{"x-api-key", "acme"},
			[]string{"tokengate_rule", "monthly", "acme"}, []string{"tokengate_limit"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, strings.Replace(quotaCfg, "ON_ERROR", "deny", 1))
			_, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000", tc.headers...))
			if res.RequestAction != filter.Pause || len(f.h.Calls) != 1 {
				t.Fatalf("action %v, %d calls; want a paused request and one call", res.RequestAction, len(f.h.Calls))
			}
			body := f.h.Calls[0].Body
			for _, p := range tc.want {
				if !bytes.Contains(body, []byte(p)) {
					t.Errorf("call body %q lacks %q", body, p)
				}
			}
			for _, p := range tc.absent {
				if bytes.Contains(body, []byte(p)) {
					t.Errorf("call body %q has %q", body, p)
				}
			}
		})
	}
}

// TestQuotaOnErrorLocal: settings.rls.on_error "local" cannot decide a
// quota in this proxy's shared data (its consumption is counted in the
// service only), so a quota rule fails open when the service fails:
// allowed, counted fail_open, and no shared-data bucket written for it.
func TestQuotaOnErrorLocal(t *testing.T) {
	f := newFixture(t, strings.Replace(quotaCfg, "ON_ERROR", "local", 1))
	f.h.CallError = errors.New("no such cluster")
	for i := 0; i < 3; i++ {
		_, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:1", "x-api-key", "acme"))
		if res.Local != nil {
			t.Fatalf("request %d: local reply %+v, want it let through", i, res.Local)
		}
	}
	if got := f.counter("monthly", filter.CounterFailOpen); got != 3 {
		t.Errorf("fail_open = %d, want 3", got)
	}
	if got := f.counter("monthly", filter.CounterAllowed); got != 0 {
		t.Errorf("allowed = %d, want 0 (nothing decided it)", got)
	}
	if snap := f.h.Store.(*sharedstatetest.Store).Snapshot("tb:"); len(snap) != 0 {
		t.Errorf("shared data written for a quota: %v", snap)
	}
}
