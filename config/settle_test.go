package config_test

import (
	"testing"

	"github.com/tokengate/tokengate/config"
)

func TestParseSettleConfig(t *testing.T) {
	cfg, err := config.Parse([]byte(`{"rules":[
		{"name":"llm","algorithm_config":{"rps":1,"burst":100,"cost_source":"response_sse:/message/usage/input_tokens+/usage/output_tokens","pre_charge":5}},
		{"name":"login","algorithm_config":{"rps":1,"burst":3,"count_statuses":[401,"403","5xx"],"reset_on_statuses":"2xx"}},
		{"name":"hdr","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_header:X-Usage"}},
		{"name":"est","algorithm_config":{"rps":10,"burst":1000,"cost_source":"response_json:/usage/total_tokens","estimate_source":"header:X-Max-Tokens","strip_accept_encoding":true}},
		{"name":"cc","algorithm":"concurrency","algorithm_config":{"max_in_flight":7}},
		{"name":"body","algorithm_config":{"rps":10,"burst":1000,"cost_source":"response_json:/usage/total_tokens","estimate_source":"request_json:/max_tokens+/max_output_tokens"}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Rules()
	llm := r[0]
	if s := llm.Settle; s == nil || s.Response != config.ResponseSSE || len(s.Pointers) != 2 || s.PreCharge != 5 ||
		llm.Limit.MaxDebt != 1e12 || llm.Cost.Kind != config.CostResponse || llm.Cost.PreCharge != 5 {
		t.Errorf("llm: got %+v %+v %+v", llm.Settle, llm.Limit, llm.Cost)
	}
	login := r[1].Settle
	for st, want := range map[int]bool{401: true, 403: true, 404: false, 500: true, 599: true, 200: false} {
		if login.Count.Has(st) != want {
			t.Errorf("count_statuses has %d: got %v", st, !want)
		}
	}
	if !login.Reset.Has(204) || login.Reset.Has(401) {
		t.Errorf("reset_on_statuses: %v", login.Reset)
	}
	// Issue 22: the default reservation is a tenth of the burst, and a
	// settlement's debt is carried (no floor short of the largest burst),
	// not forgiven below -burst.
	if r[2].Settle.Header != "x-usage" || r[2].Limit.MaxDebt != 1e12 || r[2].Settle.PreCharge != 0.3 || r[2].Cost.PreCharge != 0.3 {
		t.Errorf("hdr: %+v, max_debt %v (want 1e12, pre_charge 0.3)", r[2].Settle, r[2].Limit.MaxDebt)
	}
	if est := r[3]; est.Cost.Estimate != config.CostHeader || est.Cost.EstimateName != "x-max-tokens" || est.Cost.Burst != 1000 ||
		est.Cost.PreCharge != 100 || !est.Settle.StripAcceptEncoding {
		t.Errorf("est: %+v %+v", est.Cost, est.Settle)
	}
	if r[4].InFlight == nil || r[4].InFlight.Max != 7 || r[4].InFlight.Lease != 600 {
		t.Errorf("cc: %+v", r[4].InFlight)
	}
	if body := r[5]; body.Cost.Estimate != config.CostRequestJSON || len(body.Settle.EstimatePointers) != 2 || body.Cost.PreCharge != 100 {
		t.Errorf("body: %+v %+v", body.Cost, body.Settle)
	}
}

func TestParseSettleConfigErrors(t *testing.T) {
	rls := `,"settings":{"rls":{"cluster":"rls"}}}`
	const removed = "is no longer accepted: a reported cost is always carried in full and the debt is repaid by the refill, never forgiven (a bucket in debt already refuses new requests); remove it, and to bound what one request may take, reserve its estimate at admission (estimate_source, pre_charge) and cap the upstream's usage (max_tokens)"
	tests := []struct{ name, config, expectedErr string }{
		{"overlap", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"count_statuses":"4xx","reset_on_statuses":[401]}}`,
			`algorithm_config.reset_on_statuses: must not share a status with count_statuses: a status either counts or resets`},
		{"bad class", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"count_statuses":"6xx"}}`,
			`algorithm_config.count_statuses: must be a status (401 or "401") or a class ("4xx"), got "6xx"`},
		{"pre_charge without a response cost", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"pre_charge":1}}`,
			`algorithm_config.pre_charge: applies only to a cost known after the response (cost_source "response_header:...", "response_json:..." or "response_sse:...")`},
		{"pre_charge over burst", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/u","pre_charge":4}}`,
			`algorithm_config.pre_charge: must be from 0 to 3, got 4`},
		// Issue 22: max_debt forgave what lay below its floor; a reported
		// cost is now carried in full, so the field is refused, whatever
		// its value, with the replacement named.
		{"max_debt", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/u","max_debt":10}}`,
			`algorithm_config.max_debt: ` + removed},
		{"max_debt 0 and no pre_charge", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/u","max_debt":0,"pre_charge":0}}`,
			`algorithm_config.max_debt: ` + removed},
		{"max_debt without a response cost", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"max_debt":0}}`,
			`algorithm_config.max_debt: ` + removed},
		{"estimate without a response cost", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"estimate_source":"header:x-max-tokens"}}`,
			`algorithm_config.estimate_source: applies only to a cost known after the response (cost_source "response_header:...", "response_json:..." or "response_sse:...")`},
		{"bad estimate", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/u","estimate_source":"fixed"}}`,
			`algorithm_config.estimate_source: must be "header:<name>", "query:<name>" or "request_json:<JSON pointers>", got "fixed"`},
		{"bad request_json pointer", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/u","estimate_source":"request_json:max_tokens"}}`,
			`algorithm_config.estimate_source: request_json needs JSON pointers such as "/usage/total_tokens" (1 to 8 tokens of at most 64 bytes, joined by '+'), got "max_tokens"`},
		{"estimate not a string", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/u","estimate_source":5}}`,
			`algorithm_config.estimate_source: must be "header:<name>", "query:<name>" or "request_json:<JSON pointers>", got 5`},
		{"strip on a header cost", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_header:x-u","strip_accept_encoding":true}}`,
			`algorithm_config.strip_accept_encoding: applies only to a cost read from the body (response_json or response_sse)`},
		{"strip not a bool", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/u","strip_accept_encoding":"yes"}}`,
			`algorithm_config.strip_accept_encoding: must be true or false, got "yes"`},
		{"response cost on a window", `{"name":"a","algorithm":"fixed_window","algorithm_config":{"limit":3,"window_seconds":1,"cost_source":"response_json:/u"}}`,
			`algorithm_config.cost_source: a cost known after the response needs a token_bucket, whose balance may go into debt; fixed windows have none`},
		{"too many pointers", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_json:/a+/b+/c+/d+/e"}}`,
			`algorithm_config.cost_source: at most 4 JSON pointers joined by '+', got 5`},
		{"bad header", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"cost_source":"response_header:"}}`,
			`algorithm_config.cost_source: response_header needs a header name of 1 to 64 characters from [A-Za-z0-9_-], got ""`},
		{"reservation and settling", `{"name":"a","algorithm_config":{"rps":1,"burst":3,"max_reserved":2,"count_statuses":[401]}}`,
			`algorithm_config.max_reserved: cannot be combined with count_statuses, reset_on_statuses or a response_* cost_source: a reservation holds requests against a debt the bucket already carries; settle in a rule of its own`},
		{"lease too short", `{"name":"a","algorithm":"concurrency","algorithm_config":{"max_in_flight":1,"lease_seconds":0.5}}`,
			`algorithm_config.lease_seconds: must be >= 1, got 0.5`},
		{"lease settles", `{"rules":[{"name":"a","scope":"cluster","mode":"lease","algorithm_config":{"rps":1,"burst":30,"count_statuses":[401]}}]` + rls,
			`rule "a": "mode": "lease" cannot settle after the response (count_statuses, reset_on_statuses, response_* costs): a refund into an allowance would race with the service's accounting of it; use "mode": "exact", which settles in the service (docs/rls.md)`},
		{"cluster concurrency", `{"rules":[{"name":"a","scope":"cluster","algorithm":"concurrency","algorithm_config":{"max_in_flight":1}}]` + rls,
			`rule "a": "scope": "cluster" cannot count requests in flight: a count in the service would need a release call per request and would leak what a dead proxy held; use "scope": "local" for a concurrency rule (docs/rls.md)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tt.config))
			if err == nil || err.Error() != tt.expectedErr {
				t.Errorf("got error\n  %v\nwant\n  %s", err, tt.expectedErr)
			}
		})
	}
}

// TestResponseDefaultCostAboveBurst: a response-cost rule's default_cost is
// charged after the response when no usage is seen; above the burst it
// takes the balance into debt, it does not stop requests, so it is
// accepted. It was refused with "no request can ever pass" (issue 22,
// item 10).
// TestClusterRequestJSONEstimate: issue 31 accepts the request body's
// estimate on a cluster rule (refused before: the filter asks the service
// for it once the body has been read, filter/cluster_estimate.go); a lease
// rule still cannot settle, so it cannot have one.
func TestClusterRequestJSONEstimate(t *testing.T) {
	const rls = `,"settings":{"rls":{"cluster":"rls"}}}`
	cfg, err := config.Parse([]byte(`{"rules":[{"name":"a","scope":"cluster","algorithm_config":{"rps":1,"burst":30,"cost_source":"response_json:/u","estimate_source":"request_json:/max_tokens"}}]` + rls))
	if err != nil {
		t.Fatal(err)
	}
	if r := cfg.Rules()[0]; !r.Cluster || r.Cost.Estimate != config.CostRequestJSON {
		t.Errorf("got cluster %v estimate %v, want a cluster rule with a request_json estimate", r.Cluster, r.Cost.Estimate)
	}
	_, err = config.Parse([]byte(`{"rules":[{"name":"a","scope":"cluster","mode":"lease","algorithm_config":{"rps":1,"burst":30,"cost_source":"response_json:/u","estimate_source":"request_json:/max_tokens"}}]` + rls))
	if err == nil {
		t.Error("a lease rule with a request_json estimate: accepted, want the lease settlement refusal")
	}
}

func TestResponseDefaultCostAboveBurst(t *testing.T) {
	for _, src := range []string{"response_json:/usage/total_tokens", "response_sse:/usage/total_tokens", "response_header:x-usage"} {
		cfg, err := config.Parse([]byte(`{"name":"a","algorithm_config":{"rps":1,"burst":5,"cost_source":"` + src + `","default_cost":6}}`))
		if err != nil {
			t.Errorf("%s: got %v, want it accepted", src, err)
			continue
		}
		if got := cfg.Rules()[0].Cost.Default; got != 6 {
			t.Errorf("%s: default cost got %v, want 6", src, got)
		}
	}
}
