package e2e

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Issue 30, smaller defects, through the module: the counters of a rule
// that takes its estimate from the request body, and bodies an OpenAI-style
// upstream reads as "max_tokens": 500 that the scanner did not.

// bodyEstimateRule: burst 1000 (the ceiling), pre_charge 100, the estimate
// at /max_tokens, the usage at /usage/total_tokens.
const bodyEstimateRule = `{"name":"llm","algorithm_config":{"tokens_per_second":10,"burst":1000,` +
	`"cost_source":"response_json:/usage/total_tokens","estimate_source":"request_json:/max_tokens"}}`

// usage500 answers every request at once with a usage of 500 tokens.
var usage500 = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"id":"x","usage":{"total_tokens":500}}`)
})

// TestBodyEstimateCountedOnce: one request admitted with its body's
// estimate (800), one refused at the body (429: 500 left after the first
// settled, 800 asked), one without a body. Enforced, the rule counts
// allowed 2 and rejected 1. In shadow mode every request is answered 200;
// the shadow bucket keeps what the refused request's headers took (100,
// charged up to its usage of 500 when it settles), so the request without
// a body would be refused too: allowed 1, shadow_rejected 2. It used to
// count allowed 3 in both (the refused request at its headers, the
// admitted one in shadow mode at its headers and its body).
func TestBodyEstimateCountedOnce(t *testing.T) {
	shadow := `{"bundle_version":1,"policies":[{"id":"watch","spec":{"mode":"shadow","rules":[` + bodyEstimateRule + `]}}]}`
	for _, tt := range []struct {
		name, cfg      string
		statuses       [3]int
		allowed, other int64
		otherName      string
	}{
		{"enforced", `{"rules":[` + bodyEstimateRule + `]}`, [3]int{200, 429, 200}, 2, 1, "rejected"},
		{"shadow", shadow, [3]int{200, 200, 200}, 1, 2, "shadow_rejected"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, srv, _ := settleHostWith(t, tt.cfg, usage500, true, false, wasmhost.NewFakeClock(t0))
			c := srv.Client()
			for i, body := range []string{`{"max_tokens":800}`, `{"max_tokens":800}`, ""} {
				r, err := doBody(c, srv, "/v1/chat/completions", nil, body)
				if err != nil || r.status != tt.statuses[i] {
					t.Fatalf("request %d: %d %v, want %d", i+1, r.status, err, tt.statuses[i])
				}
			}
			waitStreamsEnded(t, h, 3)
			if v, _ := h.Metric("tokengate.rule.llm.allowed"); int64(v) != tt.allowed {
				t.Errorf("allowed %d, want %d", v, tt.allowed)
			}
			if v, _ := h.Metric("tokengate.rule.llm." + tt.otherName); int64(v) != tt.other {
				t.Errorf("%s %d, want %d", tt.otherName, v, tt.other)
			}
		})
	}
}

// evasionBodies are the ways of writing "max_tokens": 500 that
// Python's json and pydantic read, with the request headers they need and
// what one of them reserves on bodyEstimateRule: the 500 when the module
// reads it, the ceiling (the burst) when it cannot.
func evasionBodies() []struct {
	name    string
	header  map[string]string
	body    string
	reserve float64
} {
	const plain = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte(plain))
	_ = zw.Close()
	u16 := []byte{0xff, 0xfe} // UTF-16LE with its byte order mark
	for _, c := range utf16.Encode([]rune(plain)) {
		u16 = append(u16, byte(c), byte(c>>8))
	}
	return []struct {
		name    string
		header  map[string]string
		body    string
		reserve float64
	}{
		{"the number as a string", nil, `{"model":"m","max_tokens":"500"}`, 500},
		{"a UTF-8 byte order mark", nil, "\xef\xbb\xbf" + plain, 500},
		{"a number longer than 40 characters", nil, `{"max_tokens":500.` + strings.Repeat("0", 45) + `}`, 1000},
		{"nesting past 512", nil, `{"x":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `,"max_tokens":500}`, 1000},
		{"UTF-16", nil, string(u16), 1000},
		{"gzip", map[string]string{"content-encoding": "gzip"}, gz.String(), 1000},
		{"the key in upper case", nil, `{"model":"m","MAX_TOKENS":500}`, 500},
		{"the key with a Kelvin sign", nil, "{\"max_to\u212aens\":500}", 500},
		{"the larger of two spellings first", nil, `{"Max_Tokens":500,"max_tokens":1}`, 500},
	}
}

// TestBodyEstimateDisguisedReservation: one request of each disguise
// reserves its 500, or the burst, while in flight; each used to reserve
// pre_charge (100).
func TestBodyEstimateDisguisedReservation(t *testing.T) {
	for _, d := range evasionBodies() {
		t.Run(d.name, func(t *testing.T) {
			up := &gateUpstream{open: make(chan struct{})}
			h, srv, ms := settleHostWith(t, `{"rules":[`+bodyEstimateRule+`]}`, up, true, false, wasmhost.NewFakeClock(t0))
			done := make(chan response, 1)
			go func() {
				r, err := doBody(srv.Client(), srv, "/v1/chat/completions", d.header, d.body)
				if err != nil {
					r.status = -1
				}
				done <- r
			}()
			waitFor(t, func() bool { return up.arrived.Load() == 1 })
			if b, ok := findBucket(t, ms, "llm", ""); !ok || b.tokens != 1000-d.reserve {
				t.Errorf("in flight: tokens %v, want %v (%v reserved)", b.tokens, 1000-d.reserve, d.reserve)
			}
			close(up.open)
			if r := <-done; r.status != 200 {
				t.Fatalf("got %d, want 200", r.status)
			}
			waitStreamsEnded(t, h, 1)
		})
	}
}

// TestBodyEstimateEvasionBounded is the attack: 10 requests at once
// with max_tokens 500 disguised each way, against a burst of 1000, each
// answered with a usage of 500. The module admits no more than the burst
// covers, and charges each admitted request its 500 in full. It used to
// admit all 10 and spend 5000.
func TestBodyEstimateEvasionBounded(t *testing.T) {
	for _, d := range evasionBodies() {
		t.Run(d.name, func(t *testing.T) {
			up := &gateUpstream{open: make(chan struct{})}
			h, srv, ms := settleHostWith(t, `{"rules":[`+bodyEstimateRule+`]}`, up, true, false, wasmhost.NewFakeClock(t0))
			got := parallelAttackBody(t, h, srv, up, 10, d.header, d.body)
			if spent := 500 * float64(got); got < 1 || spent > 1000 {
				t.Errorf("admitted %d of 10: %v tokens spent against a burst of 1000", got, spent)
			}
			if b, ok := findBucket(t, ms, "llm", ""); !ok || b.tokens != 1000-500*float64(got) {
				t.Errorf("tokens %v, want %v: every admitted request charged its 500", b.tokens, 1000-500*float64(got))
			}
		})
	}
}
