package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// splitUpstream answers every request with doc in two writes, doc[:i] and
// doc[i:], where i is the query's ?at=; with ?trailer=1 it declares an
// x-usage-final trailer and sends it after the body.
func splitUpstream(contentType, doc string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i, _ := strconv.Atoi(r.URL.Query().Get("at"))
		w.Header().Set("Content-Type", contentType)
		trailer := r.URL.Query().Get("trailer") != ""
		if trailer {
			w.Header().Set("Trailer", "X-Usage-Final")
		}
		_, _ = io.WriteString(w, doc[:i])
		_, _ = io.WriteString(w, doc[i:])
		if trailer {
			w.Header().Set("X-Usage-Final", "1")
		}
	})
}

// TestResponseCostAtEveryBoundary: a JSON usage document, and an SSE
// stream in OpenAI's shape, each cut in two at every byte boundary, reach
// the module as exactly two proxy_on_response_body callbacks with data
// (plus the empty one that ends the stream), and every split is charged
// exactly the reported tokens, once.
func TestResponseCostAtEveryBoundary(t *testing.T) {
	const burst = 1_000_000
	json := `{"id":"x","choices":[{"message":{"content":"\"usage\": {\"total_tokens\": 1}"}}],"usage":{"prompt_tokens":1,"total_tokens":42}}`
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"w\"}}],\"usage\":null}\n\n" +
		"event: chunk\r\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\r\ndata: \"total_tokens\":37}}\r\n\r\n" +
		"data: [DONE]\n\n"
	for _, tc := range []struct {
		name, source, contentType, doc string
		tokens                         float64
	}{
		{"json", "response_json:/usage/total_tokens", "application/json", json, 42},
		{"sse", "response_sse:/usage/total_tokens", "text/event-stream", sse, 37},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := `{"rules":[{"name":"llm","limit_keys":["ip:address"],"algorithm_config":{"tokens_per_second":1,"burst":` +
				strconv.Itoa(burst) + `,"cost_source":"` + tc.source + `","pre_charge":0}}]}`
			clk := wasmhost.NewFakeClock(t0) // no refill between requests
			h, srv, ms := settleHostWith(t, cfg, splitUpstream(tc.contentType, tc.doc), true, false, clk)
			c := srv.Client()
			for i := 1; i < len(tc.doc); i++ {
				before := h.GuestCalls()
				r := mustDo(t, c, srv, "/?at="+strconv.Itoa(i), nil)
				if r.status != 200 || r.body != tc.doc {
					t.Fatalf("split at %d: got %d %q", i, r.status, r.body)
				}
				waitStreamsEnded(t, h, uint64(i))
				after := h.GuestCalls()
				if got := after["proxy_on_response_body"] - before["proxy_on_response_body"]; got != 3 {
					t.Fatalf("split at %d: %d proxy_on_response_body callbacks, want 3 (doc[:%d], doc[%d:], end of stream)", i, got, i, i)
				}
				want := burst - tc.tokens*float64(i)
				if got := tokensOf(t, ms, "llm"); got != want {
					t.Fatalf("split at %d: %v tokens, want %v (%v charged each time)", i, got, want, tc.tokens)
				}
			}
			if got, want := metric(t, h, "llm", "settle_charged"), uint64(len(tc.doc)-1); got != want {
				t.Errorf("settle_charged: got %d, want %d (one per request)", got, want)
			}
		})
	}
}

// TestResponseTrailersSettleOnce: a usage body that does not end the
// stream, then trailers: the module settles in proxy_on_response_trailers,
// once (proxy_on_done and proxy_on_delete after it change nothing), and
// the client gets the body and the trailer. Streamed and buffered.
func TestResponseTrailersSettleOnce(t *testing.T) {
	const doc = `{"usage":{"total_tokens":42}}`
	cfg := fmt.Sprintf(costConfig, "response_json:/usage/total_tokens", 10)
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			clk := wasmhost.NewFakeClock(t0)
			h, srv, ms := settleHostWith(t, cfg, splitUpstream("application/json", doc), stream, false, clk)
			resp, err := srv.Client().Get(srv.URL + "/?trailer=1&at=" + strconv.Itoa(strings.Index(doc, "42")+1))
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || string(body) != doc || resp.Trailer.Get("X-Usage-Final") != "1" {
				t.Fatalf("got %d %q %v, trailer %q; want 200, the document and trailer 1", resp.StatusCode, body, err, resp.Trailer.Get("X-Usage-Final"))
			}
			waitStreamsEnded(t, h, 1)
			calls := h.GuestCalls()
			if calls["proxy_on_response_trailers"] != 1 {
				t.Errorf("proxy_on_response_trailers ran %d times, want 1", calls["proxy_on_response_trailers"])
			}
			if got := metric(t, h, "llm", "settle_charged") + metric(t, h, "llm", "settle_refunded"); got != 1 {
				t.Errorf("settlements: got %d, want 1", got)
			}
			if got := tokensOf(t, ms, "llm"); got != 58 {
				t.Errorf("tokens: got %v, want 58 (100 - 42)", got)
			}
		})
	}
}

// TestDebtWithoutPreCharge: pre_charge 0 admits only while the balance is
// positive. Burst 10, a response reporting 20: the first request is
// admitted and takes the balance to -10, carried in full (since issue 22
// pre_charge 0 is not the default, and no floor forgives a debt); the
// second is already 429 with a Retry-After of the debt over the rate; at
// a balance of exactly 0 still 429; above it, admitted.
func TestDebtWithoutPreCharge(t *testing.T) {
	up := usageUpstream(t)
	cfg := `{"rules":[{"name":"llm","limit_keys":["ip:address"],` +
		`"algorithm_config":{"tokens_per_second":1,"burst":10,"cost_source":"response_json:/usage/total_tokens","pre_charge":0}}]}`
	for _, sem := range semantics {
		t.Run(sem.name, func(t *testing.T) {
			clk := wasmhost.NewFakeClock(t0)
			h, srv, ms := settleHost(t, cfg, up, false, sem.kong, clk)
			c := srv.Client()
			if r := mustDo(t, c, srv, "/?tokens=20", nil); r.status != 200 {
				t.Fatalf("first: %d", r.status)
			}
			waitStreamsEnded(t, h, 1)
			if got := tokensOf(t, ms, "llm"); got != -10 {
				t.Fatalf("tokens: got %v, want -10", got)
			}
			r := mustDo(t, c, srv, "/?tokens=100", nil)
			ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
			if r.status != 429 || ra < 10 || ra > 15 {
				t.Fatalf("second: got %d Retry-After %q, want 429 with 10..15 (10 tokens of debt at 1/s, plus jitter)", r.status, r.header.Get("Retry-After"))
			}
			clk.Advance(10 * time.Second) // the balance is exactly 0
			if r := mustDo(t, c, srv, "/?tokens=1", nil); r.status != 429 {
				t.Fatalf("at 0: got %d, want 429", r.status)
			}
			clk.Advance(100 * time.Millisecond)
			if r := mustDo(t, c, srv, "/?tokens=1", nil); r.status != 200 {
				t.Fatalf("at 0.1: got %d, want 200", r.status)
			}
			if got := metric(t, h, "llm", "rejected"); got != 2 {
				t.Errorf("rejected: got %d, want 2", got)
			}
		})
	}
}
