package filter_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/rlscontract"
)

const settleClusterCfg = `{"rules":[
	{"name":"llm","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":100,"cost_source":"response_json:/usage/total_tokens","pre_charge":0}},
	{"name":"login","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3,"count_statuses":[401],"reset_on_statuses":[200]}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":25,"on_error":"ON_ERROR"}}}`

// clusterStream starts a request under settleClusterCfg and answers its
// admission call with ok (both rules OK) or a failure.
func clusterStream(t *testing.T, f *fixture, ok bool) *stream {
	t.Helper()
	s, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	if res.RequestAction != filter.Pause || len(f.h.Calls) == 0 {
		t.Fatalf("action %v, %d calls; want the admission call", res.RequestAction, len(f.h.Calls))
	}
	resp := filtertest.CallResponse{}
	if ok {
		resp = grpcOK(rlsResponse(1, []rlsStatus{{1, 99, 1}, {1, 2, 1}}))
	}
	f.h.Deliver(f.p, f.h.Calls[len(f.h.Calls)-1].Token, resp)
	return &stream{f: f, s: s}
}

// TestClusterSettleCall: the settlements of cluster rules go to the service
// in one call from the stream's end, marked with the settle header, with a
// longer timeout; extra hits as hits_addend, refunds and resets as
// entries. The response is never paused for it, the answer changes
// nothing but the error count, and nothing is sent when the service did
// not admit the request (rejected, or on_error allow), or when on_error
// local decided it in shared data, where it settles instead.
func TestClusterSettleCall(t *testing.T) {
	cfg := func(onError string) string { return strings.Replace(settleClusterCfg, "ON_ERROR", onError, 1) }

	t.Run("usage and a reset", func(t *testing.T) {
		f := newFixture(t, cfg("deny"))
		st := clusterStream(t, f, true)
		if !bytes.Contains(f.h.Calls[0].Body, []byte{0x1a, 0x02, 0x08, 0x01}) {
			t.Errorf("admission body %q: want hits_addend 1 for pre_charge 0", f.h.Calls[0].Body)
		}
		st.headers("200", false)
		st.body(`{"usage":{"total_tokens":42}}`, true)
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls after the end of the body, want the settlement", len(f.h.Calls))
		}
		st.end()
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls after the stream's end, want one settlement call in all", len(f.h.Calls))
		}
		c := f.h.Calls[1]
		if v, _ := findHeader(c.Headers, rlscontract.SettleHeader); v != "1" || c.TimeoutMs != 1000 || c.Cluster != "rls" {
			t.Errorf("settlement call %+v: want the %s header, 1000 ms, cluster rls", c, rlscontract.SettleHeader)
		}
		// llm: 42 - 1 = 41 extra hits; login: a reset.
		for _, part := range [][]byte{[]byte("llm"), {0x1a, 0x02, 0x08, 41}, []byte("login"), []byte(rlscontract.SettleKey), []byte("reset"), []byte("192.0.2.1")} {
			if !bytes.Contains(c.Body, part) {
				t.Errorf("settlement body %q lacks %q", c.Body, part)
			}
		}
		if got := f.counter("llm", filter.CounterSettleCharged) + f.counter("login", filter.CounterSettleReset); got != 2 {
			t.Errorf("settle counters: %d, want 2", got)
		}
		f.h.Deliver(f.p, c.Token, filtertest.CallResponse{}) // a failed settlement
		if n, _ := f.h.Counter(filter.MetricRLSSettleErrors); n != 1 {
			t.Errorf("rls_settle_errors = %d, want 1", n)
		}
		if n, _ := f.h.Counter(filter.MetricRLSErrors); n != 0 {
			t.Errorf("rls_errors = %d: a settlement is not an admission", n)
		}
	})

	t.Run("refund", func(t *testing.T) {
		f := newFixture(t, cfg("deny"))
		st := clusterStream(t, f, true)
		st.headers("500", true) // login: not counted; llm: no body, default_cost 1 = what was taken
		st.end()
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls, want the admission and one settlement", len(f.h.Calls))
		}
		body := f.h.Calls[1].Body
		for _, part := range []string{"login", rlscontract.SettleKey, "refund", rlscontract.AmountKey} {
			if !bytes.Contains(body, []byte(part)) {
				t.Errorf("settlement body %q lacks %q", body, part)
			}
		}
		if bytes.Contains(body, []byte("llm")) {
			t.Errorf("settlement body %q settles llm, whose cost was what admission took", body)
		}
		f.h.Deliver(f.p, f.h.Calls[1].Token, grpcOK(rlsResponse(1, []rlsStatus{{1, 3, 0}})))
		if n, _ := f.h.Counter(filter.MetricRLSSettleErrors); n != 0 {
			t.Errorf("rls_settle_errors = %d, want 0", n)
		}
	})

	t.Run("nothing to send: a 401 counts, no usage is what was taken", func(t *testing.T) {
		f := newFixture(t, cfg("deny"))
		st := clusterStream(t, f, true)
		st.headers("401", true)
		st.end()
		if len(f.h.Calls) != 1 {
			t.Fatalf("%d calls, want the admission only", len(f.h.Calls))
		}
	})

	t.Run("rejected by the service", func(t *testing.T) {
		f := newFixture(t, cfg("deny"))
		s, _ := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
		f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(2, []rlsStatus{{2, 0, 3}, {1, 2, 1}})))
		st := &stream{f: f, s: s}
		st.headers("429", true)
		st.end()
		if len(f.h.Calls) != 1 {
			t.Fatalf("%d calls, want no settlement for a request the service rejected", len(f.h.Calls))
		}
	})

	t.Run("on_error allow: the service took nothing", func(t *testing.T) {
		f := newFixture(t, cfg("allow"))
		st := clusterStream(t, f, false)
		st.headers("200", false)
		st.body(`{"usage":{"total_tokens":42}}`, true)
		st.end()
		if len(f.h.Calls) != 1 {
			t.Fatalf("%d calls, want no settlement", len(f.h.Calls))
		}
	})

	t.Run("on_error local settles in shared data", func(t *testing.T) {
		f := newFixture(t, cfg("local"))
		st := clusterStream(t, f, false)
		st.headers("200", false)
		st.body(`{"usage":{"total_tokens":42}}`, true)
		st.end()
		if len(f.h.Calls) != 1 {
			t.Fatalf("%d calls, want no settlement call", len(f.h.Calls))
		}
		var got []string
		for _, e := range f.mem().Snapshot("tb:llm:") {
			got = append(got, e.Value)
		}
		if len(got) != 1 || !strings.HasPrefix(got[0], "58.000000:") {
			t.Errorf("llm in shared data: %q, want 58 tokens", got)
		}
	})

	t.Run("bounded in flight", func(t *testing.T) {
		f := newFixture(t, cfg("deny"))
		for i := 0; i <= 1024; i++ {
			st := clusterStream(t, f, true)
			st.headers("500", true)
			st.end()
		}
		if n, _ := f.h.Counter(filter.MetricRLSSettleCalls); n != 1024 {
			t.Errorf("rls_settle_calls = %d, want 1024", n)
		}
		if n, _ := f.h.Counter(filter.MetricRLSSettleErrors); n != 1 {
			t.Errorf("rls_settle_errors = %d, want 1 (the 1025th)", n)
		}
	})
}

// TestClusterSettleReceipt: a stream with cluster rules that settle sends
// one receipt id (docs/rls.md#receipts) with its admission and again with
// its settlement, 16 hexadecimal digits the service accepts, another for
// each stream; a stream whose cluster rules do not settle sends none.
func TestClusterSettleReceipt(t *testing.T) {
	cfg := strings.Replace(settleClusterCfg, "ON_ERROR", "deny", 1)
	seen := map[string]bool{}
	for i := range 3 {
		f := newFixture(t, cfg)
		st := clusterStream(t, f, true)
		st.headers("500", true) // login refunds
		st.end()
		if len(f.h.Calls) != 2 {
			t.Fatalf("stream %d: %d calls, want the admission and the settlement", i, len(f.h.Calls))
		}
		id, ok := findHeader(f.h.Calls[0].Headers, rlscontract.ReceiptHeader)
		if !ok || len(id) != 16 || !rlscontract.ValidReceipt(id) {
			t.Fatalf("stream %d: admission's receipt %q (%v), want 16 hexadecimal digits", i, id, ok)
		}
		if again, _ := findHeader(f.h.Calls[1].Headers, rlscontract.ReceiptHeader); again != id {
			t.Errorf("stream %d: settlement's receipt %q, want the admission's %q", i, again, id)
		}
		if seen[id] {
			t.Errorf("stream %d: receipt %q drawn twice", i, id)
		}
		seen[id] = true
	}

	f := newFixture(t, `{"rules":[{"name":"plain","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}}],"settings":{"rls":{"cluster":"rls"}}}`)
	f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000"))
	if len(f.h.Calls) != 1 {
		t.Fatalf("%d calls, want the admission", len(f.h.Calls))
	}
	if id, ok := findHeader(f.h.Calls[0].Headers, rlscontract.ReceiptHeader); ok {
		t.Errorf("a rule that does not settle sent receipt %q", id)
	}
}
