package rlsyaml_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
	"github.com/tokengate/tokengate/internal/service/rls"
)

func TestParse(t *testing.T) {
	d, err := rlsyaml.Parse("x.yaml", []byte(`domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: Minute, requests_per_unit: 60}
  - key: tenant
    value: acme
    shadow_mode: true
    detailed_metric: true
    value_to_metric: true
    metadata: {team: a}
    descriptors:
      - key: plan
        rate_limit:
          unit: hour
          requests_per_unit: 4
          name: plan
          replaces: [{name: other}]
  - key: free
    rate_limit: {unlimited: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "edge" || len(d.Descriptors) != 3 {
		t.Fatalf("domain %q with %d descriptors", d.Name, len(d.Descriptors))
	}
	if rl := d.Descriptors[0].RateLimit; rl.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE || rl.RequestsPerUnit != 60 {
		t.Errorf("remote_address %+v", rl)
	}
	if d.Descriptors[1].RateLimit != nil || d.Descriptors[1].Value != "acme" {
		t.Errorf("tenant %+v", d.Descriptors[1])
	}
	// shadow_mode belongs to the descriptor that has the rate_limit.
	plan := d.Descriptors[1].Descriptors[0].RateLimit
	if plan.Name != "plan" || len(plan.Replaces) != 1 || plan.Replaces[0] != "other" || plan.Shadow {
		t.Errorf("plan %+v", plan)
	}
	if !d.Descriptors[2].RateLimit.Unlimited {
		t.Errorf("free %+v", d.Descriptors[2].RateLimit)
	}
	if _, err := rls.NewDropinConfig([]*rls.Domain{d}, rls.DropinOptions{}); err != nil {
		t.Errorf("NewDropinConfig: %v", err)
	}
}

// TestParseErrors: each bad file is refused with the file, the line and
// the path of the field.
func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"not yaml", "domain: [", "x.yaml: yaml:"},
		{"empty", "", "x.yaml: empty file"},
		{"no domain", "descriptors: []", "x.yaml:1: domain: required"},
		{"unknown top field", "domain: d\nrate_limit: {}", "x.yaml:2: rate_limit: unknown field (want one of descriptors, domain)"},
		{"unknown field", "domain: d\ndescriptors:\n  - key: k\n    limit: 3", "x.yaml:4: descriptors[0].limit: unknown field"},
		{"no key", "domain: d\ndescriptors:\n  - value: v", "x.yaml:3: descriptors[0].key: required"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}",
			`x.yaml:4: descriptors[0].rate_limit.unit: must be one of second, minute, hour, day, week, month, year; got "fortnight"`},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}", "descriptors[0].rate_limit.unit: required"},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}", "unlimited must not have a unit"},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}", "requests_per_unit: must be a whole number from 0 to 4294967295, got -1"},
		{"string count", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: \"5\"}", `requests_per_unit: must be a whole number, got "5"`},
		{"bool as string", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please", "shadow_mode: must be true or false"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}", "cannot replace itself"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}", "replaces[0].name: required"},
		{"quota mode", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true", "descriptors[0].quota_mode: not supported by tokengate-rls"},
		{"share threshold", "domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true", "share_threshold: not supported"},
		{"twice", "domain: d\ndomain: e", "domain: given twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rlsyaml.Parse("x.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// TestLoadDir reads every file of the directory tree, without dot files
// when asked, and refuses a domain in two files; NewDropinConfig refuses
// a duplicate descriptor as envoyproxy/ratelimit does.
func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: a\n")
	write("sub/b.yml", "domain: b\n")
	write(".hidden.yaml", "domain: [\n")
	ds, err := rlsyaml.LoadDir(dir, true)
	if err != nil || len(ds) != 2 || ds[0].Name != "a" || ds[1].Name != "b" {
		t.Fatalf("LoadDir: %v %v", ds, err)
	}
	if _, err := rlsyaml.LoadDir(dir, false); err == nil || !strings.Contains(err.Error(), ".hidden.yaml") {
		t.Errorf("LoadDir with dot files: %v, want the bad dot file's error", err)
	}
	write("c.yaml", "domain: a\n")
	if _, err := rlsyaml.LoadDir(dir, true); err == nil || !strings.Contains(err.Error(), `domain "a" is also in`) {
		t.Errorf("a domain twice: %v", err)
	}
	d, err := rlsyaml.Parse("d.yaml", []byte("domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rls.NewDropinConfig([]*rls.Domain{d}, rls.DropinOptions{}); err == nil || !strings.Contains(err.Error(), "d.k_v: duplicate descriptor") {
		t.Errorf("duplicate descriptor: %v", err)
	}
}
