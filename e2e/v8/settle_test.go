package v8

import (
	"strings"
	"testing"
)

func withResponse(s step, status int, abort bool, chunks ...string) step {
	s["response"] = map[string]any{"status": status, "headers": [][2]string{{"content-type", "text/event-stream"}}, "chunks": chunks, "abort": abort}
	return s
}

// TestSettleUnderV8: the response hooks under V8: an SSE usage split across
// body chunks is charged exactly, an aborted stream is settled once in
// proxy_on_done, and count_statuses refunds a success and keeps a 401.
func TestSettleUnderV8(t *testing.T) {
	cfg := `{"rules":[` +
		`{"name":"llm","limit_keys":["ip:address"],"match":{"header:x-kind":"llm"},"algorithm_config":{"tokens_per_second":1,"burst":100,` +
		`"cost_source":"response_sse:/usage/total_tokens","pre_charge":4}},` +
		`{"name":"login","limit_keys":["ip:address"],"match":{"header:x-kind":"login"},"algorithm_config":{"tokens_per_second":0.001,"burst":3,"count_statuses":[401]}}]}`
	llm := func(source string) step { return get("/v1", source, "x-kind", "llm") }
	login := func(source string) step { return get("/login", source, "x-kind", "login") }
	usage := "data: {\"choices\":[],\"usage\":{\"total_tokens\":31}}\n\n"
	var chunks []string
	for i := 0; i < len(usage); i += 3 {
		chunks = append(chunks, usage[i:min(i+3, len(usage))])
	}
	res := run(t, cfg, 2, nil,
		withResponse(llm("127.0.0.1:1"), 200, false, append([]string{"data: {\"usage\":null}\n\n"}, append(chunks, "data: [DONE]\n\n")...)...),
		withResponse(llm("127.0.0.2:1"), 200, true, "data: {\"usage\":{\"total_tokens\":9}}\n\n", "data: {\"cho"),
		withResponse(login("127.0.0.3:1"), 200, false, "ok"),
		withResponse(login("127.0.0.3:1"), 401, false, "no"),
		shared(),
		metric("tokengate.rule.llm.settle_charged"),
	)
	mustStart(t, res)
	for i, r := range res[1:5] {
		if want := []int{200, 200, 200, 401}[i]; r.Status != want {
			t.Fatalf("request %d: got %d, want %d", i, r.Status, want)
		}
	}
	want := map[string]string{"127.0.0.1": "69.000000", "127.0.0.2": "91.000000", "127.0.0.3": "2.000000"}
	got := map[string]string{}
	for _, e := range res[5].Entries {
		f := strings.SplitN(e.Value, ":", 3)
		if len(f) == 3 && strings.HasPrefix(e.Key, "tb:") {
			got[f[2]] = f[0]
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: got tokens %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if res[6].Value != "2" {
		t.Errorf("settle_charged: got %s, want 2", res[6].Value)
	}
}
