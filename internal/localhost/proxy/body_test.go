package proxy

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestRequestBodyAfterContinue: a request paused in
// proxy_on_request_headers is held while its body is still being sent
// (the host reads none of it), and the filter gets the body in
// proxy_on_request_body only after proxy_continue_stream, as Envoy
// delivers what it buffered to the filter that stopped iteration; the
// headers callback was told a body follows.
func TestRequestBodyAfterContinue(t *testing.T) {
	var mu sync.Mutex
	var calls []wasmhost.Call
	h, srv := newGuestHost(t, wasmhost.Options{Workers: 1, DisableTicks: true, Observe: func(c wasmhost.Call) {
		mu.Lock()
		calls = append(calls, c)
		mu.Unlock()
	}}, Options{})
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 5
	req.Header.Set("x-test", "tick-resume")
	got := make(chan reply, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Error(err)
			got <- reply{}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	// Held with no byte of the body sent: the host did not wait for it.
	waitFor(t, "the held request", func() bool { return h.TickPeriod(0) != 0 })
	if _, err := pw.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if err := h.Tick(); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.status != 200 || r.header.Get("X-Result") != "ticked,body=hello/0,reqmap=0" {
		t.Fatalf("got %d %q, want 200 with the body seen after the tick resumed it", r.status, r.header.Get("X-Result"))
	}
	mu.Lock()
	defer mu.Unlock()
	var order []string
	for _, c := range calls {
		switch {
		case c.Name == "proxy_on_request_headers":
			order = append(order, "headers eos="+string(rune('0'+c.Args[2])))
		case c.Name == "proxy_continue_stream", c.Name == "proxy_on_request_body":
			order = append(order, c.Name)
		}
	}
	if strings.Join(order, ",") != "headers eos=0,proxy_continue_stream,proxy_on_request_body" {
		t.Errorf("order %v, want the headers (a body follows), the continue, then the body", order)
	}
}

// TestRequestBodyTooLarge: a body over the host's bound, read once the
// filter lets the request go on, becomes a 413 the response callbacks see.
func TestRequestBodyTooLarge(t *testing.T) {
	_, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{})
	r := do(t, srv, "POST", "/", map[string]string{"x-test": "none"}, strings.Repeat("x", maxRequestBody+1))
	if r.status != http.StatusRequestEntityTooLarge || r.header.Get("X-Status-Seen") != "413" {
		t.Errorf("got %d, x-status-seen %q; want 413 through the response callbacks", r.status, r.header.Get("X-Status-Seen"))
	}
}
