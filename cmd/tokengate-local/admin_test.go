package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	localproxy "github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// builtModule reads the module make build wrote.
func builtModule(t *testing.T) []byte {
	t.Helper()
	path, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	wasm, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}

// TestSharedDataRedacted (issue 22, item 11): /shared_data shows no API
// key, client address or slot seed unless -show-identities, for slot keys
// (the owner in the value) and unbounded keys (the identity in the key)
// alike. It showed them all.
func TestSharedDataRedacted(t *testing.T) {
	wasm := builtModule(t)
	const apiKey = "sk-live-4242-secret"
	h, err := wasmhost.New(context.Background(), wasmhost.Options{Wasm: wasm, Workers: 1, LogSink: func(wasmhost.LogLevel, string) {},
		PluginConfig: []byte(`{"rules":[
			{"name":"slotted","limit_keys":["header:x-api-key","ip:address"],"algorithm_config":{"rps":1,"burst":5}},
			{"name":"unbounded","limit_keys":["header:x-api-key"],"max_keys":0,"algorithm_config":{"rps":1,"burst":5}}]}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close(context.Background())
	proxy := httptest.NewServer(localproxy.New(h, localproxy.Options{}))
	defer proxy.Close()
	req, _ := http.NewRequest(http.MethodGet, proxy.URL+"/", nil)
	req.Header.Set("x-api-key", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("request: got %d", resp.StatusCode)
	}
	ms, _ := wasmhost.Unwrap(h.Store())
	var seed string
	for _, e := range ms.Snapshot("") {
		if e.Key == seedKey {
			seed = e.Value
		}
	}
	secrets := []string{apiKey, "127.0.0.1", seed}
	if seed == "" {
		t.Fatalf("no slot seed in %v", ms.Snapshot(""))
	}
	get := func(show bool) string {
		admin := httptest.NewServer(adminHandler(h, show))
		defer admin.Close()
		resp, err := http.Get(admin.URL + "/shared_data")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	redacted := get(false)
	for _, s := range secrets {
		if strings.Contains(redacted, s) {
			t.Errorf("/shared_data shows %q:\n%s", s, redacted)
		}
	}
	for _, want := range []string{`"tb:slotted:$`, `"tb:unbounded:#`, `value="(redacted)"`, "identities and the slot seed redacted"} {
		if !strings.Contains(redacted, want) {
			t.Errorf("/shared_data lacks %q:\n%s", want, redacted)
		}
	}
	raw := get(true)
	for _, s := range secrets {
		if !strings.Contains(raw, s) {
			t.Errorf("-show-identities: /shared_data lacks %q:\n%s", s, raw)
		}
	}
}
