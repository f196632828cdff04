package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

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

// rssKB reads a field of /proc/self/status (VmRSS, VmHWM) in KiB.
func rssKB(t *testing.T, field string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			if err != nil {
				t.Fatalf("%s: %q", field, line)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// stalledBody starts a request whose chunked body sends size bytes and
// then nothing, never ending; it returns the answer (status -1 when the
// request failed) and a func that ends the body.
func stalledBody(t *testing.T, srv *httptest.Server, size int) (<-chan reply, func()) {
	t.Helper()
	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("x-test", "none")
	go func() {
		chunk := make([]byte, 64<<10)
		for sent := 0; sent < size; sent += len(chunk) {
			if _, err := pw.Write(chunk[:min(len(chunk), size-sent)]); err != nil {
				return // the proxy stopped reading
			}
		}
	}()
	got := make(chan reply, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err != nil {
			got <- reply{status: -1, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got <- reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
	}()
	return got, func() { pw.Close() }
}

// TestRequestBodiesBounded: 16 request bodies of 15 MiB that never end,
// at once, are each answered 413 once they pass the buffer limit (Envoy's
// per_connection_buffer_limit_bytes, 1 MiB by default), and the process's
// peak RSS grows by far less than what they send (240 MiB). Before (issue
// 30), the host read up to 16 MiB of each and waited for the rest: RSS 77
// → 354 MB in tokengate-local.
func TestRequestBodiesBounded(t *testing.T) {
	_, srv := newGuestHost(t, wasmhost.Options{Workers: 2}, Options{})
	runtime.GC()
	before := rssKB(t, "VmRSS")
	// Reset the peak to the current RSS (Linux's clear_refs 5); without
	// it the peak so far stands, which only makes the bound looser.
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	const n, size = 16, 15 << 20
	var answers []<-chan reply
	for range n {
		got, end := stalledBody(t, srv, size)
		t.Cleanup(end)
		answers = append(answers, got)
	}
	for i, got := range answers {
		select {
		case r := <-got:
			if r.status != http.StatusRequestEntityTooLarge || r.header.Get("X-Status-Seen") != "413" {
				t.Errorf("body %d: %d %q, x-status-seen %q; want 413 through the response callbacks", i, r.status, r.body, r.header.Get("X-Status-Seen"))
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("body %d: no answer within 20 s while it stalls (peak RSS grew %d KiB)", i, rssKB(t, "VmHWM")-before)
		}
	}
	grown := rssKB(t, "VmHWM") - before
	t.Logf("peak RSS grew %d KiB for %d bodies of %d MiB", grown, n, size>>20)
	if grown > 96<<10 {
		t.Errorf("peak RSS grew %d KiB, want under 96 MiB: the bodies are held", grown)
	}
}

// TestStreamIdleTimeout: a request body that stops sending is ended after
// the stream idle timeout (shortened here) with Envoy's 408 "stream
// timeout", which the response callbacks see; a body that keeps sending,
// slower than the timeout in all but each gap, is ended by the request
// timeout instead. Before (issue 30), the host waited for such a body
// forever.
func TestStreamIdleTimeout(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		_, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{StreamIdleTimeout: 200 * time.Millisecond})
		got, end := stalledBody(t, srv, 100)
		defer end()
		select {
		case r := <-got:
			if r.status != http.StatusRequestTimeout || r.body != "stream timeout" || r.header.Get("X-Status-Seen") != "408" {
				t.Errorf("got %d %q, x-status-seen %q; want 408 stream timeout through the response callbacks", r.status, r.body, r.header.Get("X-Status-Seen"))
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a stalled body: no answer within 20 s (100 times the idle timeout)")
		}
	})
	t.Run("request-timeout", func(t *testing.T) {
		_, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{StreamIdleTimeout: 10 * time.Second, RequestTimeout: 300 * time.Millisecond})
		pr, pw := io.Pipe()
		defer pw.Close()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/", pr)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("x-test", "none")
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for range 400 { // a byte every 50 ms, for at most 20 s
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
				if _, err := pw.Write([]byte("x")); err != nil {
					return
				}
			}
		}()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || string(b) != "request timeout" {
			t.Errorf("got %d %q, want 408 request timeout", resp.StatusCode, b)
		}
	})
}
