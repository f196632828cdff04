package filter

import (
	"slices"
	"testing"

	"github.com/tokengate/tokengate/config"
)

// TestStageOrder pins the order of the request path's stages, which is
// load-bearing (see stages): a change here must be a decision, made with
// the comment on stages.
func TestStageOrder(t *testing.T) {
	var got []string
	for _, st := range stages {
		got = append(got, st.name)
	}
	want := []string{"shadow", "in-flight", "local", "lease", "cluster", "hold"}
	if !slices.Equal(got, want) {
		t.Errorf("stages %v, want %v", got, want)
	}
}

// TestLocalReplyJSON: the one JSON body every local reply without a
// configured body gets, field by field.
func TestLocalReplyJSON(t *testing.T) {
	r := &rule{Rule: &config.Rule{Name: "per-ip"}}
	tests := []struct {
		name        string
		rep         localReply
		ruleHeaders bool
		want        string
	}{
		{"rejection", localReply{reason: ReasonExceeded, rule: r, retry: 3}, true,
			`{"error":"rate_limited","reason":"token_bucket_exceeded","rule":"per-ip","retry_after":3}` + "\n"},
		{"rejection without rule headers", localReply{reason: ReasonExceeded, rule: r, retry: 3}, false,
			`{"error":"rate_limited","reason":"token_bucket_exceeded","retry_after":3}` + "\n"},
		{"cost exceeds burst", localReply{reason: ReasonCostExceedsBurst, rule: r}, true,
			`{"error":"rate_limited","reason":"cost_exceeds_burst","rule":"per-ip"}` + "\n"},
		{"store error", localReply{unavailable: true, reason: ReasonStoreError, rule: r}, false,
			`{"error":"rate_limiter_unavailable","reason":"store_error"}` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(tc.rep.appendJSON(nil, tc.ruleHeaders)); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
