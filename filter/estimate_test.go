package filter_test

import (
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
)

// bodyRule reserves pre_charge 100 at the headers and the rest of
// max_tokens when the body has arrived (burst 1000).
const bodyRule = `{"name":"llm","algorithm_config":{"rps":1,"burst":1000,"cost_source":"response_json:/usage/total_tokens",` +
	`"estimate_source":"request_json:/max_tokens"}}`

// startBody sends a request's headers (a body follows) and then its body
// in chunks, as Envoy delivers a body the filter buffers: each call sees
// everything received so far. It returns the action of every call.
func (f *fixture) startBody(chunks ...string) (*stream, []filter.Action) {
	f.h.Request, f.h.Response = filtertest.Get("/", "192.0.2.1:5000"), filtertest.Response{}
	s := f.p.NewStream()
	acts := []filter.Action{s.OnRequestHeaders(len(f.h.Request.Headers), false)}
	f.h.EndCallback()
	for i, c := range chunks {
		f.h.Request.Body = append(f.h.Request.Body, c...)
		acts = append(acts, s.OnRequestBody(len(f.h.Request.Body), i == len(chunks)-1))
		f.h.EndCallback()
	}
	return &stream{f: f, s: s}, acts
}

// TestBodyEstimateChunks: the body is held (Pause) until its end, then the
// estimate is read across the chunks and reserved; a body over
// MaxEstimateBody is let go at once and reserves the burst (issue 30: it
// kept pre_charge, so padding a prompt evaded the estimate); trailers end a body
// whose last chunk had no end_of_stream.
func TestBodyEstimateChunks(t *testing.T) {
	f := newFixture(t, bodyRule)
	st, acts := f.startBody(`{"messages":[],"max_to`, `kens":`, `700}`)
	want := []filter.Action{filter.Continue, filter.Pause, filter.Pause, filter.Continue}
	for i := range want {
		if acts[i] != want[i] {
			t.Fatalf("actions %v, want %v", acts, want)
		}
	}
	if tok, _ := f.state("tb:llm:"); tok != 300 {
		t.Errorf("after the body: %v tokens, want 300 (700 reserved)", tok)
	}
	st.end()
	if tok, _ := f.state("tb:llm:"); tok != 300 {
		t.Errorf("unreported: %v tokens, want 300 (the reservation stands)", tok)
	}

	f = newFixture(t, bodyRule)
	big := `{"messages":"` + strings.Repeat("x", filter.MaxEstimateBody) + `",`
	st, acts = f.startBody(big, `"max_tokens":700}`)
	if acts[1] != filter.Continue || len(acts) != 3 || acts[2] != filter.Continue {
		t.Fatalf("a body over MaxEstimateBody: actions %v, want it let go at once", acts)
	}
	if tok, _ := f.state("tb:llm:"); tok != 0 {
		t.Errorf("a body over MaxEstimateBody: %v tokens, want 0 (the burst reserved)", tok)
	}
	st.end()

	f = newFixture(t, bodyRule)
	f.h.Request, f.h.Response = filtertest.Get("/", "192.0.2.1:5000"), filtertest.Response{}
	s := f.p.NewStream()
	s.OnRequestHeaders(len(f.h.Request.Headers), false)
	f.h.Request.Body = []byte(`{"max_tokens":400}`)
	if act := s.OnRequestBody(len(f.h.Request.Body), false); act != filter.Pause {
		t.Fatalf("body without end_of_stream: %v, want Pause", act)
	}
	if act := s.OnRequestBody(filter.BodyEnded, true); act != filter.Continue {
		t.Fatalf("trailers: %v, want Continue", act)
	}
	if tok, _ := f.state("tb:llm:"); tok != 600 {
		t.Errorf("after trailers: %v tokens, want 600 (400 reserved)", tok)
	}
	s.OnDone()
}

// TestBodyEstimateRejected: a body whose estimate the bucket cannot pay is
// answered 429 from proxy_on_request_body, and the pre_charge its headers
// took is given back.
func TestBodyEstimateRejected(t *testing.T) {
	f := newFixture(t, bodyRule)
	first, _ := f.startBody(`{"max_tokens":800}`)
	if tok, _ := f.state("tb:llm:"); tok != 200 {
		t.Fatalf("first: %v tokens, want 200", tok)
	}
	st, acts := f.startBody(`{"max_tokens":800}`)
	if acts[0] != filter.Continue || acts[1] != filter.Pause || f.h.Response.Local == nil || f.h.Response.Local.Status != 429 {
		t.Fatalf("second: actions %v, reply %+v, want a 429 from the body", acts, f.h.Response.Local)
	}
	if tok, _ := f.state("tb:llm:"); tok != 200 {
		t.Errorf("after the refusal: %v tokens, want 200 (its pre_charge of 100 given back)", tok)
	}
	if got := f.counter("llm", filter.CounterRejected); got != 1 {
		t.Errorf("rejected: %d, want 1", got)
	}
	st.end()
	first.end()
}
