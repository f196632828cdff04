package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

func module(t *testing.T) []byte {
	t.Helper()
	wasm, err := wasmbuild.Module()
	if err != nil {
		t.Fatal(err)
	}
	return wasm
}

// TestMeasure checks the counts against what one request must do: the
// host's six stream callbacks once each, and for one per-IP rule one
// source.address, one get and one set of the bucket, one counter and five
// RateLimit headers (the legacy three replaced, RateLimit and
// RateLimit-Policy added as lines of their own, no upstream value read);
// for a passthrough request none of those but the :path lookup.
func TestMeasure(t *testing.T) {
	wasm := module(t)
	const rule = `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}`
	p, err := Measure(wasm, []byte(rule), "/api/items", "192.0.2.1:40000", 50)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"proxy_on_context_create": 1, "proxy_on_request_headers": 1, "proxy_on_response_headers": 1,
		"proxy_on_log": 1, "proxy_on_done": 1, "proxy_on_delete": 1,
		"env.proxy_get_property": 1, "env.proxy_get_shared_data": 1, "env.proxy_set_shared_data": 1,
		"env.proxy_increment_metric": 1, "env.proxy_replace_header_map_value": 3,
		"env.proxy_add_header_map_value": 2, "env.proxy_get_header_map_value": 0,
	}
	for name, n := range want {
		if p.PerReq[name] != n {
			t.Errorf("%s: %.2f calls per request, want %v", name, p.PerReq[name], n)
		}
	}
	pass, err := Measure(wasm, []byte(`{"bundle_version":1,"policies":[{"id":"api","spec":{"selector":{"pathPrefix":"/api/"},
		"rules":[`+rule+`]}}]}`), "/static/app.js", "192.0.2.1:40000", 50)
	if err != nil {
		t.Fatal(err)
	}
	if n := pass.PerReq["env.proxy_get_header_map_value"]; n != 1 {
		t.Errorf("passthrough: proxy_get_header_map_value %.2f per request, want 1 (:path)", n)
	}
	for _, name := range []string{"env.proxy_get_shared_data", "env.proxy_replace_header_map_value", "env.proxy_add_header_map_value"} {
		if n := pass.PerReq[name]; n != 0 {
			t.Errorf("passthrough: %s %.2f per request, want 0", name, n)
		}
	}
	if !(pass.Total() < p.Total()) {
		t.Errorf("passthrough makes %.1f calls per request, one rule %.1f: want fewer", pass.Total(), p.Total())
	}
}

func TestRunPrints(t *testing.T) {
	path, err := wasmbuild.Path()
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"-wasm", path, "-n", "10", "-top", "3"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "10 requests; ") || !strings.HasPrefix(lines[4], "... ") {
		t.Errorf("output:\n%s\nwant a summary line, 3 functions and a '... N more' line", out.String())
	}
}
