package filter_test

import (
	"bytes"
	"compress/gzip"
	"errors"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// Issue 30, smaller defects: the counters of a rule that takes its estimate
// from the request body, and bodies an OpenAI-style upstream reads as
// "max_tokens": 500 that the scanner did not.

// sendBody runs a request's headers (a body follows, with the extra
// headers, name then value) and then body in one chunk, and returns the
// action of the body (of the headers, if they did not go on).
func (f *fixture) sendBody(headers []string, body string) (*stream, filter.Action) {
	f.h.Request, f.h.Response = filtertest.Get("/", "192.0.2.1:5000", headers...), filtertest.Response{}
	s := f.p.NewStream()
	act := s.OnRequestHeaders(len(f.h.Request.Headers), false)
	f.h.EndCallback()
	if act != filter.Continue {
		return &stream{f: f, s: s}, act
	}
	f.h.Request.Body = []byte(body)
	act = s.OnRequestBody(len(body), true)
	f.h.EndCallback()
	return &stream{f: f, s: s}, act
}

// respond answers an admitted stream with a usage of n tokens and ends it.
func (st *stream) respond(n string) {
	st.headers("200", false, [2]string{"content-type", "application/json"})
	st.body(`{"usage":{"total_tokens":`+n+`}}`, true)
	st.end()
}

// shadowBodyRule is bodyRule in a policy in shadow mode.
const shadowBodyRule = `{"bundle_version":1,"policies":[{"id":"watch","spec":{"mode":"shadow","rules":[` + bodyRule + `]}}]}`

// TestBodyEstimateCountsOnce: a rule awaiting its estimate from the body
// counts each request once, when the body has been read
// (docs/observability.md): allowed for one admitted, only rejected for one
// refused at the body, only fail_open or store_denied for one whose body's
// take failed; shadow rules allowed or shadow_rejected. A request without a
// body is counted at its headers. It used to count allowed at the headers
// and again (shadow) or rejected (enforced) at the body.
func TestBodyEstimateCountsOnce(t *testing.T) {
	type counts struct{ allowed, rejected, shadowRejected, failOpen, storeDenied int64 }
	tests := []struct {
		name, cfg string
		// fault, if set, fails the store's writes from the body on.
		fault  string
		bodies []string
		want   counts
	}{
		{"enforced: admitted, refused at the body, under pre_charge", bodyRule, "",
			[]string{`{"max_tokens":800}`, `{"max_tokens":800}`, `{"max_tokens":50}`}, counts{allowed: 2, rejected: 1}},
		{"enforced: the body's take fails open", bodyRule, "allow",
			[]string{`{"max_tokens":800}`}, counts{failOpen: 1}},
		{"enforced: the body's take denied", strings.Replace(bodyRule, `"name":"llm",`, `"name":"llm","on_store_error":"deny",`, 1), "deny",
			[]string{`{"max_tokens":800}`}, counts{storeDenied: 1}},
		{"enforced: a body too large reserves the burst", bodyRule, "",
			[]string{`{"m":"` + strings.Repeat("x", filter.MaxEstimateBody) + `"}`}, counts{allowed: 1}},
		{"shadow: admitted, refused at the body, under pre_charge", shadowBodyRule, "",
			[]string{`{"max_tokens":800}`, `{"max_tokens":800}`, `{"max_tokens":50}`}, counts{allowed: 2, shadowRejected: 1}},
		{"shadow: the body's take fails", shadowBodyRule, "allow",
			[]string{`{"max_tokens":800}`}, counts{failOpen: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.cfg)
			for i, body := range tt.bodies {
				f.h.Request, f.h.Response = filtertest.Get("/", "192.0.2.1:5000"), filtertest.Response{}
				s := f.p.NewStream()
				if act := s.OnRequestHeaders(len(f.h.Request.Headers), false); act != filter.Continue {
					t.Fatalf("request %d: headers %v", i, act)
				}
				f.h.EndCallback()
				if tt.fault != "" {
					f.h.Store = &sharedstatetest.FaultStore{Store: f.mem(), SetErr: func(string, []byte, uint32) error { return errors.New("injected") }}
				}
				f.h.Request.Body = []byte(body)
				s.OnRequestBody(len(body), true)
				f.h.EndCallback()
				st := &stream{f: f, s: s}
				if f.h.Response.Local == nil {
					defer st.respond("0") // in flight until the end
				} else {
					st.end()
				}
			}
			got := counts{
				allowed:        f.counter("llm", filter.CounterAllowed),
				rejected:       f.counter("llm", filter.CounterRejected),
				shadowRejected: f.counter("llm", filter.CounterShadowRejected),
				failOpen:       f.counter("llm", filter.CounterFailOpen),
				storeDenied:    f.counter("llm", filter.CounterStoreDenied),
			}
			if got != tt.want {
				t.Errorf("counters %+v, want %+v", got, tt.want)
			}
		})
	}

	// A request without a body is counted at its headers.
	f := newFixture(t, bodyRule)
	f.get()
	if got := f.counter("llm", filter.CounterAllowed); got != 1 {
		t.Errorf("without a body: allowed %d, want 1", got)
	}
}

// gzipped returns s compressed with gzip.
func gzipped(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return b.String()
}

// utf16Of returns s in UTF-16, little- or big-endian, with or without a
// byte order mark.
func utf16Of(s string, big, bom bool) string {
	u := utf16.Encode([]rune(s))
	if bom {
		u = append([]uint16{0xFEFF}, u...)
	}
	b := make([]byte, 0, 2*len(u))
	for _, c := range u {
		if big {
			b = append(b, byte(c>>8), byte(c))
		} else {
			b = append(b, byte(c), byte(c>>8))
		}
	}
	return string(b)
}

// disguise is one way of writing "max_tokens": 500 that Python's json and
// pydantic (an OpenAI-style upstream) read, and the reservation it must
// make on bodyRule (burst 1000, pre_charge 100): the 500 when the scanner
// reads it, the ceiling (the burst) when it cannot.
type disguise struct {
	name    string
	headers []string
	body    string
	reserve float64
}

const plain = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`

var disguises = []disguise{
	{"the number as a string", nil, `{"model":"m","max_tokens":"500"}`, 500},
	{"the number as a string with an exponent", nil, `{"max_tokens":"5e2"}`, 500},
	{"the number as an escaped string", nil, `{"max_tokens":"\u0035\u0030\u0030"}`, 500},
	{"a UTF-8 byte order mark", nil, "\xef\xbb\xbf" + plain, 500},
	{"NaN before a repeated key", nil, `{"max_tokens":1,"temperature":NaN,"top_p":-Infinity,"max_tokens":500}`, 500},
	{"a number longer than 40 characters", nil, `{"max_tokens":500.` + strings.Repeat("0", 45) + `}`, 1000},
	{"a string that holds no number", nil, `{"max_tokens":"500 "}`, 1000},
	{"nesting past 512", nil, `{"x":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `,"max_tokens":500}`, 1000},
	{"UTF-16LE", nil, utf16Of(plain, false, false), 1000},
	{"UTF-16BE with a byte order mark", nil, utf16Of(plain, true, true), 1000},
	{"UTF-16LE with a byte order mark", nil, utf16Of(plain, false, true), 1000},
	{"gzip", []string{"content-encoding", "gzip"}, gzipped(plain), 1000},
	{"deflate named on a plain body", []string{"content-encoding", "deflate"}, plain, 1000},
	// Go's encoding/json (an upstream in Go) matches keys without regard
	// to case, and keeps the last of repeated keys; others keep the first.
	{"the key in upper case", nil, `{"model":"m","MAX_TOKENS":500}`, 500},
	{"the key in mixed case", nil, `{"Max_Tokens":500}`, 500},
	{"the key with a Kelvin sign", nil, `{"max_to\u212aens":500}`, 500},
	{"the larger of repeated keys first", nil, `{"max_tokens":500,"max_tokens":1}`, 500},
	{"the larger of two spellings first", nil, `{"MAX_TOKENS":500,"max_tokens":1}`, 500},
}

// TestBodyEstimateDisguised: each disguise reserves its 500, or the burst
// when the scanner cannot read it; each used to keep pre_charge (100).
func TestBodyEstimateDisguised(t *testing.T) {
	for _, d := range disguises {
		t.Run(d.name, func(t *testing.T) {
			f := newFixture(t, bodyRule)
			st, act := f.sendBody(d.headers, d.body)
			if act != filter.Continue || f.h.Response.Local != nil {
				t.Fatalf("action %v, reply %+v: want it admitted", act, f.h.Response.Local)
			}
			if tok, _ := f.state("tb:llm:"); tok != 1000-d.reserve {
				t.Errorf("in flight: %v tokens, want %v (%v reserved)", tok, 1000-d.reserve, d.reserve)
			}
			st.respond("500")
			if tok, _ := f.state("tb:llm:"); tok != 500 {
				t.Errorf("settled: %v tokens, want 500", tok)
			}
		})
	}
}

// TestBodyEstimateEvasionHostile is the attack: 10 requests at once
// with max_tokens 500, disguised each way, against a burst of 1000, each
// answered with a usage of 500. At most what the burst covers may be
// admitted; it used to admit all 10 and spend 5000.
func TestBodyEstimateEvasionHostile(t *testing.T) {
	for _, d := range disguises {
		t.Run(d.name, func(t *testing.T) {
			f := newFixture(t, bodyRule)
			var admitted []*stream
			for i := 0; i < 10; i++ {
				st, act := f.sendBody(d.headers, d.body)
				if act == filter.Continue && f.h.Response.Local == nil {
					admitted = append(admitted, st)
				} else {
					st.end()
				}
			}
			for _, st := range admitted {
				st.respond("500")
			}
			spent := 500 * float64(len(admitted))
			if spent > 1000 {
				t.Errorf("admitted %d of 10: %v tokens spent against a burst of 1000", len(admitted), spent)
			}
			if tok, _ := f.state("tb:llm:"); tok != 1000-spent {
				t.Errorf("tokens %v, want %v", tok, 1000-spent)
			}
		})
	}
}
