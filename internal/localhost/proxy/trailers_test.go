package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestResponseTrailers: an upstream that ends its response with trailers
// makes the host call proxy_on_response_trailers once, after body
// callbacks without end_of_stream, as Envoy does; the guest reads and
// edits RESPONSE_TRAILERS there, and the client gets the trailers as the
// guest left them. Without trailers the body ends with end_of_stream and
// proxy_on_response_trailers never runs. Streamed and buffered; trailers
// declared in "Trailer", set under http.TrailerPrefix, and relayed by
// ProxyTo from a real upstream.
func TestResponseTrailers(t *testing.T) {
	handler := func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("t") {
		case "declared":
			w.Header().Set("Trailer", "X-Usage")
			_, _ = io.WriteString(w, `{"usage":`)
			_, _ = io.WriteString(w, `42}`)
			w.Header().Set("X-Usage", "42")
		case "prefix":
			_, _ = io.WriteString(w, `{"usage":42}`)
			// Undeclared trailers need a chunked body: net/http would
			// give a short body a Content-Length and drop them.
			w.(http.Flusher).Flush()
			w.Header().Set(http.TrailerPrefix+"X-Usage", "42")
		case "empty-body":
			w.Header().Set("Trailer", "X-Usage")
			w.WriteHeader(200)
			w.Header().Set("X-Usage", "42")
		default:
			_, _ = io.WriteString(w, `{"usage":42}`)
		}
	}
	real := httptest.NewServer(http.HandlerFunc(handler))
	defer real.Close()
	u, _ := url.Parse(real.URL)
	upstreams := map[string]http.Handler{"in-process": http.HandlerFunc(handler), "proxied": ProxyTo(u)}
	for _, stream := range []bool{true, false} {
		for upName, up := range upstreams {
			for _, tc := range []struct {
				query, body string
				trailers    bool
			}{
				{"declared", `{"usage":42}`, true},
				{"prefix", `{"usage":42}`, true},
				{"empty-body", "", true},
				{"none", `{"usage":42}`, false},
			} {
				t.Run(upName+"/stream="+strconv.FormatBool(stream)+"/"+tc.query, func(t *testing.T) {
					h, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{Upstream: up, StreamResponses: stream})
					resp, err := srv.Client().Get(srv.URL + "/?t=" + tc.query)
					if err != nil {
						t.Fatal(err)
					}
					body, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 || string(body) != tc.body {
						t.Fatalf("got %d %q %v, want 200 %q", resp.StatusCode, body, err, tc.body)
					}
					// A streamed response reaches the client before the
					// host's last callbacks: wait for the stream's end.
					for end := time.Now().Add(30 * time.Second); h.GuestCalls()["proxy_on_delete"] == 0 && time.Now().Before(end); {
						time.Sleep(2 * time.Millisecond)
					}
					calls := h.GuestCalls()
					if calls["proxy_on_delete"] != 1 {
						t.Fatalf("proxy_on_delete ran %d times, want 1", calls["proxy_on_delete"])
					}
					eos, _ := h.Metric("test.body_eos")
					if !tc.trailers {
						if calls["proxy_on_response_trailers"] != 0 || eos != 1 || len(resp.Trailer) != 0 {
							t.Fatalf("no trailers: %d trailer callbacks, %d end_of_stream bodies, trailers %v; want 0, 1, none",
								calls["proxy_on_response_trailers"], eos, resp.Trailer)
						}
						return
					}
					if calls["proxy_on_response_trailers"] != 1 || eos != 0 {
						t.Errorf("%d trailer callbacks and %d end_of_stream bodies, want 1 and 0", calls["proxy_on_response_trailers"], eos)
					}
					if got := resp.Trailer.Get("X-Usage"); got != "42" {
						t.Errorf("trailer x-usage: got %q, want 42", got)
					}
					if got := resp.Trailer.Get("X-Trailer-Seen"); got != "42/1/0" {
						t.Errorf("trailer x-trailer-seen (value/num_trailers/status the guest saw): got %q, want 42/1/0", got)
					}
					if resp.Header.Get("X-Usage") != "" {
						t.Errorf("the trailer also came as a header")
					}
				})
			}
		}
	}
}
