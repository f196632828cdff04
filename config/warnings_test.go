package config

import (
	"strings"
	"testing"
)

// TestWarnings (issue 22, items 5 and 6): what -check points out.
func TestWarnings(t *testing.T) {
	const bucket = `"algorithm_config":{"rps":1,"burst":5}`
	tests := []struct {
		name   string
		config string
		want   []string // each a substring of one warning, in order
	}{
		{"tiers without fallback", `{"rules":[` +
			`{"name":"enterprise","limit_keys":["header:x-api-key"],"match":{"jwt:plan":"enterprise"},` + bucket + `},` +
			`{"name":"free","limit_keys":["header:x-api-key"],"match":{"jwt:plan":"free"},` + bucket + `}]}`,
			[]string{`policy "default": a request these rules skip is limited by no other rule (enterprise: match jwt:plan; free: match jwt:plan)`}},
		{"tiers with fallback", `{"bundle_version":1,"policies":[{"id":"api","spec":{"rules":[` +
			`{"name":"free","limit_keys":["header:x-api-key"],"match":{"jwt:plan":"free"},` + bucket + `}],` +
			`"fallback_limit":{"limit_keys":["ip:address"],` + bucket + `}}}]}`, nil},
		{"keyed by a header", `{"name":"a","limit_keys":["header:x-api-key"],` + bucket + `}`,
			[]string{`policy "default": a request these rules skip is limited by no other rule (a: limit key header:x-api-key)`}},
		{"keyed by a header, shared", `{"name":"a","limit_keys":["header:x-api-key"],"on_missing_key":"shared",` + bucket + `}`, nil},
		{"keyed by a claim, deny", `{"name":"a","limit_keys":["jwt:sub"],"on_missing_key":"deny",` + bucket + `}`, nil},
		{"keyed by address", `{"name":"a","limit_keys":["ip:address"],` + bucket + `}`, nil},
		{"one rule covers", `{"rules":[{"name":"a","limit_keys":["header:x-api-key"],` + bucket + `},{"name":"b","limit_keys":["ip:address"],` + bucket + `}]}`, nil},
		{"scoped by path", `{"rules":[{"name":"llm","limit_keys":["header:x-api-key"],"on_missing_key":"shared","match":{"path":"/v1/chat"},` + bucket + `},` +
			`{"name":"login","limit_keys":["ip:address"],"match":{"path":"/login"},` + bucket + `}]}`, nil},
		{"scoped by path, keyed by a header", `{"rules":[{"name":"llm","limit_keys":["header:x-api-key"],"match":{"path":"/v1/chat"},` + bucket + `},` +
			`{"name":"login","limit_keys":["ip:address"],"match":{"path":"/login"},` + bucket + `}]}`,
			[]string{`(llm: limit key header:x-api-key)`}},
		{"covered within its scope", `{"rules":[{"name":"llm","limit_keys":["header:x-api-key"],"match":{"path":"/v1/chat"},` + bucket + `},` +
			`{"name":"per-ip","limit_keys":["ip:address"],` + bucket + `}]}`, nil},
		{"shadow policy", `{"bundle_version":1,"policies":[{"id":"trial","spec":{"mode":"shadow","rules":[` +
			`{"name":"a","limit_keys":["header:x-api-key"],` + bucket + `}]}}]}`, nil},
		{"fallback skips", `{"bundle_version":1,"policies":[{"id":"up","spec":{"fallback_limit":{"limit_keys":["header:x-api-key","host"],` + bucket + `}}}]}`,
			[]string{`policy "up": fallback_limit "up-fallback" skips a request without header:x-api-key`}},
		{"reset keyed by address", `{"name":"login","limit_keys":["ip:address"],"algorithm_config":{"rps":0.01,"burst":5,` +
			`"count_statuses":[401],"reset_on_statuses":["2xx"]}}`,
			[]string{`rule "login": reset_on_statuses without a key naming the user`}},
		{"reset keyed by address and user", `{"name":"login","limit_keys":["ip:address","header:x-user"],"on_missing_key":"shared",` +
			`"algorithm_config":{"rps":0.01,"burst":5,"count_statuses":[401],"reset_on_statuses":["2xx"]}}`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			got := Warnings(cfg)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d warnings %q, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("warning %d: got %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}
