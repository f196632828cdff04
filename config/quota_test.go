package config_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
)

// quotaDoc is a configuration of one rule with rule's fields (without
// braces) and an RLS to decide it.
func quotaDoc(rule string) []byte {
	return []byte(`{"rules":[{"name":"q","limit_keys":["header:x-api-key"],` + rule + `}],"settings":{"rls":{"cluster":"rls"}}}`)
}

// TestParseQuota: a quota rule's fields land in Rule.Quota, its Limit is
// the limit over the period's nominal length, and the defaults hold.
func TestParseQuota(t *testing.T) {
	tests := []struct {
		name      string
		rule      string
		expected  config.Quota
		wantLimit bucket.Limit
		wantCost  config.CostKind
	}{
		{
			name:      "defaults",
			rule:      `"scope":"cluster","algorithm":"quota","algorithm_config":{"limit":1000,"period":"day"}`,
			expected:  config.Quota{Limit: 1000, Period: config.QuotaDay, TimeZone: "UTC"},
			wantLimit: bucket.Limit{Rate: 1000.0 / 86400, Burst: 1000},
		},
		{
			name: "month with everything",
			rule: `"scope":"cluster","mode":"exact","algorithm":"quota","algorithm_config":{"limit":1e6,"period":"month","time_zone":"Europe/Paris",` +
				`"billing_day":31,"thresholds":[0.5,0.8,0.95,0.99],"limit_source":"jwt:quota","max_limit":5e6,"cost_source":"response_json:/usage/total_tokens","pre_charge":100}`,
			expected: config.Quota{Limit: 1e6, Period: config.QuotaMonth, TimeZone: "Europe/Paris", BillingDay: 31,
				Thresholds: []float64{0.5, 0.8, 0.95, 0.99}, LimitSource: &config.Descriptor{Kind: config.DescJWT, Name: "quota"}, MaxLimit: 5e6},
			wantLimit: bucket.Limit{Rate: 1e6 / 2629746, Burst: 1e6, MaxDebt: 1e12},
			wantCost:  config.CostResponse,
		},
		{
			name:      "hour",
			rule:      `"scope":"cluster","algorithm":"quota","algorithm_config":{"limit":60,"period":"hour","limit_source":"header:X-Limit","max_limit":600}`,
			expected:  config.Quota{Limit: 60, Period: config.QuotaHour, TimeZone: "UTC", LimitSource: &config.Descriptor{Kind: config.DescHeader, Name: "x-limit"}, MaxLimit: 600},
			wantLimit: bucket.Limit{Rate: 60.0 / 3600, Burst: 60},
		},
		{
			name:      "week with a header cost",
			rule:      `"scope":"cluster","algorithm":"quota","algorithm_config":{"limit":7,"period":"week","time_zone":"America/New_York","cost_source":"header:x-cost"}`,
			expected:  config.Quota{Limit: 7, Period: config.QuotaWeek, TimeZone: "America/New_York"},
			wantLimit: bucket.Limit{Rate: 7.0 / 604800, Burst: 7},
			wantCost:  config.CostHeader,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse(quotaDoc(tc.rule))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			r := cfg.Rules()[0]
			q := r.Quota
			if q == nil {
				t.Fatal("Rule.Quota: got nil")
			}
			e := tc.expected
			if q.Limit != e.Limit || q.Period != e.Period || q.TimeZone != e.TimeZone || q.BillingDay != e.BillingDay ||
				!slices.Equal(q.Thresholds, e.Thresholds) || q.MaxLimit != e.MaxLimit {
				t.Errorf("quota: got %+v, want %+v", *q, e)
			}
			if (q.LimitSource == nil) != (e.LimitSource == nil) || q.LimitSource != nil && *q.LimitSource != *e.LimitSource {
				t.Errorf("limit_source: got %v, want %v", q.LimitSource, e.LimitSource)
			}
			if r.Limit != tc.wantLimit {
				t.Errorf("limit: got %+v, want %+v", r.Limit, tc.wantLimit)
			}
			if r.Cost.Kind != tc.wantCost {
				t.Errorf("cost kind: got %v, want %v", r.Cost.Kind, tc.wantCost)
			}
			if !r.Cluster || r.Lease != nil {
				t.Errorf("cluster %v lease %v: want an exact cluster rule", r.Cluster, r.Lease)
			}
		})
	}
	// Other algorithms have no quota.
	cfg, err := config.Parse(quotaDoc(`"scope":"cluster","algorithm_config":{"rps":1,"burst":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if q := cfg.Rules()[0].Quota; q != nil {
		t.Errorf("token bucket's Quota: got %+v, want nil", *q)
	}
}

// TestParseQuotaErrors: each malformed quota is refused with the field's
// path and why.
func TestParseQuotaErrors(t *testing.T) {
	const ok = `"scope":"cluster","algorithm":"quota","algorithm_config":`
	tests := []struct {
		name, rule, expectedErr string
	}{
		{"local scope", `"algorithm":"quota","algorithm_config":{"limit":1,"period":"day"}`,
			`rules[0].scope: "algorithm": "quota" needs "scope": "cluster": a period's consumption is counted by the rate-limit service for the whole fleet`},
		{"explicit local scope", `"scope":"local","algorithm":"quota","algorithm_config":{"limit":1,"period":"day"}`,
			`rules[0].scope: "algorithm": "quota" needs "scope": "cluster": a period's consumption is counted by the rate-limit service for the whole fleet`},
		{"lease", `"scope":"cluster","mode":"lease","algorithm":"quota","algorithm_config":{"limit":100,"period":"day"}`,
			`rules[0].mode: "algorithm": "quota" cannot be "lease": a lease hands a proxy tokens that refill over time, while a period's consumption must be counted where it is stored; use "mode": "exact" (docs/configuration.md)`},
		{"no config", `"scope":"cluster","algorithm":"quota"`, `rules[0].algorithm_config: is required`},
		{"no limit", ok + `{"period":"day"}`, `rules[0].algorithm_config.limit: is required`},
		{"zero limit", ok + `{"limit":0,"period":"day"}`, `rules[0].algorithm_config.limit: must be > 0, got 0`},
		{"limit string", ok + `{"limit":"5","period":"day"}`, `rules[0].algorithm_config.limit: must be a number, got a string`},
		{"huge limit", ok + `{"limit":1e13,"period":"day"}`, `rules[0].algorithm_config.limit: must be <= 1e+12, got 1e+13`},
		{"no period", ok + `{"limit":1}`, `rules[0].algorithm_config.period: is required`},
		{"bad period", ok + `{"limit":1,"period":"year"}`, `rules[0].algorithm_config.period: must be "hour", "day", "week" or "month", got "year"`},
		{"period number", ok + `{"limit":1,"period":86400}`, `rules[0].algorithm_config.period: must be "hour", "day", "week" or "month", got 86400`},
		{"empty zone", ok + `{"limit":1,"period":"day","time_zone":""}`,
			`rules[0].algorithm_config.time_zone: must be an IANA time zone name of 1 to 64 bytes, such as "Europe/Paris", got ""`},
		{"zone number", ok + `{"limit":1,"period":"day","time_zone":1}`,
			`rules[0].algorithm_config.time_zone: must be an IANA time zone name of 1 to 64 bytes, such as "Europe/Paris", got 1`},
		{"billing day on a day", ok + `{"limit":1,"period":"day","billing_day":3}`, `rules[0].algorithm_config.billing_day: applies only to "period": "month"`},
		{"billing day 0", ok + `{"limit":1,"period":"month","billing_day":0}`, `rules[0].algorithm_config.billing_day: must be an integer from 1 to 31, got 0`},
		{"billing day 32", ok + `{"limit":1,"period":"month","billing_day":32}`, `rules[0].algorithm_config.billing_day: must be an integer from 1 to 31, got 32`},
		{"billing day fraction", ok + `{"limit":1,"period":"month","billing_day":1.5}`, `rules[0].algorithm_config.billing_day: must be an integer from 1 to 31, got 1.5`},
		{"thresholds not array", ok + `{"limit":1,"period":"day","thresholds":0.8}`,
			`rules[0].algorithm_config.thresholds: must be an array of at most 4 numbers, got 0.8`},
		{"five thresholds", ok + `{"limit":1,"period":"day","thresholds":[0.1,0.2,0.3,0.4,0.5]}`,
			`rules[0].algorithm_config.thresholds: must be an array of at most 4 numbers, got [0.1,0.2,0.3,0.4,0.5]`},
		{"threshold 1", ok + `{"limit":1,"period":"day","thresholds":[0.5,1]}`,
			`rules[0].algorithm_config.thresholds[1]: must be below 1 and above the one before, got 1`},
		{"threshold 0", ok + `{"limit":1,"period":"day","thresholds":[0]}`, `rules[0].algorithm_config.thresholds[0]: must be > 0, got 0`},
		{"threshold above 1", ok + `{"limit":1,"period":"day","thresholds":[2]}`, `rules[0].algorithm_config.thresholds[0]: must be <= 1, got 2`},
		{"thresholds descending", ok + `{"limit":1,"period":"day","thresholds":[0.9,0.8]}`,
			`rules[0].algorithm_config.thresholds[1]: must be below 1 and above the one before, got 0.8`},
		{"long zone", ok + `{"limit":1,"period":"day","time_zone":"` + strings.Repeat("A", 65) + `"}`,
			`rules[0].algorithm_config.time_zone: must be an IANA time zone name of 1 to 64 bytes, such as "Europe/Paris", got "` + strings.Repeat("A", 63) + `…`},
		{"thresholds repeated", ok + `{"limit":1,"period":"day","thresholds":[0.8,0.8]}`,
			`rules[0].algorithm_config.thresholds[1]: must be below 1 and above the one before, got 0.8`},
		{"threshold string", ok + `{"limit":1,"period":"day","thresholds":["80%"]}`, `rules[0].algorithm_config.thresholds[0]: must be a number, got a string`},
		{"limit source query", ok + `{"limit":1,"period":"day","limit_source":"query:q","max_limit":5}`,
			`rules[0].algorithm_config.limit_source: must be "header:<name>" or "jwt:<claim>", got "query:q"`},
		{"limit source number", ok + `{"limit":1,"period":"day","limit_source":5,"max_limit":5}`,
			`rules[0].algorithm_config.limit_source: must be "header:<name>" or "jwt:<claim>", got 5`},
		{"limit source without max", ok + `{"limit":1,"period":"day","limit_source":"jwt:quota"}`,
			`rules[0].algorithm_config.max_limit: is required with limit_source, and only with it: it bounds the limit a request carries`},
		{"max without limit source", ok + `{"limit":1,"period":"day","max_limit":5}`, `rules[0].algorithm_config.max_limit: is required with limit_source, and only with it: it bounds the limit a request carries`},
		{"max limit zero", ok + `{"limit":1,"period":"day","limit_source":"jwt:quota","max_limit":0}`, `rules[0].algorithm_config.max_limit: must be > 0, got 0`},
		{"token bucket field", ok + `{"limit":1,"period":"day","burst":5}`,
			`rules[0].algorithm_config.burst: unknown field (allowed: limit, period, time_zone, billing_day, thresholds, limit_source, max_limit, cost_source, fixed_cost, default_cost, count_statuses, reset_on_statuses, pre_charge, estimate_source, strip_accept_encoding)`},
		{"cost over limit", ok + `{"limit":5,"period":"day","fixed_cost":6}`,
			`rules[0].algorithm_config.fixed_cost: must be <= limit (5) or no request can ever pass, got 6`},
		{"default cost over limit", ok + `{"limit":5,"period":"day","cost_source":"header:x-cost","default_cost":6}`,
			`rules[0].algorithm_config.default_cost: must be <= limit (5) or no request can ever pass without a valid cost, got 6`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse(quotaDoc(tc.rule))
			if err == nil {
				t.Fatalf("got no error, want %q", tc.expectedErr)
			}
			if err.Error() != tc.expectedErr {
				t.Errorf("got error\n  %s\nwant\n  %s", err, tc.expectedErr)
			}
		})
	}
}
