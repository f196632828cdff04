package rls_test

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/service/rls"
)

func TestResolve(t *testing.T) {
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	e := func(kv ...string) []rls.Entry {
		var out []rls.Entry
		for i := 0; i < len(kv); i += 2 {
			out = append(out, rls.Entry{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	tests := []struct {
		name         string
		domain       string
		entries      []rls.Entry
		expectedRule string // "" for no rule
		expectedKey  string
	}{
		{"filter descriptor", "tokengate", e("tokengate_rule", "keys", "key", "10.0.0.1"), "keys", "tb:{keys:10.0.0.1}"},
		{"filter descriptor", "tokengate", e("tokengate_rule", "keys", "key", "2001:db8::1|GET"), "keys", "tb:{keys:2001:db8::1|GET}"},
		// Issue 23: three domains drew from one bucket.
		{"filter descriptor, another domain", "whatever", e("tokengate_rule", "keys", "key", "2001:db8::1|GET"), "", ""},
		{"filter descriptor, braces encoded", "tokengate", e("tokengate_rule", "keys", "key", "a}b{c"), "keys", "tb:{keys:a%7Db%7Bc}"},
		{"filter descriptor, no key", "tokengate", e("tokengate_rule", "hot", "key", ""), "hot", "tb:{hot:}"},
		{"local rule is not the service's", "tokengate", e("tokengate_rule", "local", "key", ""), "", ""},
		{"unknown rule", "tokengate", e("tokengate_rule", "nope", "key", ""), "", ""},
		{"entries in the wrong order", "tokengate", e("key", "", "tokengate_rule", "hot"), "", ""},
		{"wildcard value", "edge", e("remote_address", "192.0.2.1"), "edge-ip", "tb:{edge-ip:192.0.2.1}"},
		{"wildcard value, encoded", "edge", e("remote_address", "a b"), "edge-ip", "tb:{edge-ip:a%20b}"},
		{"nested exact", "edge", e("generic_key", "api", "header_match", "post"), "api-post", "tb:{api-post:api|post}"},
		{"inner node has no rule", "edge", e("generic_key", "api"), "", ""},
		{"value mismatch", "edge", e("generic_key", "web", "header_match", "post"), "", ""},
		{"too deep", "edge", e("remote_address", "192.0.2.1", "x", "y"), "", ""},
		{"unknown domain", "other", e("remote_address", "192.0.2.1"), "", ""},
		{"no entries", "edge", nil, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, key := cfg.Resolve(tc.domain, tc.entries)
			got := ""
			if r != nil {
				got = r.Name
			}
			if got != tc.expectedRule || key != tc.expectedKey {
				t.Errorf("got rule %q key %q, want %q %q", got, key, tc.expectedRule, tc.expectedKey)
			}
		})
	}
}

// FuzzResolve: whatever the descriptor, Resolve does not panic, and a key
// it returns is "tb:{...}" with no other brace, so its Redis Cluster hash
// tag is the whole bucket identity; the same input gives the same key.
func FuzzResolve(f *testing.F) {
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		f.Fatal(err)
	}
	f.Add("tokengate", "tokengate_rule", "keys", "key", "10.0.0.1")
	f.Add("edge", "remote_address", "a}b", "", "")
	f.Add("edge", "generic_key", "api", "header_match", "post")
	f.Add("x", "tokengate_rule", "hot", "key", "{{}}")
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string) {
		entries := []rls.Entry{{Key: k1, Value: v1}}
		if k2 != "" {
			entries = append(entries, rls.Entry{Key: k2, Value: v2})
		}
		r, key := cfg.Resolve(domain, entries)
		if r == nil {
			if key != "" {
				t.Fatalf("no rule but key %q", key)
			}
			return
		}
		inner, ok := strings.CutPrefix(key, "tb:{")
		if !ok || !strings.HasSuffix(inner, "}") || strings.ContainsAny(inner[:len(inner)-1], "{}") {
			t.Fatalf("key %q: the hash tag is not the whole identity", key)
		}
		if !strings.HasPrefix(inner, r.Name+":") {
			t.Fatalf("key %q does not start with rule %q", key, r.Name)
		}
		if _, again := cfg.Resolve(domain, entries); again != key {
			t.Fatalf("key %q then %q", key, again)
		}
	})
}
