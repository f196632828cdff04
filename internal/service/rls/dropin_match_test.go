package rls

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// matchTree is a domain whose keys and values hold '_', the separator of
// envoyproxy/ratelimit's composite keys ("key_value").
func matchTree() []*Domain {
	lim := func() *RateLimit {
		return &RateLimit{RequestsPerUnit: 1, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	}
	return []*Domain{{Name: "d", Descriptors: []*Descriptor{
		{Key: "a_b", Value: "c", RateLimit: lim()},
		{Key: "x", Value: "y", RateLimit: lim()},
		{Key: "p", Value: "q*", RateLimit: lim()},
		{Key: "k_v", RateLimit: lim()},
		{Key: "us*", RateLimit: lim()},
		{Key: "m", Value: "n*o", RateLimit: lim()},
		{Key: "t", Value: "u", Descriptors: []*Descriptor{
			{Key: "s_1", RateLimit: lim()},
			{Key: "s", Value: "2_*", RateLimit: lim()},
		}},
	}}}
}

// TestDropinMatchComposite: a descriptor's entries are matched as
// envoyproxy/ratelimit matches them, by the composite "key_value" (the
// rule of its GetLimit: exact composite, then the first pattern, then the
// key alone), so '_' in a key or a value moves the boundary between the
// two. Before, keys and values were compared apart, and each case marked
// "composite" found no limit or another one.
func TestDropinMatchComposite(t *testing.T) {
	cfg, err := NewDropinConfig(matchTree(), DropinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		entries []string // key, value, key, value ...
		want    string   // the limit's rule name; "" none
	}{
		{"exact", []string{"a_b", "c"}, "d.a_b_c"},
		{"composite: '_' moved from the key to the value", []string{"a", "b_c"}, "d.a_b_c"},
		{"composite: the key alone names a node with a value", []string{"x_y", "anything"}, "d.x_y"},
		{"composite: key and value name a node with no value", []string{"k", "v"}, "d.k_v"},
		{"key only", []string{"k_v", "z"}, "d.k_v"},
		{"pattern", []string{"p", "q1"}, "d.p_q*"},
		{"composite: a pattern matches across the '_'", []string{"p_q", "z"}, "d.p_q*"},
		{"composite: a key with '*' is a pattern on the composite", []string{"user", "alice"}, "d.us*"},
		{"composite: a key pattern matches an empty value", []string{"usX", ""}, "d.us*"},
		{"middle '*'", []string{"m", "nXo"}, "d.m_n*o"},
		{"middle '*' across the '_'", []string{"m_n", "o"}, "d.m_n*o"},
		{"middle '*' needs the suffix", []string{"m", "nX"}, ""},
		{"composite: nested, key and value name a node with no value", []string{"t", "u", "s", "1"}, "d.t_u.s_1"},
		{"nested pattern with '_'", []string{"t", "u", "s_2", "z"}, "d.t_u.s_2_*"},
		{"nested composite pattern", []string{"t", "u", "s", "2_z"}, "d.t_u.s_2_*"},
		{"composite: keys alone at each level", []string{"t_u", "", "s_1", ""}, "d.t_u.s_1"},
		{"no match", []string{"a", "b"}, ""},
		{"prefix of a composite is no match", []string{"a", "b_"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var es []Entry
			for i := 0; i+1 < len(tt.entries); i += 2 {
				es = append(es, Entry{Key: tt.entries[i], Value: tt.entries[i+1]})
			}
			got := ""
			if l, _ := cfg.dropin.resolve("d", es); l != nil {
				got = l.rule.Name
			}
			if got != tt.want {
				t.Errorf("%v: got limit %q, want %q", strings.Join(tt.entries, " "), got, tt.want)
			}
		})
	}
}

// TestDropinDuplicateComposite: two descriptors with the same composite key
// are one node to envoyproxy/ratelimit, which refuses them ("duplicate
// descriptor composite key"); so does the drop-in.
func TestDropinDuplicateComposite(t *testing.T) {
	_, err := NewDropinConfig([]*Domain{{Name: "d", Descriptors: []*Descriptor{
		{Key: "a_b", Value: "c"}, {Key: "a", Value: "b_c"},
	}}}, DropinOptions{})
	if err == nil || !strings.Contains(err.Error(), "d.a_b_c: duplicate descriptor") {
		t.Fatalf("got %v, want d.a_b_c: duplicate descriptor", err)
	}
}

// TestDetailedName: a detailed series is named as envoyproxy/ratelimit
// names a detailed stat (domain, then ".key_value" per entry, an empty
// value leaving "key_"), cut to maxDetailedLabel bytes at a character
// boundary, so that long values cannot make a series' label unbounded.
func TestDetailedName(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	tests := []struct {
		name    string
		entries []Entry
		want    string
	}{
		{"one", []Entry{{Key: "user", Value: "alice"}}, "edge.user_alice"},
		{"nested", []Entry{{Key: "tenant", Value: "acme"}, {Key: "plan", Value: "gold"}}, "edge.tenant_acme.plan_gold"},
		{"empty value", []Entry{{Key: "a", Value: ""}}, "edge.a_"},
		{"cut", []Entry{{Key: "k", Value: long}}, "edge.k_" + strings.Repeat("é", (maxDetailedLabel-len("edge.k_"))/2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := detailedName("edge", tt.entries)
			if got != tt.want {
				t.Errorf("got %q (%d bytes), want %q", got, len(got), tt.want)
			}
			if len(got) > maxDetailedLabel {
				t.Errorf("%d bytes, above %d", len(got), maxDetailedLabel)
			}
		})
	}
}
