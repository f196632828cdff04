package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// TestCheckWarnings (issue 22, items 5 and 6): -check accepts a tier set
// without a fallback and a failed-login limit keyed by address alone, and
// warns about each; and every configuration the repository ships, which
// people copy, draws no warning. examples/tiered-fairvisor.json is the one
// exception: it reproduces design note 01's example as written, to show
// its pitfalls (docs/configuration.md, "Tiers").
func TestCheckWarnings(t *testing.T) {
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
	check := func(file string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := run(context.Background(), []string{"-wasm", wasm, "-check", file}, &out, &errOut); err != nil {
			t.Fatalf("%s: %v\n%s", file, err, out.String())
		}
		return out.String()
	}
	tiers := write("tiers.json", `{"rules":[`+
		`{"name":"gold","limit_keys":["header:x-api-key"],"match":{"jwt:plan":"gold"},"algorithm_config":{"rps":10,"burst":20}},`+
		`{"name":"free","limit_keys":["header:x-api-key"],"match":{"jwt:plan":"free"},"algorithm_config":{"rps":1,"burst":2}}]}`)
	login := write("login.json", `{"name":"login","limit_keys":["ip:address"],"match":{"path":"/login"},`+
		`"algorithm_config":{"rps":0.01,"burst":5,"count_statuses":[401],"reset_on_statuses":["2xx"]}}`)
	for file, want := range map[string]string{
		tiers: `tiers.json: warning: policy "default": a request these rules skip is limited by no other rule (gold: match jwt:plan; free: match jwt:plan)`,
		login: `login.json: warning: rule "login": reset_on_statuses without a key naming the user`,
	} {
		out := check(file)
		if !strings.Contains(out, ": ok\n") || !strings.Contains(out, want) {
			t.Errorf("%s: output lacks ok and %q:\n%s", file, want, out)
		}
	}

	shipped, err := filepath.Glob("../../examples/*.json")
	if err != nil {
		t.Fatal(err)
	}
	shipped = append(shipped, "../../examples/cluster/cluster.json", "../../examples/cluster/envoy.yaml", "../../envoy.yaml",
		"../../deploy/istio/wasmplugin.yaml", "../../deploy/rls/tokengate.json")
	for _, f := range shipped {
		if filepath.Base(f) == "tiered-fairvisor.json" {
			continue
		}
		if out := check(f); strings.Contains(out, "warning:") {
			t.Errorf("%s is shipped with a warning:\n%s", f, out)
		}
	}
}
