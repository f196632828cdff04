package filter_test

import (
	"testing"

	"github.com/tokengate/tokengate/filter"
)

// TestOnMissingKey (issue 22, item 5): a request whose limit key cannot be
// built (no header, a bearer token that is not a JWT) skipped the rule and
// went unlimited, where a request with the key got 2 and then 429. The
// rule's on_missing_key now chooses: skip (the default, as before), one
// shared bucket for every such request, or deny.
func TestOnMissingKey(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		keys       string
		without    [][]string // headers of the keyless requests, in turn
		want       []uint32   // their statuses
		reason     string     // X-Tokengate-Reason of the last
	}{
		{"skip header", `"skip"`, `"header:x-api-key"`, [][]string{nil, nil, nil, nil}, []uint32{200, 200, 200, 200}, ""},
		{"default is skip", ``, `"header:x-api-key"`, [][]string{nil, nil, nil}, []uint32{200, 200, 200}, ""},
		{"shared header", `"shared"`, `"header:x-api-key"`, [][]string{nil, nil, nil, nil}, []uint32{200, 200, 429, 429}, "token_bucket_exceeded"},
		{"shared broken jwt", `"shared"`, `"jwt:sub"`,
			[][]string{{"authorization", "Bearer not.a.jwt"}, {"authorization", "Bearer x"}, nil},
			[]uint32{200, 200, 429}, "token_bucket_exceeded"},
		{"deny header", `"deny"`, `"header:x-api-key"`, [][]string{nil}, []uint32{429}, "missing_key"},
		{"deny broken jwt", `"deny"`, `"jwt:sub"`, [][]string{{"authorization", "Bearer not.a.jwt"}}, []uint32{429}, "missing_key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			omk := ""
			if tc.mode != "" {
				omk = `,"on_missing_key":` + tc.mode
			}
			f := newFixture(t, `{"rules":[{"name":"per-key","limit_keys":[`+tc.keys+`]`+omk+
				`,"algorithm_config":{"rps":0.01,"burst":2}}],"settings":{"rule_headers":true}}`)
			var last string
			for i, h := range tc.without {
				res := f.get(h...)
				if got := res.Status(); got != tc.want[i] {
					t.Fatalf("keyless request %d: got %d, want %d", i+1, got, tc.want[i])
				}
				last = res.Header("x-tokengate-reason")
				if tc.reason == "missing_key" && res.Header("retry-after") != "" {
					t.Errorf("denied request %d has Retry-After %q; waiting cannot help", i+1, res.Header("retry-after"))
				}
			}
			if last != tc.reason {
				t.Errorf("X-Tokengate-Reason: got %q, want %q", last, tc.reason)
			}
			if got := f.counter("per-key", filter.CounterDescriptorMissing); got != int64(len(tc.without)) {
				t.Errorf("descriptor_missing: got %d, want %d", got, len(tc.without))
			}
			// A request with the key has its own bucket whatever the mode.
			key := []string{"x-api-key", "k1"}
			if tc.keys == `"jwt:sub"` {
				key = []string{"authorization", "Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ1MSJ9."}
			}
			for i, want := range []uint32{200, 200, 429} {
				if got := f.get(key...).Status(); got != want {
					t.Fatalf("keyed request %d: got %d, want %d", i+1, got, want)
				}
			}
		})
	}
}

// TestOnMissingKeyShadowDenyCounts: a shadow rule's deny is counted, never
// sent.
func TestOnMissingKeyShadowDenyCounts(t *testing.T) {
	f := newFixture(t, `{"bundle_version":1,"policies":[{"id":"trial","spec":{"mode":"shadow","rules":[`+
		`{"name":"per-key","limit_keys":["header:x-api-key"],"on_missing_key":"deny","algorithm_config":{"rps":1,"burst":2}}]}}]}`)
	if got := f.get().Status(); got != 200 {
		t.Fatalf("shadow deny: got %d, want 200", got)
	}
	if got := f.counter("per-key", filter.CounterShadowRejected); got != 1 {
		t.Errorf("shadow_rejected: got %d, want 1", got)
	}
}
