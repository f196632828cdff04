package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// shadowTokens returns the tokens of the shadow bucket of a rule without
// limit keys ("shadow:tb:<rule>:").
func shadowTokens(t *testing.T, ms *wasmhost.MemData, rule string) float64 {
	t.Helper()
	for _, e := range ms.Snapshot("shadow:tb:" + rule + ":") {
		if e.Key != "shadow:tb:"+rule+":" {
			continue
		}
		tok, err := strconv.ParseFloat(strings.SplitN(e.Value, ":", 2)[0], 64)
		if err != nil {
			t.Fatalf("%s: %q", e.Key, e.Value)
		}
		return tok
	}
	t.Fatalf("no shadow bucket for %s", rule)
	return 0
}

// TestCountStatusesInShadow: rules of a shadow policy settle as they would
// if enforced, so that they predict the enforced rule: a shadow
// count_statuses rule refunds successes (ten of them predict no 429), and
// after burst failures predicts the next request's 429 while letting it
// through; a shadow response_json rule charges the reported tokens. A
// request the filter answers itself (an enforced rule's 429) keeps the
// shadow admission cost: the upstream never answered it.
func TestCountStatusesInShadow(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "good" {
			w.WriteHeader(401)
			return
		}
		_, _ = io.WriteString(w, `{"usage":{"total_tokens":42}}`)
	}))
	defer up.Close()
	cfg := `{"bundle_version":1,"policies":[
	  {"id":"trial","spec":{"mode":"shadow","rules":[
	    {"name":"login","match":{"path":"/login"},"algorithm_config":{"tokens_per_second":0.001,"burst":3,"count_statuses":[401]}},
	    {"name":"llm","match":{"path":"/llm"},"algorithm_config":{"tokens_per_second":0.001,"burst":1000,"cost_source":"response_json:/usage/total_tokens","pre_charge":10}}]}},
	  {"id":"edge","spec":{"rules":[
	    {"name":"wall","match":{"header:x-wall":"1"},"algorithm_config":{"tokens_per_second":0.001,"burst":1}}]}}]}`
	clk := wasmhost.NewFakeClock(t0)
	h, srv, ms := settleHost(t, cfg, up, false, false, clk)
	c := srv.Client()
	good := map[string]string{"Authorization": "good"}
	n := uint64(0)
	req := func(path string, hd map[string]string, want int) {
		t.Helper()
		if r := mustDo(t, c, srv, path, hd); r.status != want {
			t.Fatalf("request %d: got %d, want %d", n+1, r.status, want)
		}
		n++
		waitStreamsEnded(t, h, n)
	}
	for i := 0; i < 10; i++ {
		req("/login", good, 200)
		req("/llm", good, 200)
	}
	if got := metric(t, h, "login", "shadow_rejected"); got != 0 {
		t.Fatalf("after 10 successes: shadow_rejected %d, want 0 (successes are refunded)", got)
	}
	if got := shadowTokens(t, ms, "login"); got != 3 {
		t.Fatalf("login shadow bucket after successes: %v, want 3", got)
	}
	if got, want := shadowTokens(t, ms, "llm"), 1000-10*42.0; got != want {
		t.Fatalf("llm shadow bucket: %v, want %v (42 charged per response)", got, want)
	}
	for i := 0; i < 3; i++ {
		req("/login", nil, 401)
	}
	req("/login", good, 200) // the shadow rule would have rejected it
	if got := metric(t, h, "login", "shadow_rejected"); got != 1 {
		t.Fatalf("after 3 failures: shadow_rejected %d, want 1", got)
	}
	if got := metric(t, h, "login", "settle_refunded"); got != 10 {
		t.Errorf("login settle_refunded: got %d, want 10", got)
	}

	// An enforced rule answers 429 itself: the shadow llm bucket keeps
	// the admission cost (10), no usage is charged.
	before := shadowTokens(t, ms, "llm")
	req("/llm", map[string]string{"Authorization": "good", "X-Wall": "1"}, 200)
	req("/llm", map[string]string{"Authorization": "good", "X-Wall": "1"}, 429)
	if got, want := shadowTokens(t, ms, "llm"), before-42-10; got != want {
		t.Errorf("llm shadow bucket: %v, want %v (42 for the admitted request, the admission cost of the one we answered)", got, want)
	}
}
