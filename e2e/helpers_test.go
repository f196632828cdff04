// Package e2e holds the end-to-end tests: the real build/tokengate.wasm
// served over loopback HTTP by the local proxy-wasm host (internal/wasmhost).
package e2e

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/internal/wasmhost"
)

var (
	moduleOnce sync.Once
	moduleWasm []byte
	moduleErr  error
)

// modulePath is build/tokengate.wasm at the repository root, or
// $TOKENGATE_WASM.
func modulePath() (string, error) {
	if p := os.Getenv("TOKENGATE_WASM"); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "build", "tokengate.wasm"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the test directory")
		}
		dir = parent
	}
}

// loadModule returns the built filter. It fails the test, never skips it,
// when the module is missing: the end-to-end tests are the point.
func loadModule(t testing.TB) []byte {
	t.Helper()
	moduleOnce.Do(func() {
		var path string
		if path, moduleErr = modulePath(); moduleErr == nil {
			moduleWasm, moduleErr = os.ReadFile(path)
		}
	})
	if moduleErr != nil {
		t.Fatalf("loading the filter module: %v\nrun `make build` first (or set TOKENGATE_WASM)", moduleErr)
	}
	return moduleWasm
}

// startHost runs the real module with opts (Wasm filled in, logs kept but
// not printed unless the test fails) behind an httptest server on loopback.
func startHost(t testing.TB, opts wasmhost.Options) (*wasmhost.Host, *httptest.Server) {
	t.Helper()
	opts.Wasm = loadModule(t)
	if opts.LogSink == nil {
		opts.LogSink = func(wasmhost.LogLevel, string) {}
	}
	h, err := wasmhost.New(context.Background(), opts)
	if err != nil {
		t.Fatalf("wasmhost.New: %v", err)
	}
	srv := httptest.NewServer(h)
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
