// Package e2e holds the end-to-end tests: the real tokengate.wasm
// served over loopback HTTP by the local host (internal/localhost/proxy in
// front of the proxy-wasm host internal/localhost/wasmhost).
package e2e

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// loadModule returns the filter module, built from this tree by the test
// binary (internal/testsupport/wasmbuild). It fails the test, never skips it: the
// end-to-end tests are the point.
func loadModule(t testing.TB) []byte {
	t.Helper()
	wasm, err := wasmbuild.Module()
	if err != nil {
		t.Fatalf("the filter module: %v", err)
	}
	return wasm
}

// startHost runs the real module with opts (Wasm filled in, logs kept but
// not printed unless the test fails) behind the local host's HTTP proxy
// (with popts, if given) in an httptest server on loopback.
func startHost(t testing.TB, opts wasmhost.Options, popts ...proxy.Options) (*wasmhost.Host, *httptest.Server) {
	t.Helper()
	opts.Wasm = loadModule(t)
	if opts.LogSink == nil {
		opts.LogSink = func(wasmhost.LogLevel, string) {}
	}
	h, err := wasmhost.New(context.Background(), opts)
	if err != nil {
		t.Fatalf("wasmhost.New: %v", err)
	}
	var po proxy.Options
	if len(popts) > 0 {
		po = popts[0]
	}
	srv := httptest.NewServer(proxy.New(h, po))
	t.Cleanup(func() {
		srv.Close()
		if t.Failed() {
			for _, e := range h.Logs() {
				t.Log(e)
			}
		}
		if err := h.Close(context.Background()); err != nil {
			t.Errorf("wasmhost.Close: %v", err)
		}
	})
	return h, srv
}

// get sends a GET and returns the response with its body read and closed.
func get(t testing.TB, srv *httptest.Server, path string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}
