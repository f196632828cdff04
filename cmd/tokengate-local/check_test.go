package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

// TestCheck runs -check on the shipped files and on broken ones of each
// kind: exit status (run's error), and the module's own messages with
// where the configuration sits.
func TestCheck(t *testing.T) {
	wasm, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	envoy, err := os.ReadFile("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	istio, err := os.ReadFile("../../deploy/istio/wasmplugin.yaml")
	if err != nil {
		t.Fatal(err)
	}
	badEnvoy := strings.Replace(string(envoy), `"name": "per-ip"`, `"name": "per ip"`, 1)
	if badEnvoy == string(envoy) {
		t.Fatal(`envoy.yaml has no "name": "per-ip" to break`)
	}
	badIstio := strings.Replace(string(istio), "burst:", "bursts:", 1)
	if badIstio == string(istio) {
		t.Fatal("wasmplugin.yaml has no burst: to break")
	}
	tests := []struct {
		name, file string
		ok         bool
		output     []string // each must appear in the output
	}{
		{"envoy.yaml", "../../envoy.yaml", true, []string{"envoy.yaml (static_resources.listeners[0]", "): ok"}},
		{"istio", "../../deploy/istio/wasmplugin.yaml", true, []string{"WasmPlugin tokengate): ok"}},
		{"example json", "../../examples/tiered.json", true, []string{"tiered.json: ok"}},
		{"json syntax", write("syntax.json", "{\n  \"name\": \"a\"\n  \"x\": 1}"), false,
			[]string{"syntax.json: tokengate: invalid configuration: configuration is not valid JSON: line 3, column 3: expected ',' or '}'"}},
		{"json never admits", write("never.json", `{"name":"a","algorithm_config":{"rps":0.5,"burst":0.5}}`), false,
			[]string{"never.json: tokengate: invalid configuration: algorithm_config.burst: must be >= the cost of a request"}},
		{"envoy.yaml broken rule", write("envoy.yaml", badEnvoy), false,
			[]string{"http_filters[1].typed_config): tokengate: invalid configuration: policies[0].spec.rules[0].name:"}},
		{"istio broken", write("wasmplugin.yaml", badIstio), false,
			[]string{"(document 1, WasmPlugin tokengate): tokengate: invalid configuration:", "unknown field"}},
		{"nothing to check", write("other.yaml", "a: 1\n"), false, nil},
		// Issue 22, item 10: these were "no plugin configuration ... found"
		// (and the deep one a YAML error); the module judges them.
		{"empty", write("empty.json", ""), false,
			[]string{"empty.json: tokengate: invalid configuration: configuration is empty"}},
		{"empty, any name", write("empty.yaml", "\n \n"), false,
			[]string{"empty.yaml: tokengate: invalid configuration: configuration is empty"}},
		{"not json", write("notjson.json", "rules: none\n"), false,
			[]string{"notjson.json: tokengate: invalid configuration: configuration is not valid JSON: line 1, column 1:"}},
		{"top-level array", write("array.json", `[{"name":"a","algorithm_config":{"rps":1,"burst":1}}]`), false,
			[]string{"array.json: tokengate: invalid configuration: configuration must be a JSON object, got an array"}},
		{"byte order mark", write("bom.json", "\xef\xbb\xbf"+`{"name":"a","algorithm_config":{"rps":1,"burst":1}}`), false,
			[]string{"bom.json: tokengate: invalid configuration: configuration starts with a UTF-8 byte order mark (bytes EF BB BF), which JSON does not allow: save the file without it"}},
		{"deeply nested", write("deep.json", strings.Repeat("[", 100000)+strings.Repeat("]", 100000)), false,
			[]string{"deep.json: tokengate: invalid configuration: configuration is not valid JSON: line 1, column 10001: nested too deeply"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), []string{"-wasm", wasm, "-check", tc.file}, &out, &errOut)
			if (err == nil) != tc.ok {
				t.Fatalf("ok = %v (err %v), want %v; output:\n%s", err == nil, err, tc.ok, out.String())
			}
			for _, want := range tc.output {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

// TestUpstreamCluster: with -upstream cluster, allowed requests go to the
// route's cluster of envoy.yaml; its static clusters are the host's
// callout targets.
func TestUpstreamCluster(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "from the cluster "+r.URL.Path)
	}))
	defer up.Close()
	envoy, err := os.ReadFile("../../envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(envoy), "port_value: 8080", "port_value: "+up.URL[strings.LastIndexByte(up.URL, ':')+1:], 1)
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	lo, source, err := loadPlugin(settings{envoy: path, upstream: "cluster"})
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := lo.host.Clusters["upstream"]; !ok || c.Address != strings.TrimPrefix(up.URL, "http://") {
		t.Errorf("clusters %+v", lo.host.Clusters)
	}
	if !strings.Contains(source, "proxying to cluster upstream at") {
		t.Errorf("source %q", source)
	}
	rec := httptest.NewRecorder()
	lo.proxy.Upstream.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/x", nil))
	if rec.Body.String() != "from the cluster /x" {
		t.Errorf("upstream answered %q", rec.Body.String())
	}
	if _, _, err := loadPlugin(settings{envoy: "../../envoy.yaml"}); err != nil {
		t.Errorf("without -upstream cluster: %v", err)
	}
}
