package filter_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// stream drives one stream by hand through the fixture's plugin.
type stream struct {
	f *fixture
	s *filter.Stream
}

func (f *fixture) start(headers ...string) (*stream, filtertest.Result) {
	f.h.Request, f.h.Response = filtertest.Get("/", "192.0.2.1:5000", headers...), filtertest.Response{}
	s := f.p.NewStream()
	act := s.OnRequestHeaders(len(f.h.Request.Headers), true)
	f.h.EndCallback()
	return &stream{f: f, s: s}, filtertest.Result{RequestAction: act, Response: f.h.Response}
}

func (st *stream) headers(status string, eos bool, extra ...[2]string) {
	h := st.f.h
	h.Response.Headers = append([][2]string{{":status", status}}, extra...)
	st.s.OnResponseHeaders(len(h.Response.Headers), eos)
	h.EndCallback()
}

func (st *stream) body(chunk string, eos bool) {
	h := st.f.h
	h.Request.BodyChunk = []byte(chunk)
	if act := st.s.OnResponseBody(len(chunk), eos); act != filter.Continue {
		st.f.t.Fatalf("proxy_on_response_body: got %v, want Continue", act)
	}
	h.EndCallback()
}

// end runs every way a host may end a stream, in order, more than once.
func (st *stream) end() {
	st.s.OnResponseTrailers(0)
	st.s.OnDone()
	st.s.OnDone()
	st.s.Release()
}

func TestSettleExactlyOnce(t *testing.T) {
	const cfg = `{"name":"llm","algorithm_config":{"rps":1,"burst":100,"cost_source":"response_json:/usage/total_tokens","pre_charge":10}}`
	f := newFixture(t, cfg)
	st, res := f.start()
	if res.RequestAction != filter.Continue {
		t.Fatal("not admitted")
	}
	if tok, _ := f.state("tb:llm:"); tok != 90 {
		t.Fatalf("after admission: %v tokens, want 90", tok)
	}
	st.headers("200", false)
	doc := `{"usage":{"total_tokens":33}}`
	for i := 0; i < len(doc); i += 4 {
		st.body(doc[i:min(i+4, len(doc))], false)
	}
	st.body("", true)
	st.end()
	if tok, _ := f.state("tb:llm:"); tok != 67 {
		t.Errorf("settled: %v tokens, want 67", tok)
	}
	if got := f.counter("llm", filter.CounterSettleCharged); got != 1 {
		t.Errorf("settle_charged: got %d, want 1", got)
	}
}

// TestResponseCostNeedsAPositiveBalance: with pre_charge 0 a request is
// admitted only while the balance is above zero: burst 10 and responses
// that report 100 each admit one request, which leaves a debt of the full
// 100 (carried, never forgiven: max_debt, which set a floor, is refused
// since issue 22), then 429 until the refill has repaid it; at exactly 0
// too. With a pre_charge the next request needs that much again, after
// the debt is repaid in full.
func TestResponseCostNeedsAPositiveBalance(t *testing.T) {
	const cfg = `{"name":"llm","algorithm_config":{"rps":1,"burst":10,"cost_source":"response_header:x-usage"%s}}`
	report := func(f *fixture) filter.Action {
		st, res := f.start()
		if res.RequestAction == filter.Continue {
			st.headers("200", true, [2]string{"x-usage", "100"})
		}
		st.end()
		return res.RequestAction
	}
	f := newFixture(t, strings.Replace(cfg, "%s", `,"pre_charge":0`, 1))
	if report(f) != filter.Continue {
		t.Fatal("first request rejected")
	}
	if tok, _ := f.state("tb:llm:"); tok != -90 {
		t.Fatalf("after 100 reported: %v tokens, want -90 (10 - 100, carried in full)", tok)
	}
	for i := 0; i < 5; i++ {
		if report(f) == filter.Continue {
			t.Fatalf("request %d in debt admitted", i+2)
		}
		f.now += 1
	}
	// 5 s later the balance is -85; 85 more bring it to exactly 0: still no.
	f.now += 85
	if tok, _ := f.state("tb:llm:"); tok != -90 {
		t.Fatalf("rejections took tokens: %v, want -90", tok)
	}
	if res := f.get(); res.RequestAction == filter.Continue || res.Response.Local == nil || res.Response.Local.Status != 429 {
		t.Fatalf("at a balance of 0: got %v %+v, want 429", res.RequestAction, res.Response.Local)
	}
	f.now += 0.001
	if report(f) != filter.Continue {
		t.Fatal("a positive balance (0.001) rejected")
	}

	// A pre_charge: admission takes 5, a report of 100 charges 95 more
	// (the balance is 10 - 100), and the next request needs 5 again.
	f = newFixture(t, strings.Replace(cfg, "%s", `,"pre_charge":5`, 1))
	if report(f) != filter.Continue {
		t.Fatal("first request rejected")
	}
	if tok, _ := f.state("tb:llm:"); tok != -90 {
		t.Fatalf("after 100 reported: %v tokens, want -90", tok)
	}
	f.now += 94.9
	if report(f) == filter.Continue {
		t.Fatal("4.9 tokens admitted a pre_charge of 5")
	}
	f.now += 0.1
	if report(f) != filter.Continue {
		t.Fatal("5 tokens rejected a pre_charge of 5")
	}
}

func TestSettleWithoutResponse(t *testing.T) {
	f := newFixture(t, `{"rules":[{"name":"login","match":{"header:x-r":"login"},"algorithm_config":{"rps":1,"burst":5,"count_statuses":[401]}},`+
		`{"name":"llm","match":{"header:x-r":"llm"},"algorithm_config":{"rps":1,"burst":100,"cost_source":"response_sse:/u","default_cost":7,"pre_charge":0}}]}`)
	st, _ := f.start("x-r", "login")
	st.end() // the client left before the response: the cost stands
	if tok, _ := f.state("tb:login:"); tok != 4 {
		t.Errorf("login: %v tokens, want 4", tok)
	}
	st, _ = f.start("x-r", "llm")
	st.headers("200", false)
	st.body("data: {\"u\":", false)
	st.end() // reset mid-event: nothing complete was reported
	if tok, _ := f.state("tb:llm:"); tok != 93 {
		t.Errorf("llm: %v tokens, want 93 (default_cost)", tok)
	}
	// Headers that end the stream settle at once; a 200 is refunded.
	st, _ = f.start("x-r", "login")
	st.headers("200", true)
	if tok, _ := f.state("tb:login:"); tok != 4 {
		t.Errorf("login after a 200: %v tokens, want 4", tok)
	}
	st.end()
}

func TestInFlightReleasedOnEveryPath(t *testing.T) {
	f := newFixture(t, `{"rules":[{"name":"cc","algorithm":"concurrency","algorithm_config":{"max_in_flight":2}}],"settings":{"rule_headers":true}}`)
	count := func() int64 {
		v := f.raw("cc:cc:")
		cur, prev, _, _, err := sharedstate.ParseInFlight([]byte(v))
		if err != nil {
			t.Fatalf("%q: %v", v, err)
		}
		return cur + prev
	}
	a, _ := f.start()
	b, _ := f.start()
	c, res := f.start()
	if res.Local == nil || res.Local.Status != 429 || res.Header("x-tokengate-reason") != filter.ReasonConcurrency {
		t.Fatalf("third: got %+v, want 429 concurrency_limit", res.Local)
	}
	c.end() // held nothing: releases nothing
	if n := count(); n != 2 {
		t.Fatalf("in flight: %d, want 2", n)
	}
	a.headers("200", false)
	a.body("x", true) // the end of the body releases
	if n := count(); n != 1 {
		t.Fatalf("after a's body: %d, want 1", n)
	}
	a.end()
	b.s.Release() // a host that never called proxy_on_done
	if n := count(); n != 0 {
		t.Fatalf("after b's delete: %d, want 0", n)
	}
	// The lease: a place never released is dropped two periods later.
	d, _ := f.start()
	_ = d
	f.now += 2 * 600
	e, res := f.start()
	if res.Local != nil || count() != 1 {
		t.Fatalf("after the lease: %+v, %d in flight, want admitted with 1", res.Local, count())
	}
	e.end()
}

// TestInFlightStoreFailure: a concurrency rule fails open when the shared
// data fails, or answers 503 with on_store_error deny; a corrupt counter
// is taken over.
func TestInFlightStoreFailure(t *testing.T) {
	for _, deny := range []bool{false, true} {
		ose := map[bool]string{false: "allow", true: "deny"}[deny]
		f := newFixture(t, `{"rules":[{"name":"cc","on_store_error":"`+ose+`","algorithm":"concurrency","algorithm_config":{"max_in_flight":1}}]}`)
		mem := f.mem()
		f.h.Store = &sharedstatetest.FaultStore{Store: mem, GetErr: func(string) error { return errors.New("boom") }}
		_, res := f.start()
		switch {
		case deny && (res.Local == nil || res.Local.Status != 503):
			t.Errorf("deny: got %+v, want 503", res.Local)
		case !deny && res.Local != nil:
			t.Errorf("allow: got %+v, want through", res.Local)
		}
		want := map[bool]string{false: filter.CounterFailOpen, true: filter.CounterStoreDenied}[deny]
		if got := f.counter("cc", want); got != 1 {
			t.Errorf("%s: got %d, want 1", want, got)
		}
		f.h.Store = mem
	}
	f := newFixture(t, `{"rules":[{"name":"cc","algorithm":"concurrency","algorithm_config":{"max_in_flight":1}}]}`)
	f.put("cc:cc:", "garbage")
	st, res := f.start()
	if res.Local != nil {
		t.Fatalf("corrupt counter: got %+v, want admitted", res.Local)
	}
	st.end()
	if v := f.raw("cc:cc:"); !strings.HasPrefix(v, "0:0:") {
		t.Errorf("after release: %q, want nothing in flight", v)
	}
}

// llmRule is issue 22's rule: 10 tokens a second, a burst of 1000, the
// cost the usage object of a JSON body reports, everything else default.
const llmRule = `{"name":"llm","algorithm_config":{"tokens_per_second":10,"burst":1000,"cost_source":"response_json:/usage/total_tokens"%s}}`

// TestParallelResponseCostReserves is issue 22, item 1: 200 requests in
// flight at once, each reporting 500 tokens. Each reserves an estimate at
// admission (a tenth of the burst by default, or what the request states),
// so the requests in flight are counted against the bucket; each is then
// charged in full, the debt carried, not forgiven. It used to admit all
// 200 and stop the debt at -1000.
func TestParallelResponseCostReserves(t *testing.T) {
	for _, tt := range []struct {
		name, extra string
		headers     []string
		admitted    int
	}{
		{"default reservation", "", nil, 10},
		{"estimate header", `,"estimate_source":"header:x-max-tokens"`, []string{"x-max-tokens", "500"}, 2},
		{"estimate below pre_charge", `,"estimate_source":"header:x-max-tokens"`, []string{"x-max-tokens", "1"}, 10},
		{"estimate above burst", `,"estimate_source":"header:x-max-tokens","pre_charge":1`, []string{"x-max-tokens", "5000"}, 1},
		{"estimate not a number", `,"estimate_source":"header:x-max-tokens","pre_charge":1`, []string{"x-max-tokens", "-5"}, 200},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, strings.Replace(llmRule, "%s", tt.extra, 1))
			var in []*stream
			for i := 0; i < 200; i++ {
				st, res := f.start(tt.headers...)
				if res.RequestAction == filter.Continue {
					in = append(in, st)
				} else {
					st.end()
				}
			}
			if len(in) != tt.admitted {
				t.Fatalf("admitted %d of 200 in flight, want %d", len(in), tt.admitted)
			}
			for _, st := range in {
				st.headers("200", false)
				st.body(`{"usage":{"total_tokens":500}}`, true)
				st.end()
			}
			if tok, _ := f.state("tb:llm:"); tok != 1000-500*float64(tt.admitted) {
				t.Errorf("after settling: %v tokens, want %v (every admitted request charged in full)", tok, 1000-500*tt.admitted)
			}
		})
	}
}

// TestUnreportedUsageCostsTheReservation is issue 22, item 2: a request
// whose usage is never seen (the client left an SSE stream before the usage
// event, the body came compressed) is charged what it reserved, not
// default_cost (1); strip_accept_encoding asks the upstream for a body that
// can be read.
func TestUnreportedUsageCostsTheReservation(t *testing.T) {
	t.Run("client left the stream", func(t *testing.T) {
		f := newFixture(t, `{"name":"llm","algorithm_config":{"tokens_per_second":10,"burst":1000,"cost_source":"response_sse:/usage/total_tokens","estimate_source":"header:x-max-tokens"}}`)
		st, _ := f.start("x-max-tokens", "500")
		st.headers("200", false, [2]string{"content-type", "text/event-stream"})
		st.body("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n", false)
		st.end()
		if tok, _ := f.state("tb:llm:"); tok != 500 {
			t.Errorf("%v tokens, want 500 (the reservation stands)", tok)
		}
	})
	for _, tt := range []struct {
		name, extra string
		want        float64
		ae          string
	}{
		{"compressed body", "", 900, "gzip"},
		{"compressed body, default_cost above the reservation", `,"default_cost":300`, 700, "gzip"},
		{"strip_accept_encoding", `,"strip_accept_encoding":true`, 900, "identity"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, strings.Replace(llmRule, "%s", tt.extra, 1))
			st, _ := f.start("accept-encoding", "gzip")
			if v, _ := f.h.RequestHeader("accept-encoding"); v != tt.ae {
				t.Errorf("accept-encoding upstream: %q, want %q", v, tt.ae)
			}
			st.headers("200", false, [2]string{"content-encoding", "gzip"})
			st.body("\x1f\x8b\x08\x00", true)
			st.end()
			if tok, _ := f.state("tb:llm:"); tok != tt.want {
				t.Errorf("%v tokens, want %v", tok, tt.want)
			}
		})
	}
}
