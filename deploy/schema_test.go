package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tokengate/tokengate/config"
)

const schemaFile = "config.schema.json"

// compileSchema compiles config.schema.json; the compiler checks it against
// the draft 2020-12 meta-schema first.
func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, schemaFile))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", schemaFile, err)
	}
	if s, _ := doc.(map[string]any)["$schema"].(string); s != "https://json-schema.org/draft/2020-12/schema" {
		t.Fatalf("%s: $schema %q, want draft 2020-12", schemaFile, s)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(schemaFile, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(schemaFile)
	if err != nil {
		t.Fatalf("%s: %v", schemaFile, err)
	}
	return sch
}

func validateSchema(sch *jsonschema.Schema, config []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(config))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

// exampleConfigs returns every configuration the repository ships, by name.
func exampleConfigs(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	envoy, err := checkEnvoyYAML(readEnvoyYAML(t))
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	out["envoy.yaml"] = envoy.config
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "istio", "wasmplugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, istio, err := parseWasmPlugin(doc)
	if err != nil {
		t.Fatalf("wasmplugin.yaml: %v", err)
	}
	out["deploy/istio/wasmplugin.yaml"] = istio
	rlsConfig, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "rls", "tokengate.json"))
	if err != nil {
		t.Fatal(err)
	}
	out["deploy/rls/tokengate.json"] = rlsConfig
	files, err := filepath.Glob(filepath.Join(repoRoot, "examples", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples/*.json")
	}
	// make cluster's configuration (tokengate-rls reads it; its envoy.yaml
	// inlines the same, TestFleetEnvoyYAML).
	files = append(files, filepath.Join(repoRoot, "examples", "cluster", "cluster.json"),
		filepath.Join(repoRoot, "examples", "ai-api", "ai-api.json")) // make cluster EXAMPLE=ai-api's
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[filepath.ToSlash(strings.TrimPrefix(f, repoRoot+string(filepath.Separator)))] = b
	}
	// The two complete examples of design note 01 (Fairvisor's token bucket)
	// are examples/global-rps.json and examples/tiered-fairvisor.json; they
	// are checked as files above. Make sure they stay there.
	for _, f := range []string{"examples/global-rps.json", "examples/tiered-fairvisor.json"} {
		if _, ok := out[f]; !ok {
			t.Errorf("%s is missing", f)
		}
	}
	return out
}

func TestSchemaAcceptsEveryExample(t *testing.T) {
	sch := compileSchema(t)
	configs := exampleConfigs(t)
	names := make([]string, 0, len(configs))
	for n := range configs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			if err := validateSchema(sch, configs[n]); err != nil {
				t.Errorf("schema rejects %s: %v", n, err)
			}
			if _, err := config.Parse(configs[n]); err != nil {
				t.Errorf("parser rejects %s: %v", n, err)
			}
		})
	}
}

// ok is a valid algorithm_config, for building invalid configurations
// around it.
const ok = `"algorithm_config": {"rps": 1, "burst": 1}`

func TestSchemaAndParserRejectInvalid(t *testing.T) {
	sch := compileSchema(t)
	tests := []struct {
		name        string
		config      string
		expectedErr string // the parser's message, or a part of it
	}{
		{"not an object", `[]`, "configuration must be a JSON object, got an array"},
		{"empty object", `{}`, "name: is required"},
		{"no algorithm_config", `{"name": "a"}`, "algorithm_config: is required"},
		{"unknown algorithm", `{"name": "a", "algorithm": "leaky_bucket", ` + ok + `}`, `algorithm: unknown algorithm "leaky_bucket"`},
		{"no rate", `{"name": "a", "algorithm_config": {"burst": 1}}`, "needs tokens_per_second (or its alias rps)"},
		{"rate and alias", `{"name": "a", "algorithm_config": {"rps": 1, "tokens_per_second": 1, "burst": 1}}`, "not both"},
		{"zero rate", `{"name": "a", "algorithm_config": {"rps": 0, "burst": 1}}`, "algorithm_config.rps: must be > 0, got 0"},
		{"negative burst", `{"name": "a", "algorithm_config": {"rps": 1, "burst": -1}}`, "algorithm_config.burst: must be > 0"},
		{"rate too large", `{"name": "a", "algorithm_config": {"rps": 2e9, "burst": 3e9}}`, "algorithm_config.rps: must be <= 1e+09"},
		{"rate as a string", `{"name": "a", "algorithm_config": {"rps": "5", "burst": 10}}`, "algorithm_config.rps: must be a number, got a string"},
		{"zero fixed_cost", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "fixed_cost": 0}}`, "fixed_cost: must be > 0"},
		{"bad cost_source", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "cost_source": "body:size"}}`, `cost_source: must be "fixed", "header:<name>", "query:<name>", "response_header:<name>"`},
		{"empty count_statuses", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "count_statuses": []}}`, "count_statuses: must not be empty"},
		{"status out of range", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "count_statuses": [99]}}`, "count_statuses[0]: must be a status"},
		{"pointer without slash", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "cost_source": "response_json:usage"}}`, "response_json needs JSON pointers"},
		{"negative pre_charge", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "cost_source": "response_json:/u", "pre_charge": -1}}`, "pre_charge: must be from 0 to 1, got -1"},
		{"max_debt 0 without pre_charge", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "cost_source": "response_json:/u", "max_debt": 0, "pre_charge": 0}}`, "max_debt: is no longer accepted"},
		{"max_debt 0 with pre_charge 0", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 1, "cost_source": "response_json:/u", "max_debt": 0, "pre_charge": 0}}`, "max_debt: is no longer accepted"},
		{"no max_in_flight", `{"name": "a", "algorithm": "concurrency", "algorithm_config": {"lease_seconds": 5}}`, "max_in_flight: is required"},
		{"zero max_in_flight", `{"name": "a", "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 0}}`, "max_in_flight: must be an integer from 1"},
		{"bucket fields on concurrency", `{"name": "a", "algorithm": "concurrency", "algorithm_config": {"max_in_flight": 1, "burst": 1}}`, "algorithm_config.burst: unknown field"},
		{"bad rule name", `{"name": "a b", ` + ok + `}`, `name: must be 1 to 64 characters from [A-Za-z0-9_-], got "a b"`},
		{"rule name too long", `{"name": "` + strings.Repeat("a", 65) + `", ` + ok + `}`, "must be 1 to 64 characters"},
		{"bad descriptor", `{"name": "a", "limit_keys": ["cookie:session"], ` + ok + `}`, `limit_keys[0]: invalid descriptor "cookie:session"`},
		{"too many limit keys", `{"name": "a", "limit_keys": ["path","method","host","ip:address","header:a","header:b","header:c","header:d","header:e"], ` + ok + `}`, "limit_keys: at most 8 descriptors"},
		{"unknown rule field", `{"name": "a", ` + ok + `, "window": 60}`, "window: unknown field"},
		{"match value not a string", `{"name": "a", ` + ok + `, "match": {"jwt:plan": 1}}`, "match.jwt:plan: expected value must be a string, got a number"},
		{"match on a bad descriptor", `{"name": "a", ` + ok + `, "match": {"plan": "pro"}}`, `match.plan: invalid descriptor "plan"`},
		{"bad on_store_error", `{"name": "a", ` + ok + `, "on_store_error": "retry"}`, `on_store_error: must be "allow" or "deny"`},
		{"settings in shape 1", `{"name": "a", ` + ok + `, "settings": {}}`, "settings: unknown field"},
		{"empty rule list", `{"rules": []}`, "rules: must not be empty"},
		{"rule list not an array", `{"rules": {"name": "a"}}`, "rules: must be an array, got an object"},
		{"cas_max_attempts zero", `{"rules": [{"name": "a", ` + ok + `}], "settings": {"cas_max_attempts": 0}}`, "settings.cas_max_attempts: must be an integer from 1 to 1000, got 0"},
		{"cas_max_attempts too large", `{"rules": [{"name": "a", ` + ok + `}], "settings": {"cas_max_attempts": 1001}}`, "got 1001"},
		{"negative max_keys", `{"name": "a", "limit_keys": ["path"], ` + ok + `, "max_keys": -1}`, "max_keys: must be an integer from 0 (unbounded) to 16777216, got -1"},
		{"xff_trusted_hops too large", `{"rules": [{"name": "a", ` + ok + `}], "settings": {"xff_trusted_hops": 11}}`, "settings.xff_trusted_hops: must be an integer from 0 to 10, got 11"},
		{"max_keys_per_rule as a string", `{"rules": [{"name": "a", ` + ok + `}], "settings": {"max_keys_per_rule": "64"}}`, "settings.max_keys_per_rule: must be an integer"},
		{"unknown setting", `{"rules": [{"name": "a", ` + ok + `}], "settings": {"timeout": 1}}`, "settings.timeout: unknown field"},
		{"bundle version 2", `{"bundle_version": 2, "policies": [{"id": "p", "spec": {"rules": [{"name": "a", ` + ok + `}]}}]}`, "bundle_version: must be 1, got 2"},
		{"bundle without policies", `{"bundle_version": 1}`, "policies: must be an array, got nothing"},
		{"policies without bundle_version", `{"policies": [{"id": "p", "spec": {"rules": [{"name": "a", ` + ok + `}]}}]}`, "bundle_version: is required"},
		{"policy without rules or fallback", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"mode": "enforce"}}]}`, "policies[0].spec: needs rules or a fallback_limit"},
		{"unknown mode", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"mode": "log", "rules": [{"name": "a", ` + ok + `}]}}]}`, `policies[0].spec.mode: must be "enforce" or "shadow", got "log"`},
		{"relative pathPrefix", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"selector": {"pathPrefix": "api/"}, "rules": [{"name": "a", ` + ok + `}]}}]}`, `selector.pathPrefix: must be a string starting with "/"`},
		{"bad method", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"selector": {"methods": ["GET1"]}, "rules": [{"name": "a", ` + ok + `}]}}]}`, "selector.methods[0]: invalid value"},
		{"host with port", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"selector": {"hosts": ["example.com:443"]}, "rules": [{"name": "a", ` + ok + `}]}}]}`, "selector.hosts[0]: invalid value"},
		{"fallback with match", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"fallback_limit": {` + ok + `, "match": {"path": "/"}}}}]}`, "fallback_limit.match: unknown field"},
		{"policy without id", `{"bundle_version": 1, "policies": [{"spec": {"rules": [{"name": "a", ` + ok + `}]}}]}`, "policies[0].id: is required"},
		{"fixed window without window_seconds", `{"name": "a", "algorithm": "fixed_window", "algorithm_config": {"limit": 5}}`, "algorithm_config.window_seconds: is required"},
		{"fixed window under a millisecond", `{"name": "a", "algorithm": "fixed_window", "algorithm_config": {"limit": 5, "window_seconds": 0.0005, "window_start": "hash"}}`, "algorithm_config.window_seconds: must be >= 0.001"},
		{"fixed window with a burst", `{"name": "a", "algorithm": "fixed_window", "algorithm_config": {"limit": 5, "window_seconds": 1, "burst": 5}}`, "algorithm_config.burst: unknown field"},
		{"unknown scope", `{"name": "a", "scope": "global", ` + ok + `}`, `scope: must be "local" or "cluster"`},
		{"wildcard inside a host", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"selector": {"hosts": ["a.*.com"]}, "rules": [{"name": "a", ` + ok + `}]}}]}`, "selector.hosts[0]: invalid value"},
		{"repeated limit key", `{"name": "a", "limit_keys": ["ip:address", "ip:address"], ` + ok + `}`, `limit_keys[1]: "ip:address" repeats limit_keys[0]`},
		{"xff cidr without a length", `{"rules": [{"name": "a", ` + ok + `}], "settings": {"xff_trusted_cidrs": ["10.0.0.1"]}}`, "settings.xff_trusted_cidrs[0]: must be an address prefix"},
		{"rejection status 200", `{"rules": [{"name": "a", ` + ok + `}], "settings": {"rejection_status": 200}}`, "settings.rejection_status"},
	}
	if len(tests) < 10 {
		t.Fatalf("only %d invalid samples", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := validateSchema(sch, []byte(tt.config)); err == nil {
				t.Errorf("schema accepts %s", tt.config)
			}
			_, err := config.Parse([]byte(tt.config))
			if err == nil {
				t.Fatalf("parser accepts %s", tt.config)
			}
			if !strings.Contains(err.Error(), tt.expectedErr) {
				t.Errorf("parser error %q does not contain %q", err, tt.expectedErr)
			}
		})
	}
}

// TestParserOnlyChecks lists what the schema cannot express: these
// configurations pass the schema and only the parser rejects them.
func TestParserOnlyChecks(t *testing.T) {
	sch := compileSchema(t)
	rule := func(name string) string { return `{"name": "` + name + `", ` + ok + `}` }
	tests := []struct {
		name        string
		config      string
		expectedErr string
	}{
		{"burst below the rate", `{"name": "a", "algorithm_config": {"rps": 100, "burst": 50}}`, "algorithm_config.burst: must be >= rps (100), got 50"},
		{"duplicate rule names", `{"rules": [` + rule("a") + `, ` + rule("a") + `]}`, `rules[1].name: duplicate rule name "a" (first used at rules[0].name)`},
		{"duplicate rule names across policies", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"rules": [` + rule("a") + `]}}, {"id": "q", "spec": {"rules": [` + rule("a") + `]}}]}`, `duplicate rule name "a"`},
		{"default fallback name taken", `{"bundle_version": 1, "policies": [{"id": "api", "spec": {"rules": [` + rule("api-fallback") + `], "fallback_limit": {` + ok + `}}}]}`, `policies[0].spec.fallback_limit: duplicate rule name "api-fallback"`},
		{"duplicate policy ids", `{"bundle_version": 1, "policies": [{"id": "p", "spec": {"rules": [` + rule("a") + `]}}, {"id": "p", "spec": {"rules": [` + rule("b") + `]}}]}`, `policies[1].id: duplicate policy id "p"`},
		{"duplicate key", `{"name": "a", "name": "b", ` + ok + `}`, "name: duplicate field"},
		{"bundle_version written as 1.0", `{"bundle_version": 1.0, "policies": [{"id": "p", "spec": {"rules": [` + rule("a") + `]}}]}`, "bundle_version: must be 1, got 1.0"},
		{"max_keys written as 1e3", `{"name": "a", "limit_keys": ["path"], ` + ok + `, "max_keys": 1e3}`, "max_keys: must be an integer from 0 (unbounded) to 16777216, got 1e3"},
		{"fixed_cost above burst", `{"name": "a", "algorithm_config": {"rps": 1, "burst": 2, "fixed_cost": 3}}`, "algorithm_config.fixed_cost: must be <= burst (2)"},
		{"burst below the default cost", `{"name": "a", "algorithm_config": {"rps": 0.5, "burst": 0.5}}`, "algorithm_config.burst: must be >= the cost of a request"},
		{"xff cidrs with hops", `{"rules": [` + rule("a") + `], "settings": {"xff_trusted_hops": 1, "xff_trusted_cidrs": ["10.0.0.0/8"]}}`, "cannot be combined with xff_trusted_hops"},
		{"cidr with a bad address", `{"rules": [` + rule("a") + `], "settings": {"xff_trusted_cidrs": ["1.2.3.400/8"]}}`, "settings.xff_trusted_cidrs[0]"},
		{"cas_max_attempts written as 16.0", `{"rules": [` + rule("a") + `], "settings": {"cas_max_attempts": 16.0}}`, "settings.cas_max_attempts: must be an integer from 1 to 1000, got 16.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := validateSchema(sch, []byte(tt.config)); err != nil {
				t.Errorf("schema rejects it (move the case to TestSchemaAndParserRejectInvalid): %v", err)
			}
			_, err := config.Parse([]byte(tt.config))
			if err == nil {
				t.Fatalf("parser accepts %s", tt.config)
			}
			if !strings.Contains(err.Error(), tt.expectedErr) {
				t.Errorf("parser error %q does not contain %q", err, tt.expectedErr)
			}
		})
	}
}
