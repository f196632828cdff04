package filter_test

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
)

// noTicker hides filtertest.Host's timer, as a host without
// proxy_set_tick_period_milliseconds would.
type noTicker struct{ *filtertest.Host }

func (noTicker) SetTickPeriod() {}

// noBody hides filtertest.Host's response body access.
type noBody struct{ *filtertest.Host }

func (noBody) ResponseBody() {}

// TestCapabilitiesLoggedAtConfigure: a configuration that needs what the
// host lacks is accepted, with one warn line naming the rule, the missing
// capability and what the filter does instead; a host with everything
// logs nothing.
func TestCapabilitiesLoggedAtConfigure(t *testing.T) {
	const delayCfg = `{"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5}}`
	const bodyCfg = `{"name":"llm","algorithm_config":{"rps":1,"burst":100,"cost_source":"response_json:/usage/total_tokens","pre_charge":10}}`
	tests := []struct {
		name     string
		host     func(*filtertest.Host) filter.Host
		config   string
		expected []string // substrings of the one warn line; none: no line
	}{
		{"everything", func(h *filtertest.Host) filter.Host { return h }, leaseCfg, nil},
		{"cluster without callouts", func(h *filtertest.Host) filter.Host { return noCallouts{h} },
			strings.Replace(clusterCfg, "ON_ERROR", "deny", 1),
			[]string{"HTTP callouts", "rule global-ip ", "settings.rls.on_error"}},
		{"lease without callouts", func(h *filtertest.Host) filter.Host { return noCallouts{h} }, leaseCfg,
			[]string{"HTTP callouts", "rule lease-ip ", "on_error"}},
		{"lease without a timer", func(h *filtertest.Host) filter.Host { return noTicker{h} }, leaseCfg,
			[]string{"timer", "rule lease-ip ", "makes its own call"}},
		{"delay without callouts", func(h *filtertest.Host) filter.Host { return noCallouts{h} }, delayCfg,
			[]string{"stream resumption", "rule g ", "rejected instead"}},
		{"delay without a timer", func(h *filtertest.Host) filter.Host { return noTicker{h} }, delayCfg,
			[]string{"timer", "rule g ", "max_reserved"}},
		{"body cost without body access", func(h *filtertest.Host) filter.Host { return noBody{h} }, bodyCfg,
			[]string{"response body", "rule llm ", "default_cost"}},
		{"local rules need nothing", func(h *filtertest.Host) filter.Host { return noCallouts{h} },
			`{"name":"g","algorithm_config":{"rps":10,"burst":10}}`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := filtertest.New()
			p := filter.NewPlugin(tc.host(h))
			p.Clock = func() float64 { return epoch }
			if !p.OnConfigure([]byte(tc.config)) {
				t.Fatalf("configuration refused: %q", h.Logs(filter.LogError))
			}
			logs := h.Logs(filter.LogWarn)
			if tc.expected == nil {
				if len(logs) != 0 {
					t.Errorf("got warn lines %q, want none", logs)
				}
				return
			}
			if len(logs) != 1 {
				t.Fatalf("got warn lines %q, want one", logs)
			}
			for _, want := range tc.expected {
				if !strings.Contains(logs[0], want) {
					t.Errorf("warn line %q does not say %q", logs[0], want)
				}
			}
		})
	}
}

// TestLeaseWithoutCalloutsTakesOnError: on a host with a timer but no
// callouts, a lease request its allowance cannot cover takes on_error at
// once. It used to wait for a refill that could not be asked for, and the
// tick that gave up on it resumed it through a host without stream
// resumption (a panic, recovered as a fail-open).
func TestLeaseWithoutCalloutsTakesOnError(t *testing.T) {
	h := filtertest.New()
	p := filter.NewPlugin(noCallouts{h})
	now := epoch
	p.Clock = func() float64 { return now }
	if !p.OnConfigure([]byte(strings.Replace(leaseCfg, `"timeout_ms":50`, `"timeout_ms":50,"on_error":"deny"`, 1))) {
		t.Fatalf("configuration refused: %q", h.Logs(filter.LogError))
	}
	res := h.Do(p, filtertest.Get("/", "192.0.2.1:5000"))
	if res.Status() != 503 {
		t.Fatalf("status %d, want on_error deny's 503 at once", res.Status())
	}
	for range 3 {
		now += 0.1
		p.OnTick()
	}
	if n, _ := h.Counter(filter.MetricPanics); n != 0 {
		t.Errorf("tokengate.panics = %d, want 0: %q", n, h.Logs(filter.LogCritical))
	}
	if got := p.TickPeriod(); got != 0 {
		t.Errorf("tick period %d ms, want 0: nothing to refill without callouts", got)
	}
}
