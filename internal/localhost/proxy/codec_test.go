package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// rawStatus sends req, written as is, to srv and returns the status code
// of the answer.
func rawStatus(t *testing.T, srv *httptest.Server, req string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", srv.Listener.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", req, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestEnvoyCodecLimits (issue 22, item 11): the local host refuses what
// Envoy's codec and connection manager refuse before any filter, with or
// without an Envoy bootstrap: over 100 header lines or 60 KiB of headers
// (431, DEFAULT_MAX_HEADERS_COUNT and DEFAULT_MAX_REQUEST_HEADERS_KB), a
// path that is not relative (404), CONNECT (404: no route matches it). It
// answered all of them with 200.
func TestEnvoyCodecLimits(t *testing.T) {
	headers := func(n, size int) string {
		var b strings.Builder
		for i := range n {
			b.WriteString("x-h" + strconv.Itoa(i) + ": " + strings.Repeat("v", size) + "\r\n")
		}
		return b.String()
	}
	for _, m := range []*Manager{nil, {MaxHeadersKB: 60, MaxHeadersCount: 100}} {
		_, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{Manager: m})
		for _, tc := range []struct {
			name, req string
			want      int
		}{
			{"99 headers and Host", "GET / HTTP/1.1\r\nHost: a\r\n" + headers(99, 1) + "\r\n", 200},
			{"100 headers and Host", "GET / HTTP/1.1\r\nHost: a\r\n" + headers(100, 1) + "\r\n", 431},
			{"10,000 headers", "GET / HTTP/1.1\r\nHost: a\r\n" + headers(10000, 1) + "\r\n", 431},
			{"a 50 KiB header", "GET / HTTP/1.1\r\nHost: a\r\nx-big: " + strings.Repeat("b", 50<<10) + "\r\n\r\n", 200},
			{"a 64 KiB header", "GET / HTTP/1.1\r\nHost: a\r\nx-big: " + strings.Repeat("b", 64<<10) + "\r\n\r\n", 431},
			{"CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 404},
			{"PRI *", "PRI * HTTP/1.1\r\nHost: a\r\n\r\n", 404},
			{"absolute form", "GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n", 200},
		} {
			if got := rawStatus(t, srv, tc.req); got != tc.want {
				t.Errorf("manager %v, %s: got %d, want %d", m != nil, tc.name, got, tc.want)
			}
		}
		if m == nil {
			continue
		}
		// A bootstrap's own limits.
		_, small := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{Manager: &Manager{MaxHeadersCount: 10}})
		if got := rawStatus(t, small, "GET / HTTP/1.1\r\nHost: a\r\n"+headers(10, 1)+"\r\n"); got != 431 {
			t.Errorf("max_headers_count 10, 11 lines: got %d, want 431", got)
		}
	}
}

// TestProxyKeepsEncoding (issue 22, item 11): the upstream gets the
// request's Accept-Encoding as the client sent it, none added, and the
// client the body as the upstream sent it. Go's transport asked for gzip
// on its own and handed the filter the body decompressed.
func TestProxyKeepsEncoding(t *testing.T) {
	const text = `{"usage":{"total_tokens":100}}`
	seen := make(chan string, 2)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Get("Accept-Encoding")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			_, _ = io.WriteString(w, text)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, text)
		_ = zw.Close()
	}))
	defer up.Close()
	u, err := url.Parse(up.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, srv := newGuestHost(t, wasmhost.Options{Workers: 1}, Options{Upstream: ProxyTo(u)})
	// The test's own client must not ask for gzip either.
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	for _, ae := range []string{"", "gzip"} {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		if ae != "" {
			req.Header.Set("Accept-Encoding", ae)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := <-seen; got != ae {
			t.Errorf("client Accept-Encoding %q: the upstream got %q", ae, got)
		}
		gzipped := resp.Header.Get("Content-Encoding") == "gzip"
		if gzipped != (ae == "gzip") || !gzipped && string(body) != text || gzipped && bytes.Equal(body, []byte(text)) {
			t.Errorf("client Accept-Encoding %q: got Content-Encoding %q, body %q", ae, resp.Header.Get("Content-Encoding"), body)
		}
	}
}
