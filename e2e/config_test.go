package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestInvalidConfig: the host refuses to start a plugin whose configuration
// the filter rejects, and both its error and the filter's error-level log
// line carry the filter's exact message.
func TestInvalidConfig(t *testing.T) {
	tests := []struct {
		name        string
		config      string
		expectedErr string
	}{
		{
			name:        "burst below rate",
			config:      `{"name":"r","algorithm_config":{"tokens_per_second":100,"burst":50}}`,
			expectedErr: "algorithm_config.burst: must be >= tokens_per_second (100), got 50",
		},
		{
			name:        "burst below rps alias",
			config:      `{"rules":[{"name":"a","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":5}}]}`,
			expectedErr: "rules[0].algorithm_config.burst: must be >= rps (10), got 5",
		},
		{
			name:   "unknown descriptor",
			config: `{"rules":[{"name":"a","limit_keys":["cookie:x"],"algorithm_config":{"rps":10,"burst":10}}]}`,
			expectedErr: `rules[0].limit_keys[0]: invalid descriptor "cookie:x" (want ip:address, header:<name>, query:<name>, ` +
				`jwt:<claim>, path, method or host; names match [A-Za-z0-9_-]+)`,
		},
		{
			name:        "duplicate rule name",
			config:      `{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":1}},{"name":"a","algorithm_config":{"rps":1,"burst":1}}]}`,
			expectedErr: `rules[1].name: duplicate rule name "a" (first used at rules[0].name)`,
		},
		{
			name:        "negative max_keys",
			config:      `{"rules":[{"name":"a","limit_keys":["ip:address"],"max_keys":-1,"algorithm_config":{"rps":1,"burst":1}}]}`,
			expectedErr: "rules[0].max_keys: must be an integer from 0 (unbounded) to 16777216, got -1",
		},
		{
			name:        "cas_max_attempts zero",
			config:      `{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":1}}],"settings":{"cas_max_attempts":0}}`,
			expectedErr: "settings.cas_max_attempts: must be an integer from 1 to 1000, got 0",
		},
		{
			name:        "bundle version",
			config:      `{"bundle_version":2,"policies":[]}`,
			expectedErr: "bundle_version: must be 1, got 2",
		},
		{
			name:        "empty",
			config:      ``,
			expectedErr: "configuration is empty",
		},
		// Issue 31: the module refuses a quota that is not an exact cluster
		// rule, and checks the fields it uses, with the native messages.
		{
			name:        "local quota",
			config:      `{"rules":[{"name":"q","algorithm":"quota","algorithm_config":{"limit":5,"period":"day"}}]}`,
			expectedErr: `rules[0].scope: "algorithm": "quota" needs "scope": "cluster": a period's consumption is counted by the rate-limit service for the whole fleet`,
		},
		{
			name: "lease quota",
			config: `{"rules":[{"name":"q","scope":"cluster","mode":"lease","algorithm":"quota","algorithm_config":{"limit":5,"period":"day"}}],` +
				`"settings":{"rls":{"cluster":"rls"}}}`,
			expectedErr: `rules[0].mode: "algorithm": "quota" cannot be "lease": a lease hands a proxy tokens that refill over time, ` +
				`while a period's consumption must be counted where it is stored; use "mode": "exact" (docs/configuration.md)`,
		},
		{
			name:        "quota period",
			config:      `{"rules":[{"name":"q","scope":"cluster","algorithm":"quota","algorithm_config":{"limit":5,"period":"year"}}],"settings":{"rls":{"cluster":"rls"}}}`,
			expectedErr: `rules[0].algorithm_config.period: must be "hour", "day", "week" or "month", got "year"`,
		},
		{
			name: "quota limit source without its bound",
			config: `{"rules":[{"name":"q","scope":"cluster","algorithm":"quota","algorithm_config":{"limit":5,"period":"day","limit_source":"jwt:quota"}}],` +
				`"settings":{"rls":{"cluster":"rls"}}}`,
			expectedErr: `rules[0].algorithm_config.max_limit: is required with limit_source, and only with it: it bounds the limit a request carries`,
		},
		{
			name:        "quota unknown field",
			config:      `{"rules":[{"name":"q","scope":"cluster","algorithm":"quota","algorithm_config":{"limit":5,"period":"day","burst":5}}],"settings":{"rls":{"cluster":"rls"}}}`,
			expectedErr: `rules[0].algorithm_config.burst: unknown field (allowed: limit, period, time_zone, billing_day, thresholds, limit_source, max_limit, cost_source, fixed_cost, default_cost, count_statuses, reset_on_statuses, pre_charge, estimate_source, strip_accept_encoding)`,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var lines []string
			h, err := wasmhost.New(context.Background(), wasmhost.Options{
				Wasm:         loadModule(t),
				PluginConfig: []byte(tc.config),
				Workers:      2,
				LogSink: func(l wasmhost.LogLevel, msg string) {
					mu.Lock()
					defer mu.Unlock()
					lines = append(lines, "["+l.String()+"] "+msg)
				},
			})
			if err == nil {
				closeHost(t, h)
				t.Fatalf("wasmhost.New accepted %s", tc.config)
			}
			if h != nil {
				t.Errorf("wasmhost.New returned a host with its error")
			}
			want := "tokengate: invalid configuration: " + tc.expectedErr
			if !strings.Contains(err.Error(), want) {
				t.Errorf("got error %q\nwant it to contain %q", err, want)
			}
			mu.Lock()
			defer mu.Unlock()
			found := false
			for _, l := range lines {
				found = found || l == "[error] "+want
			}
			if !found {
				t.Errorf("the log has no line %q: %q", "[error] "+want, lines)
			}
		})
	}
}

// TestQuotaConfigLoads: the module starts with quota rules using every
// field (issue 31); the service's own fields (time_zone, billing_day,
// thresholds) are the service's to check.
func TestQuotaConfigLoads(t *testing.T) {
	cfg := `{"rules":[
	  {"name":"monthly","scope":"cluster","limit_keys":["header:x-api-key"],"algorithm":"quota","algorithm_config":{"limit":1000000,
	    "period":"month","time_zone":"Europe/Paris","billing_day":31,"thresholds":[0.8,0.95],"limit_source":"jwt:quota","max_limit":5000000,
	    "cost_source":"response_json:/usage/total_tokens","pre_charge":1000}},
	  {"name":"daily","scope":"cluster","limit_keys":["header:x-api-key"],"algorithm":"quota","algorithm_config":{"limit":100,"period":"day"}}],
	  "settings":{"rls":{"cluster":"rls"}}}`
	h, err := wasmhost.New(context.Background(), wasmhost.Options{Wasm: loadModule(t), PluginConfig: []byte(cfg), Workers: 1})
	if err != nil {
		t.Fatalf("wasmhost.New: %v", err)
	}
	closeHost(t, h)
}
