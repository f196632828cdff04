package config

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

func TestParseConfigShapes(t *testing.T) {
	tests := []struct {
		name         string
		config       string
		wantPolicies []string // "id:mode:rule,rule[+fallback]"
		wantLimit    bucket.Limit
	}{
		{
			name:         "one rule",
			config:       `{"name":"global-rps","limit_keys":["ip:address"],"algorithm":"token_bucket","algorithm_config":{"rps":5,"burst":10}}`,
			wantPolicies: []string{"default:enforce:global-rps"},
			wantLimit:    bucket.Limit{Rate: 5, Burst: 10},
		},
		{
			name: "rules",
			config: `{"rules":[
				{"name":"enterprise","limit_keys":["header:x-api-key"],"algorithm":"token_bucket","algorithm_config":{"rps":1000,"burst":2000},"match":{"jwt:plan":"enterprise"}},
				{"name":"free","limit_keys":["header:x-api-key"],"algorithm":"token_bucket","algorithm_config":{"tokens_per_second":10,"burst":20}}]}`,
			wantPolicies: []string{"default:enforce:enterprise,free"},
			wantLimit:    bucket.Limit{Rate: 1000, Burst: 2000},
		},
		{
			name: "bundle",
			config: `{"bundle_version":1,"policies":[
				{"id":"api","spec":{"selector":{"pathPrefix":"/api/","methods":["GET","post"],"hosts":["Example.com"]},"mode":"enforce",
				 "rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm":"token_bucket","algorithm_config":{"rps":0.5,"burst":2}}],
				 "fallback_limit":{"algorithm":"token_bucket","algorithm_config":{"rps":1,"burst":1}}}},
				{"id":"watch","spec":{"mode":"shadow","rules":[{"name":"watch-path","limit_keys":["path"],"algorithm_config":{"rps":1,"burst":1}}]}}],
				"settings":{"cas_max_attempts":4}}`,
			wantPolicies: []string{"api:enforce:per-ip+api-fallback", "watch:shadow:watch-path"},
			wantLimit:    bucket.Limit{Rate: 0.5, Burst: 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.config))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			var got []string
			for _, p := range cfg.Policies {
				mode := "enforce"
				if p.Shadow {
					mode = "shadow"
				}
				s := p.ID + ":" + mode + ":"
				for i, r := range p.Rules {
					if i > 0 {
						s += ","
					}
					s += r.Name
				}
				if p.Fallback != nil {
					s += "+" + p.Fallback.Name
				}
				got = append(got, s)
			}
			if len(got) != len(tc.wantPolicies) {
				t.Fatalf("policies: got %q, want %q", got, tc.wantPolicies)
			}
			for i := range got {
				if got[i] != tc.wantPolicies[i] {
					t.Errorf("policy %d: got %q, want %q", i, got[i], tc.wantPolicies[i])
				}
			}
			if l := cfg.Policies[0].Rules[0].Limit; l != tc.wantLimit {
				t.Errorf("first rule limit: got %+v, want %+v", l, tc.wantLimit)
			}
		})
	}
}

func TestParseConfigDetails(t *testing.T) {
	cfg, err := Parse([]byte(`{"bundle_version":1,"policies":[{"id":"api","spec":{
		"selector":{"pathPrefix":"/api/","methods":["get"],"hosts":["API.example.com","*.example.org"]},
		"rules":[{"name":"r","limit_keys":["ip:address","header:X-Api-Key","query:tenant","jwt:sub","path","method","host"],
		  "algorithm_config":{"rps":1,"burst":3,"cost_source":"header:X-Weight","default_cost":2,"fixed_cost":1.5},
		  "match":{"jwt:plan":"pro"},"on_store_error":"deny"}]}}],"settings":{"cas_max_attempts":3}}`))
	if err != nil {
		t.Fatal(err)
	}
	pol := cfg.Policies[0]
	if got, want := pol.Selector.Methods[0], "GET"; got != want {
		t.Errorf("method: got %q, want %q", got, want)
	}
	if got, want := pol.Selector.Hosts[0], "api.example.com"; got != want {
		t.Errorf("host: got %q, want %q", got, want)
	}
	r := pol.Rules[0]
	var keys []string
	for _, k := range r.Keys {
		keys = append(keys, k.String())
	}
	want := []string{"ip:address", "header:x-api-key", "query:tenant", "jwt:sub", "path", "method", "host"}
	for i := range want {
		if keys[i] != want[i] {
			t.Errorf("key %d: got %q, want %q", i, keys[i], want[i])
		}
	}
	if r.Cost != (CostSource{Kind: CostHeader, Name: "x-weight", Fixed: 1.5, Default: 2}) {
		t.Errorf("cost: got %+v", r.Cost)
	}
	if len(r.Match) != 1 || r.Match[0].Descriptor.String() != "jwt:plan" || r.Match[0].Value != "pro" {
		t.Errorf("match: got %+v", r.Match)
	}
	if !r.DenyOnStoreError {
		t.Error("on_store_error deny not parsed")
	}
	if cfg.Settings.MaxAttempts != 3 {
		t.Errorf("cas_max_attempts: got %d, want 3", cfg.Settings.MaxAttempts)
	}
	if r.MaxKeys != DefaultMaxKeys {
		t.Errorf("max_keys default: got %d, want %d", r.MaxKeys, DefaultMaxKeys)
	}
}

func TestMaxKeys(t *testing.T) {
	cfg, err := Parse([]byte(`{"rules":[
		{"name":"a","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":1}},
		{"name":"b","limit_keys":["ip:address"],"max_keys":0,"algorithm_config":{"rps":1,"burst":1}},
		{"name":"c","limit_keys":["ip:address"],"max_keys":10,"algorithm_config":{"rps":1,"burst":1}},
		{"name":"global","max_keys":10,"algorithm_config":{"rps":1,"burst":1}}],
		"settings":{"max_keys_per_rule":1000}}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{1000, 0, 10, 0} {
		if got := cfg.Rules()[i].MaxKeys; got != want {
			t.Errorf("rule %s: MaxKeys got %d, want %d", cfg.Rules()[i].Name, got, want)
		}
	}
}

func TestParseConfigErrors(t *testing.T) {
	const rule = `"algorithm":"token_bucket","algorithm_config":{"rps":5,"burst":10}`
	tests := []struct {
		name, config, expectedErr string
	}{
		{"empty", ``, `configuration is empty`},
		{"blank", " \n\t", `configuration is empty`},
		{"not json", `{"name":`, `configuration is not valid JSON: line 1, column 9: unexpected end of input`},
		{"byte order mark", "\xef\xbb\xbf{}", `configuration starts with a UTF-8 byte order mark (bytes EF BB BF), which JSON does not allow: save the file without it`},
		// Issue 11: rules that could never admit a request.
		{"fixed_cost over burst", `{"name":"a","algorithm_config":{"rps":1,"burst":5,"fixed_cost":6}}`,
			`algorithm_config.fixed_cost: must be <= burst (5) or no request can ever pass, got 6`},
		{"default_cost over burst", `{"name":"a","algorithm_config":{"rps":1,"burst":5,"cost_source":"header:x-cost","default_cost":6}}`,
			`algorithm_config.default_cost: must be <= burst (5) or no request can ever pass without a valid cost, got 6`},
		{"burst under the default cost", `{"name":"a","algorithm_config":{"rps":0.5,"burst":0.5}}`,
			`algorithm_config.burst: must be >= the cost of a request (1, the default fixed_cost) or no request can ever pass, got 0.5`},
		{"burst under the default default_cost", `{"name":"a","algorithm_config":{"rps":0.5,"burst":0.5,"cost_source":"query:c"}}`,
			`algorithm_config.burst: must be >= default_cost (1, the default), the cost of a request without a valid cost, or no request can ever pass without one, got 0.5`},
		{"wildcard inside a host", `{"bundle_version":1,"policies":[{"id":"p","spec":{"selector":{"hosts":["a.*.com"]},"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":5}}]}}]}`,
			`policies[0].spec.selector.hosts[0]: invalid value "a.*.com"`},
		{"bare wildcard host", `{"bundle_version":1,"policies":[{"id":"p","spec":{"selector":{"hosts":["*"]},"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":5}}]}}]}`,
			`policies[0].spec.selector.hosts[0]: invalid value "*"`},
		{"duplicate limit key", `{"name":"a","limit_keys":["ip:address","header:x-k","ip:address"],"algorithm_config":{"rps":1,"burst":5}}`,
			`limit_keys[2]: "ip:address" repeats limit_keys[0]; a descriptor names a bucket once`},
		{"not an object", `[1,2]`, `configuration must be a JSON object, got an array`},
		{"no name", `{` + rule + `}`, `name: is required`},
		{"name type", `{"name":5,` + rule + `}`, `name: must be a string, got a number`},
		{"bad name", `{"name":"a b",` + rule + `}`, `name: must be 1 to 64 characters from [A-Za-z0-9_-], got "a b"`},
		{"unknown algorithm", `{"name":"a","algorithm":"leaky_bucket","algorithm_config":{"rps":5,"burst":10}}`,
			`algorithm: unknown algorithm "leaky_bucket", want "token_bucket", "fixed_window", "concurrency" or "quota"`},
		{"fixed window without limit", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"window_seconds":10}}`,
			`algorithm_config.limit: is required`},
		{"fixed window with token bucket fields", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"limit":1,"window_seconds":10,"rps":1}}`,
			`algorithm_config.rps: unknown field (allowed: limit, window_seconds, capacity, window_start, cost_source, fixed_cost, default_cost, count_statuses, reset_on_statuses)`},
		{"fixed window bad start", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"limit":1,"window_seconds":10,"window_start":"noon"}}`,
			`algorithm_config.window_start: must be "aligned", "hash" or "random", got "noon"`},
		// Issue 22 item 9: a capacity below the limit is refused, so this
		// case's capacity is now above its limit (it was limit 5, capacity 2).
		{"fixed window cost over capacity", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"limit":2,"window_seconds":10,"capacity":4,"fixed_cost":5}}`,
			`algorithm_config.fixed_cost: must be <= capacity (4) or no request can ever pass, got 5`},
		// Issue 22 items 9 and 10: configurations wrongly accepted, and
		// messages that blamed the wrong field or ended early.
		{"fixed window capacity below limit", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"limit":10,"window_seconds":10,"capacity":5}}`,
			`algorithm_config.capacity: must be >= limit (10), the tokens each window adds: capacity is what unused tokens may roll over up to, and below the limit a window would admit only capacity, got 5`},
		{"fixed window limit under the default cost", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"limit":0.5,"window_seconds":10}}`,
			`algorithm_config.limit: must be >= the cost of a request (1, the default fixed_cost) or no request can ever pass, got 0.5`},
		{"fixed window capacity under the default cost", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"limit":0.5,"window_seconds":10,"capacity":0.7}}`,
			`algorithm_config.capacity: must be >= the cost of a request (1, the default fixed_cost) or no request can ever pass, got 0.7`},
		{"shaping reservation capped below a request", `{"name":"a","algorithm_config":{"rps":1000,"burst":1,"max_reserved":5,"max_delay_ms":0.0001}}`,
			`algorithm_config.max_delay_ms: caps the reservation at 0.0001 tokens (max_delay_ms / 1000 × rps); with burst (1) below rps (1000) the rule must reserve at least the cost of one request (1), so max_delay_ms must be >= 1, got 0.0001`},
		{"shaping reservation below a request", `{"name":"a","algorithm_config":{"rps":1000,"burst":1,"max_reserved":0.5}}`,
			`algorithm_config.max_reserved: with burst (1) below rps (1000) the rule must reserve at least the cost of one request (1), got 0.5`},
		{"nested status on several lines", "{\"name\":\"a\",\"algorithm_config\":{\"rps\":1,\"burst\":5,\"count_statuses\":[\n  [\n    401\n  ]\n]}}",
			`algorithm_config.count_statuses[0]: must be a status (401 or "401") or a class ("4xx"), got [401]`},
		{"trailing + in JSON pointers", `{"name":"a","algorithm_config":{"rps":1,"burst":5,"cost_source":"response_json:/usage/total_tokens+"}}`,
			`algorithm_config.cost_source: response_json needs JSON pointers such as "/usage/total_tokens" (1 to 8 tokens of at most 64 bytes, joined by '+'), got an empty pointer (pointer 2 of "/usage/total_tokens+")`},
		{"single rule in cluster scope", `{"name":"a","scope":"cluster","algorithm_config":{"rps":1,"burst":5}}`,
			`scope: "cluster" needs settings.rls (the rate-limit service to ask), and a file of one bare rule has no settings: write it as {"rules": [<the rule>], "settings": {"rls": {"cluster": "<Envoy cluster of the service>"}}}`},
		{"store error deny on a cluster rule", `{"rules":[{"name":"a","scope":"cluster","on_store_error":"deny",` + rule + `}],"settings":{"rls":{"cluster":"rls","on_error":"deny"}}}`,
			`rule "a": "on_store_error": "deny" on a "scope": "cluster" rule applies only with settings.rls.on_error "local" (a shared-data failure while the rule is decided locally); a failure of the rate-limit service is settings.rls.on_error's: set it to "deny" (docs/failures.md)`},
		{"store error deny on a lease rule", `{"rules":[{"name":"a","scope":"cluster","mode":"lease","on_store_error":"deny",` + rule + `}],"settings":{"rls":{"cluster":"rls"}}}`,
			`rule "a": "on_store_error": "deny" on a "scope": "cluster" rule applies only with settings.rls.on_error "local" (a shared-data failure while the rule is decided locally); a failure of the rate-limit service is settings.rls.on_error's: set it to "deny" (docs/failures.md)`},
		{"fixed window in cluster scope", `{"rules":[{"name":"a","scope":"cluster","algorithm":"fixed_window","algorithm_config":{"limit":5,"window_seconds":10}}],"settings":{"rls":{"cluster":"rls"}}}`,
			`rule "a": "scope": "cluster" decides token buckets only, not fixed windows`},
		{"no algorithm_config", `{"name":"a","algorithm":"token_bucket"}`, `algorithm_config: is required`},
		{"no rate", `{"name":"a","algorithm_config":{"burst":10}}`, `algorithm_config: needs tokens_per_second (or its alias rps)`},
		{"both rates", `{"name":"a","algorithm_config":{"rps":1,"tokens_per_second":1,"burst":10}}`,
			`algorithm_config: set tokens_per_second or its alias rps, not both`},
		{"zero rate", `{"name":"a","algorithm_config":{"rps":0,"burst":10}}`, `algorithm_config.rps: must be > 0, got 0`},
		{"negative rate", `{"name":"a","algorithm_config":{"tokens_per_second":-1,"burst":10}}`,
			`algorithm_config.tokens_per_second: must be > 0, got -1`},
		{"infinite rate", `{"name":"a","algorithm_config":{"rps":1e999,"burst":10}}`,
			`algorithm_config.rps: must be a finite number, got 1e999`},
		{"string rate", `{"name":"a","algorithm_config":{"rps":"5","burst":10}}`,
			`algorithm_config.rps: must be a number, got a string`},
		{"no burst", `{"name":"a","algorithm_config":{"rps":5}}`, `algorithm_config.burst: is required`},
		{"burst below rate", `{"name":"a","algorithm_config":{"tokens_per_second":100,"burst":50}}`,
			`algorithm_config.burst: must be >= tokens_per_second (100), got 50`},
		{"burst too large", `{"name":"a","algorithm_config":{"rps":1,"burst":1e13}}`,
			`algorithm_config.burst: must be <= 1e+12, got 1e+13`},
		{"refill too slow", `{"name":"a","algorithm_config":{"rps":1e-9,"burst":1e12}}`,
			`algorithm_config.rps: must be >= burst/1e9 (1000) so that an empty bucket refills within 1e9 seconds, got 1e-09`},
		{"denormal rate", `{"name":"a","algorithm_config":{"tokens_per_second":1e-320,"burst":1}}`,
			`algorithm_config.tokens_per_second: must be >= burst/1e9 (1e-09) so that an empty bucket refills within 1e9 seconds, got 1e-320`},
		{"zero fixed cost", `{"name":"a","algorithm_config":{"rps":1,"burst":1,"fixed_cost":0}}`,
			`algorithm_config.fixed_cost: must be > 0, got 0`},
		{"negative default cost", `{"name":"a","algorithm_config":{"rps":1,"burst":1,"default_cost":-2}}`,
			`algorithm_config.default_cost: must be > 0, got -2`},
		{"bad cost source", `{"name":"a","algorithm_config":{"rps":1,"burst":1,"cost_source":"body:x"}}`,
			`algorithm_config.cost_source: must be "fixed", "header:<name>", "query:<name>", "response_header:<name>", "response_json:<JSON pointer>" or "response_sse:<JSON pointer>", got "body:x"`},
		{"cost source bad name", `{"name":"a","algorithm_config":{"rps":1,"burst":1,"cost_source":"header:a b"}}`,
			`algorithm_config.cost_source: must be "fixed", "header:<name>", "query:<name>", "response_header:<name>", "response_json:<JSON pointer>" or "response_sse:<JSON pointer>", got "header:a b"`},
		{"unknown algorithm_config field", `{"name":"a","algorithm_config":{"rps":1,"burst":1,"burts":2}}`,
			`algorithm_config.burts: unknown field (allowed: tokens_per_second, rps, burst, cost_source, fixed_cost, default_cost, count_statuses, reset_on_statuses, pre_charge, max_debt, estimate_source, strip_accept_encoding, max_reserved, max_delay_ms, max_pending, refund_on_cancel)`},
		{"unknown rule field", `{"name":"a","limits":[],` + rule + `}`,
			`limits: unknown field (allowed: name, limit_keys, algorithm, algorithm_config, on_store_error, on_missing_key, max_keys, scope, mode, lease_max, lease_ttl_ms, match)`},
		{"bad descriptor", `{"name":"a","limit_keys":["cookie:x"],` + rule + `}`,
			`limit_keys[0]: invalid descriptor "cookie:x" (want ip:address, header:<name>, query:<name>, jwt:<claim>, path, method or host; names match [A-Za-z0-9_-]+)`},
		{"descriptor bad name", `{"name":"a","limit_keys":["header:x.y"],` + rule + `}`,
			`limit_keys[0]: invalid descriptor "header:x.y" (want ip:address, header:<name>, query:<name>, jwt:<claim>, path, method or host; names match [A-Za-z0-9_-]+)`},
		{"descriptor not string", `{"name":"a","limit_keys":[1],` + rule + `}`, `limit_keys[0]: must be a string, got a number`},
		{"limit_keys not array", `{"name":"a","limit_keys":"ip:address",` + rule + `}`,
			`limit_keys: must be an array of descriptors, got a string`},
		{"match not object", `{"name":"a","match":["x"],` + rule + `}`, `match: must be an object of descriptor → value, got an array`},
		{"match bad descriptor", `{"name":"a","match":{"jwt:":"x"},` + rule + `}`,
			`match.jwt:: invalid descriptor "jwt:" (want ip:address, header:<name>, query:<name>, jwt:<claim>, path, method or host; names match [A-Za-z0-9_-]+)`},
		{"match value not string", `{"name":"a","match":{"jwt:plan":true},` + rule + `}`,
			`match.jwt:plan: expected value must be a string, got a boolean`},
		{"bad on_store_error", `{"name":"a","on_store_error":"maybe",` + rule + `}`,
			`on_store_error: must be "allow" or "deny", got "maybe"`},
		{"duplicate rule", `{"rules":[{"name":"a",` + rule + `},{"name":"a",` + rule + `}]}`,
			`rules[1].name: duplicate rule name "a" (first used at rules[0].name)`},
		{"rules empty", `{"rules":[]}`, `rules: must not be empty`},
		{"metric name clash", `{"rules":[{"name":"per-ip",` + rule + `},{"name":"per_ip",` + rule + `}]}`,
			`rules[1].name: rule name "per_ip" has the same metric name as "per-ip" (at rules[0].name): Prometheus turns '-' into '_'`},
		{"rules not array", `{"rules":{}}`, `rules: must be an array, got an object`},
		{"rules unknown top field", `{"rules":[{"name":"a",` + rule + `}],"extra":1}`,
			`extra: unknown field (allowed: rules, settings, rls_descriptors)`},
		{"nested rule error path", `{"rules":[{"name":"a",` + rule + `},{"name":"b","algorithm_config":{"rps":100,"burst":50}}]}`,
			`rules[1].algorithm_config.burst: must be >= rps (100), got 50`},
		{"bad settings", `{"rules":[{"name":"a",` + rule + `}],"settings":{"cas_max_attempts":0}}`,
			`settings.cas_max_attempts: must be an integer from 1 to 1000, got 0`},
		{"unknown setting", `{"rules":[{"name":"a",` + rule + `}],"settings":{"x":1}}`,
			`settings.x: unknown field (allowed: cas_max_attempts, xff_trusted_hops, xff_trusted_cidrs, jwt_payload_in_metadata, rls, max_keys_per_rule, ipv6_prefix, ratelimit_headers, rule_headers, rejection_status, rejection_body, rejection_content_type)`},
		{"bad max_keys", `{"name":"a","max_keys":-1,` + rule + `}`,
			`max_keys: must be an integer from 0 (unbounded) to 16777216, got -1`},
		{"fractional max_keys", `{"rules":[{"name":"a",` + rule + `}],"settings":{"max_keys_per_rule":1.5}}`,
			`settings.max_keys_per_rule: must be an integer from 0 (unbounded) to 16777216, got 1.5`},
		{"bad xff hops", `{"rules":[{"name":"a",` + rule + `}],"settings":{"xff_trusted_hops":-1}}`,
			`settings.xff_trusted_hops: must be an integer from 0 to 10, got -1`},
		{"xff cidr not a prefix", `{"rules":[{"name":"a",` + rule + `}],"settings":{"xff_trusted_cidrs":["10.0.0.1"]}}`,
			`settings.xff_trusted_cidrs[0]: must be an address prefix such as "10.0.0.0/8" or "2001:db8::/32", got "10.0.0.1"`},
		{"xff cidrs empty", `{"rules":[{"name":"a",` + rule + `}],"settings":{"xff_trusted_cidrs":[]}}`,
			`settings.xff_trusted_cidrs: must hold 1 to 64 CIDRs, got 0`},
		{"xff cidrs and hops", `{"rules":[{"name":"a",` + rule + `}],"settings":{"xff_trusted_hops":1,"xff_trusted_cidrs":["10.0.0.0/8"]}}`,
			`settings.xff_trusted_cidrs: cannot be combined with xff_trusted_hops: choose one way to trust x-forwarded-for`},
		{"ipv6 prefix zero", `{"rules":[{"name":"a",` + rule + `}],"settings":{"ipv6_prefix":0}}`,
			`settings.ipv6_prefix: must be an integer from 1 to 128 (bits of an IPv6 client address that key it), got 0`},
		{"ipv6 prefix too long", `{"rules":[{"name":"a",` + rule + `}],"settings":{"ipv6_prefix":129}}`,
			`settings.ipv6_prefix: must be an integer from 1 to 128 (bits of an IPv6 client address that key it), got 129`},
		{"on_missing_key", `{"name":"a","limit_keys":["header:x"],"on_missing_key":"allow",` + rule + `}`,
			`on_missing_key: must be "skip", "shared" or "deny", got "allow"`},
		{"bundle version", `{"bundle_version":2,"policies":[]}`, `bundle_version: must be 1, got 2`},
		{"bundle without version", `{"policies":[]}`, `bundle_version: is required in a policy bundle`},
		{"bundle no policies", `{"bundle_version":1,"policies":[]}`, `policies: must not be empty`},
		{"policy without rules", `{"bundle_version":1,"policies":[{"id":"p","spec":{}}]}`, `policies[0].spec: needs rules or a fallback_limit`},
		{"policy bad mode", `{"bundle_version":1,"policies":[{"id":"p","spec":{"mode":"audit","rules":[{"name":"a",` + rule + `}]}}]}`,
			`policies[0].spec.mode: must be "enforce" or "shadow", got "audit"`},
		{"duplicate policy", `{"bundle_version":1,"policies":[{"id":"p","spec":{"rules":[{"name":"a",` + rule + `}]}},{"id":"p","spec":{"rules":[{"name":"b",` + rule + `}]}}]}`,
			`policies[1].id: duplicate policy id "p"`},
		{"policy burst", `{"bundle_version":1,"policies":[{"id":"p","spec":{"rules":[{"name":"a",` + rule + `},{"name":"b","algorithm":"token_bucket","algorithm_config":{"tokens_per_second":100,"burst":50}}]}}]}`,
			`policies[0].spec.rules[1].algorithm_config.burst: must be >= tokens_per_second (100), got 50`},
		{"selector path", `{"bundle_version":1,"policies":[{"id":"p","spec":{"selector":{"pathPrefix":"api"},"rules":[{"name":"a",` + rule + `}]}}]}`,
			`policies[0].spec.selector.pathPrefix: must be a string starting with "/", got "api"`},
		{"selector unknown", `{"bundle_version":1,"policies":[{"id":"p","spec":{"selector":{"path_prefix":"/"},"rules":[{"name":"a",` + rule + `}]}}]}`,
			`policies[0].spec.selector.path_prefix: unknown field (allowed: pathPrefix, methods, hosts)`},
		{"selector method", `{"bundle_version":1,"policies":[{"id":"p","spec":{"selector":{"methods":["GET",1]},"rules":[{"name":"a",` + rule + `}]}}]}`,
			`policies[0].spec.selector.methods[1]: invalid value 1`},
		{"fallback with match", `{"bundle_version":1,"policies":[{"id":"p","spec":{"fallback_limit":{"match":{},` + rule + `}}}]}`,
			`policies[0].spec.fallback_limit.match: unknown field (allowed: name, limit_keys, algorithm, algorithm_config, on_store_error, on_missing_key, max_keys, scope, mode, lease_max, lease_ttl_ms)`},
		{"fallback name clash", `{"bundle_version":1,"policies":[{"id":"p","spec":{"rules":[{"name":"p-fallback",` + rule + `}],"fallback_limit":{` + rule + `}}}]}`,
			`policies[0].spec.fallback_limit: duplicate rule name "p-fallback" (first used at policies[0].spec.rules[0].name)`},
		{"duplicate field", `{"name":"a","name":"b",` + rule + `}`, `name: duplicate field`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.config))
			if err == nil {
				t.Fatalf("got no error, want %q", tc.expectedErr)
			}
			if err.Error() != tc.expectedErr {
				t.Errorf("got error\n  %s\nwant\n  %s", err, tc.expectedErr)
			}
		})
	}
}

// TestRuleBound: at most MaxRules rules load (issue 11: 2,000 did, and a
// request then took about 65 ms).
func TestRuleBound(t *testing.T) {
	rules := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = `{"name":"r` + strconv.Itoa(i) + `","algorithm_config":{"rps":1,"burst":5}}`
		}
		return `{"rules":[` + strings.Join(parts, ",") + `]}`
	}
	if _, err := Parse([]byte(rules(MaxRules))); err != nil {
		t.Fatalf("%d rules: %v", MaxRules, err)
	}
	_, err := Parse([]byte(rules(MaxRules + 1)))
	want := "has 257 rules (fallback limits included); at most 256 are allowed"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%d rules: got %v, want an error containing %q", MaxRules+1, err, want)
	}
}

// TestConfigJSONPosition: a configuration that is not JSON says where it
// breaks (issue 11, item 4).
func TestConfigJSONPosition(t *testing.T) {
	_, err := Parse([]byte("{\n\"name\": \"a\",\n}"))
	if err == nil || !strings.Contains(err.Error(), "configuration is not valid JSON: line 3, column 1: trailing comma") {
		t.Errorf("Parse: %v, want the line and column", err)
	}
}
