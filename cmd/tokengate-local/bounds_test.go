package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	localproxy "github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// TestRequestBounds: the bootstrap's stream_idle_timeout and
// request_timeout and -buffer-limit reach the proxy (issue 30: request
// bodies that never end were held without bound), and with the built
// module in front a body over the limit is answered 413 and one that
// stops sending 408 after the bootstrap's idle timeout. Without them the
// defaults are Envoy's (1 MiB, 5 minutes, no request timeout).
func TestRequestBounds(t *testing.T) {
	path, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const prefix = "                stat_prefix: ingress_http\n"
	if !strings.Contains(string(doc), prefix) {
		t.Fatal("envoy.yaml: no stat_prefix line to add the timeouts after")
	}
	timed := strings.Replace(string(doc), prefix, prefix+"                stream_idle_timeout: 0.3s\n                request_timeout: 600s\n", 1)
	envoy := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(envoy, []byte(timed), 0o644); err != nil {
		t.Fatal(err)
	}

	lo, _, _, err := hostOptions(settings{envoy: "../../envoy.yaml", wasm: path}, wasmhost.LogInfo, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// 0: the proxy's defaults, Envoy's (proxy.DefaultBufferLimit, 1 MiB;
	// DefaultStreamIdleTimeout, 5 minutes; no request timeout).
	if p := lo.proxy; p.BufferLimit != 0 || p.StreamIdleTimeout != 0 || p.RequestTimeout != 0 {
		t.Errorf("defaults: buffer %d, idle %v, request %v; want 0 (Envoy's defaults)", p.BufferLimit, p.StreamIdleTimeout, p.RequestTimeout)
	}
	lo, _, _, err = hostOptions(settings{envoy: envoy, wasm: path, bufferLimit: 4096}, wasmhost.LogInfo, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p := lo.proxy; p.BufferLimit != 4096 || p.StreamIdleTimeout != 300*time.Millisecond || p.RequestTimeout != 600*time.Second {
		t.Fatalf("configured: buffer %d, idle %v, request %v; want 4096, 300ms, 600s", p.BufferLimit, p.StreamIdleTimeout, p.RequestTimeout)
	}

	lo.host.Workers, lo.host.LogSink = 1, func(wasmhost.LogLevel, string) {}
	lo.proxy.Upstream = nil // the echo upstream
	h, err := wasmhost.New(context.Background(), lo.host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	srv := httptest.NewServer(localproxy.New(h, lo.proxy))
	defer srv.Close()

	post := func(body io.Reader) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/", body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(strings.NewReader(strings.Repeat("x", 4096))); code != http.StatusOK {
		t.Errorf("a body at the limit: %d %q, want 200", code, body)
	}
	if code, _ := post(io.MultiReader(strings.NewReader(strings.Repeat("x", 4097)))); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a chunked body over the limit: %d, want 413", code)
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() { _, _ = pw.Write([]byte("{")) }() // then nothing
	if code, body := post(pr); code != http.StatusRequestTimeout || body != "stream timeout" {
		t.Errorf("a body that stops sending: %d %q, want 408 stream timeout", code, body)
	}
}
