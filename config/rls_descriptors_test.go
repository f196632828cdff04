package config_test

import (
	"testing"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/ratelimitheader"
)

func TestParseRLSDescriptors(t *testing.T) {
	const cfg = `{"rls_descriptors": [{"domain": "edge", "descriptors": [
	  {"key": "remote_address", "rule": {"name": "edge-ip", "algorithm_config": {"tokens_per_second": 10, "burst": 20}}},
	  {"key": "header_match", "value": "post", "descriptors": [
	    {"key": "remote_address", "shadow": true, "rule": {"name": "edge-ip-post", "algorithm_config": {"rps": 1, "burst": 5}}}]}
	]}]}`
	c, err := config.Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules()) != 0 || len(c.Policies) != 0 {
		t.Fatalf("descriptor rules reached the filter: %d rules, %d policies", len(c.Rules()), len(c.Policies))
	}
	if len(c.RLSDescriptors) != 1 || c.RLSDescriptors[0].Domain != "edge" {
		t.Fatalf("domains: got %+v", c.RLSDescriptors)
	}
	ds := c.RLSDescriptors[0].Descriptors
	if len(ds) != 2 || ds[0].Key != "remote_address" || ds[0].Value != "" || ds[0].Rule.Name != "edge-ip" || ds[0].Rule.Shadow {
		t.Fatalf("first node: got %+v", ds[0])
	}
	if ds[0].Rule.Limit.Rate != 10 || ds[0].Rule.Limit.Burst != 20 || !ds[0].Rule.Cluster {
		t.Fatalf("first rule: got %+v", ds[0].Rule)
	}
	inner := ds[1]
	if inner.Rule != nil || inner.Value != "post" || len(inner.Descriptors) != 1 || !inner.Descriptors[0].Rule.Shadow {
		t.Fatalf("second node: got %+v", inner)
	}
	plan := ratelimitheader.NewPlan(ds[0].Rule.Name, ds[0].Rule.Limit)
	if limit, policy, quoted := plan.Limit, plan.Policy, plan.Quoted; limit != "20" || policy != `"edge-ip";q=20;w=2` || quoted != `"edge-ip"` {
		t.Fatalf("HeaderPlan: got %q %q %q", limit, policy, quoted)
	}
}

func TestParseRLSDescriptorsErrors(t *testing.T) {
	const rule = `"algorithm_config": {"rps": 1, "burst": 1}`
	wrap := func(nodes string) string {
		return `{"rls_descriptors": [{"domain": "d", "descriptors": ` + nodes + `}]}`
	}
	tests := []struct{ name, config, expectedErr string }{
		{"not an array", `{"rls_descriptors": {}}`, `rls_descriptors: must be an array of domains, got an object`},
		{"empty", `{"rls_descriptors": []}`, `rls_descriptors: must not be empty`},
		{"no domain", `{"rls_descriptors": [{"descriptors": []}]}`, `rls_descriptors[0].domain: is required`},
		{"duplicate domain", `{"rls_descriptors": [{"domain": "d", "descriptors": [{"key": "k", "rule": {"name": "a", ` + rule + `}}]}, {"domain": "d", "descriptors": []}]}`,
			`rls_descriptors[1].domain: duplicate domain "d"`},
		{"unknown field", wrap(`[{"key": "k", "limit": 1}]`), `rls_descriptors[0].descriptors[0].limit: unknown field (allowed: key, value, rule, shadow, descriptors)`},
		{"no rule or children", wrap(`[{"key": "k"}]`), `rls_descriptors[0].descriptors[0]: needs a rule or descriptors`},
		{"repeated key and value", wrap(`[{"key": "k", "rule": {"name": "a", ` + rule + `}}, {"key": "k", "rule": {"name": "b", ` + rule + `}}]`),
			`rls_descriptors[0].descriptors[1]: repeats the key and value of rls_descriptors[0].descriptors[0]`},
		{"limit keys refused", wrap(`[{"key": "k", "rule": {"name": "a", "limit_keys": ["ip"], ` + rule + `}}]`),
			`rls_descriptors[0].descriptors[0].rule.limit_keys: unknown field (allowed: name, algorithm, algorithm_config)`},
		{"fixed window refused", wrap(`[{"key": "k", "rule": {"name": "a", "algorithm": "fixed_window", ` + rule + `}}]`),
			`rls_descriptors[0].descriptors[0].rule.algorithm: must be "token_bucket" (the service decides token buckets only), got "fixed_window"`},
		{"cost source refused", wrap(`[{"key": "k", "rule": {"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "cost_source": "header:x"}}}]`),
			`rls_descriptors[0].descriptors[0].rule.algorithm_config: cost comes from the descriptor's hits_addend: no cost_source or fixed_cost`},
		{"bad limit", wrap(`[{"key": "k", "rule": {"name": "a", "algorithm_config": {"rps": 2, "burst": 1}}}]`),
			`rls_descriptors[0].descriptors[0].rule.algorithm_config.burst: must be >= rps (2), got 1`},
		{"delay refused", wrap(`[{"key": "k", "rule": {"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "max_reserved": 2}}}]`),
			`rls_descriptors[0].descriptors[0].rule.algorithm_config.max_reserved: the service answers at once: delayed admission is the filter's alone`},
		{"shadow without rule", wrap(`[{"key": "k", "shadow": true, "descriptors": [{"key": "j", "rule": {"name": "a", ` + rule + `}}]}]`),
			`rls_descriptors[0].descriptors[0].shadow: applies to a rule; this descriptor has none`},
		{"name shared with a filter rule", `{"rules": [{"name": "a", ` + rule + `}], "rls_descriptors": [{"domain": "d", "descriptors": [{"key": "k", "rule": {"name": "a", ` + rule + `}}]}]}`,
			`rls_descriptors[0].descriptors[0].rule.name: duplicate rule name "a" (first used at rules[0].name)`},
		{"empty value", wrap(`[{"key": "k", "value": "", "rule": {"name": "a", ` + rule + `}}]`),
			`rls_descriptors[0].descriptors[0].value: must be a string of 1 to 1024 bytes (omit it to match any value), got ""`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tc.config))
			if err == nil || err.Error() != tc.expectedErr {
				t.Errorf("got error\n  %v\nwant\n  %s", err, tc.expectedErr)
			}
		})
	}
}
