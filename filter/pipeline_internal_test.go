package filter

import (
	"reflect"
	"slices"
	"testing"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/sharedstate"
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

// TestLocalOnlySkipsNoWork: OnRequestHeaders runs only the local and hold
// stages for a request whose buckets are all local (reqState.localOnly);
// that is the stage loop's answer only if every other stage does nothing
// for such a request. Each one must return Continue and leave the state
// as it was, whatever the local stage left in it (a prepared hold, a wait).
func TestLocalOnlySkipsNoWork(t *testing.T) {
	r := &rule{Rule: &config.Rule{Name: "per-ip"}}
	s := &Stream{p: &Plugin{}}
	st := &s.st
	st.enforce.rules = append(st.enforce.rules, r)
	st.enforce.reqs = append(st.enforce.reqs, sharedstate.Request{Key: "tb:per-ip:$1", Cost: 1})
	st.enforce.vals = append(st.enforce.vals, [2]int{0, 1})
	st.vals = append(st.vals, "10.0.0.1")
	st.hold, st.wait, st.waitRule, st.now = &waiter{}, 0.5, 0, 100
	if !st.localOnly() {
		t.Fatal("localOnly: got false for a request with local buckets only")
	}
	want := *st
	for _, stg := range stages {
		if stg.name == "local" || stg.name == "hold" {
			continue
		}
		if got := stg.run(s, st); got != Continue {
			t.Errorf("stage %s: got %v, want Continue", stg.name, got)
		}
		if !reflect.DeepEqual(*st, want) {
			t.Errorf("stage %s changed the state of a local-only request", stg.name)
		}
	}
	for _, g := range []*group{&st.shadow, &st.inflight, &st.lease, &st.cluster, &st.exact} {
		g.rules = append(g.rules, r)
		g.reqs = append(g.reqs, sharedstate.Request{})
		if st.localOnly() {
			t.Errorf("localOnly: got true with a bucket in another group")
		}
		g.reset()
	}
}
