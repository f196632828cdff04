package filter

import (
	"testing"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// sseCharge returns a charge that reads SSE for the pointers.
func sseCharge(t *testing.T, pointers ...string) *charge {
	t.Helper()
	spec := &config.SettleSpec{Response: config.ResponseSSE}
	for _, s := range pointers {
		p, ok := ljson.ParsePointer(s)
		if !ok {
			t.Fatal(s)
		}
		spec.Pointers = append(spec.Pointers, p)
	}
	c := &charge{r: &rule{Rule: &config.Rule{Settle: spec, Cost: config.CostSource{Default: 5}}}, body: true, scanning: true}
	n := len(pointers)
	c.scans, c.last, c.have = make([]ljson.PointerScanner, n), make([]float64, n), make([]bool, n)
	for k := range c.scans {
		c.scans[k].Reset(spec.Pointers[k])
	}
	return c
}

// TestSSEAtEveryBoundary feeds event streams split at every pair of
// offsets: the cost is the same however the body arrives.
func TestSSEAtEveryBoundary(t *testing.T) {
	tests := []struct {
		name     string
		pointers []string
		stream   string
		want     float64
	}{
		{"openai", []string{"/usage/total_tokens"},
			"data: {\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"total_tokens\":42}}\n\ndata: [DONE]\n\n", 42},
		{"last event wins", []string{"/u"}, "data: {\"u\":1}\n\ndata: {\"u\":2}\n\n", 2},
		{"crlf and multi-line data", []string{"/u"}, "event: x\r\ndata: {\"a\":1,\r\ndata:\"u\":7}\r\n\r\n", 7},
		{"cr only", []string{"/u"}, "data: {\"u\":3}\r\rdata: [DONE]\r\r", 3},
		{"comments and other fields", []string{"/u"}, ": keep-alive\nid: 5\nretry: 100\ndata: {\"u\":9}\n\n", 9},
		{"data field without colon is an empty line", []string{"/u"}, "data\ndata: {\"u\":4}\n\n", 4},
		{"not data: a field named dat", []string{"/u"}, "dat: {\"u\":4}\n\n", 5},
		{"anthropic", []string{"/message/usage/input_tokens", "/usage/output_tokens"},
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":10}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n", 40},
		{"no usage", []string{"/u"}, "data: {\"x\":1}\n\n", 5},
		{"last event without its blank line", []string{"/u"}, "data: {\"u\":1}\n\ndata: {\"u\":6}", 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := []byte(tt.stream)
			for i := 0; i <= len(b); i++ {
				for j := i; j <= len(b); j += 1 + len(b)/9 {
					c := sseCharge(t, tt.pointers...)
					c.feed(b[:i])
					c.feed(b[i:j])
					c.feed(b[j:])
					if got := c.result(); got != tt.want {
						t.Fatalf("split at %d and %d: got %v, want %v", i, j, got, tt.want)
					}
				}
			}
		})
	}
}

func TestParseReported(t *testing.T) {
	for in, want := range map[string]float64{"5": 5, " 2.5 ": 2.5, "0": 0, "0.0": 0, "00": 0} {
		if got, ok := parseReported(in); !ok || got != want {
			t.Errorf("%q: got %v %v, want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "-1", "0.", ".0", "1e3", "x", "0x0", "0.0.0"} {
		if _, ok := parseReported(in); ok {
			t.Errorf("%q: accepted", in)
		}
	}
}
