// Package hostguest runs the local host's own test guest for the tests of
// internal/localhost/wasmhost and internal/localhost/proxy: a small
// proxy-wasm module written for those tests
// (internal/localhost/wasmhost/testdata/guest), built once per test
// process and run by a wasmhost.Host. It is not the tokengate module: the
// host is tested against a guest whose every action a test asks for by
// name.
package hostguest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

var (
	once sync.Once
	wasm []byte
	err  error
)

// Wasm builds the test guest (once per process) as a wasip1 reactor and
// returns its bytes.
func Wasm() ([]byte, error) {
	once.Do(func() {
		root, e := wasmbuild.Root()
		if e != nil {
			err = e
			return
		}
		dir, e := os.MkdirTemp("", "hostguest")
		if e != nil {
			err = e
			return
		}
		defer os.RemoveAll(dir)
		out := filepath.Join(dir, "guest.wasm")
		cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./internal/localhost/wasmhost/testdata/guest")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
		if b, e := cmd.CombinedOutput(); e != nil {
			err = fmt.Errorf("building the test guest: %v\n%s", e, b)
			return
		}
		wasm, err = os.ReadFile(out)
	})
	return wasm, err
}

// Discard is a log sink that drops every line.
func Discard(wasmhost.LogLevel, string) {}

// Start starts the test guest with opts (Wasm filled in, logs discarded
// and the plugin named "guest" unless opts says otherwise) and closes it
// when the test ends. Serving it over HTTP is the caller's (a proxy.Proxy
// in front of it): this package does not depend on the proxy, so that
// the proxy's own tests can use it.
func Start(t testing.TB, opts wasmhost.Options) *wasmhost.Host {
	t.Helper()
	w, err := Wasm()
	if err != nil {
		t.Fatal(err)
	}
	opts.Wasm = w
	if opts.LogSink == nil {
		opts.LogSink = Discard
	}
	if opts.PluginName == "" {
		opts.PluginName = "guest"
	}
	h, err := wasmhost.New(context.Background(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}
