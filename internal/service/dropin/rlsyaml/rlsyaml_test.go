package rlsyaml_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/configmap"
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
		{"not yaml", "domain: [", "x.yaml:1: did not find expected node content"},
		{"empty", "", "x.yaml:1: empty file"},
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
		{"share threshold without a pattern", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true", `x.yaml:5: descriptors[0].share_threshold: needs a pattern: a '*' in the key or the value, got composite key "k_v"`},
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
	if _, err := rlsyaml.LoadDir(dir, true); err == nil || !strings.Contains(err.Error(), `domain: "a" is also in`) {
		t.Errorf("a domain twice: %v", err)
	}
	// Parse refuses a duplicate descriptor with its line (TestRefusals);
	// NewDropinConfig, given one (as from xDS), refuses it too.
	if _, err := rlsyaml.Parse("d.yaml", []byte("domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n")); err == nil || !strings.Contains(err.Error(), "d.yaml:4: descriptors[1]: duplicate descriptor") {
		t.Errorf("Parse, duplicate descriptor: %v", err)
	}
	d := &rls.Domain{Name: "d", Descriptors: []*rls.Descriptor{{Key: "k", Value: "v"}, {Key: "k", Value: "v"}}}
	if _, err := rls.NewDropinConfig([]*rls.Domain{d}, rls.DropinOptions{}); err == nil || !strings.Contains(err.Error(), "d.k_v: duplicate descriptor") {
		t.Errorf("duplicate descriptor: %v", err)
	}
}

// TestRefusals: every refusal of a runtime directory names its file and
// line, "file:line: path: message". One fixture per refusal, in the manner
// of envoyproxy/ratelimit's test/config (whose fixtures keep their names
// here: bad_limit_unit.yaml, duplicate_key.yaml, ...); each is loaded
// alone in a directory (beside ok.yaml, a valid domain, for the duplicate
// domain) by LoadDir, as the drop-in loads it, and the message is
// compared whole. $DIR stands for the directory. Before, a duplicate
// descriptor was refused by NewDropinConfig as "test-domain.key1_value1:
// duplicate descriptor", with neither file nor line, and a YAML syntax
// error or an empty file had no line.
func TestRefusals(t *testing.T) {
	const okYAML = "domain: test-domain\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
	for _, tc := range []struct{ file, yaml, want string }{
		{"bad_yaml.yaml", "'''\n", "$DIR/bad_yaml.yaml:1: found unexpected end of stream"},
		{"bad_flow.yaml", "domain: d\ndescriptors: [{key: a\n", "$DIR/bad_flow.yaml:2: did not find expected ',' or '}'"},
		{"bad_indent.yaml", "domain: d\ndescriptors:\n  - key: a\n   value: b\n", "$DIR/bad_indent.yaml:3: did not find expected '-' indicator"},
		{"control_character.yaml", "domain: d\ndescriptors:\n  - key: \x01\n", "$DIR/control_character.yaml:3: control characters are not allowed"},
		{"not_utf8.yaml", "domain: d\ndescriptors:\n\n  - key: \xff\n", "$DIR/not_utf8.yaml:4: invalid leading UTF-8 octet"},
		{"unknown_anchor.yaml", "domain: d\ndescriptors:\n  - key: *k\n", "$DIR/unknown_anchor.yaml:3: unknown anchor 'k' referenced"},
		{"empty.yaml", "# nothing\n", "$DIR/empty.yaml:1: empty file: want a domain and its descriptors"},
		{"non_map_root.yaml", "- domain: d\n", "$DIR/non_map_root.yaml:1: (top): must be a mapping, got a list"},
		{"empty_domain.yaml", "descriptors:\n", "$DIR/empty_domain.yaml:1: domain: required, and not empty"},
		{"domain_not_string.yaml", "domain: {a: b}\n", "$DIR/domain_not_string.yaml:1: domain: must be a string, got a mapping"},
		{"duplicate_domain.yaml", "\ndomain: test-domain\n", `$DIR/duplicate_domain.yaml:2: domain: "test-domain" is also in $DIR/a_ok.yaml:1`},
		{"misspelled_top.yaml", "domain: d\ndescriptor: []\n", "$DIR/misspelled_top.yaml:2: descriptor: unknown field (want one of descriptors, domain)"},
		{"twice.yaml", "domain: d\ndomain: e\n", "$DIR/twice.yaml:2: domain: given twice"},
		{"descriptors_not_list.yaml", "domain: d\ndescriptors: {key: a}\n", "$DIR/descriptors_not_list.yaml:2: descriptors: must be a list of descriptors, got a mapping"},
		{"non_map_list.yaml", "domain: test-domain\ndescriptors:\n  - a\n  - b\n", `$DIR/non_map_list.yaml:3: descriptors[0]: must be a mapping, got "a"`},
		{"empty_key.yaml", "domain: test-domain\ndescriptors:\n  - value: value1\n", "$DIR/empty_key.yaml:3: descriptors[0].key: required, and not empty"},
		{"key_not_string.yaml", "domain: d\ndescriptors:\n  - key: [a]\n", "$DIR/key_not_string.yaml:3: descriptors[0].key: must be a string, got a list"},
		{"duplicate_key.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
			`$DIR/duplicate_key.yaml:6: descriptors[1]: duplicate descriptor: composite key "key1_value1" (key_value) is also that of descriptors[0] at line 3`},
		{"duplicate_composite.yaml", "domain: d\ndescriptors:\n  - key: t\n    descriptors:\n      - {key: a_b, value: c}\n      - {key: a, value: b_c}\n",
			`$DIR/duplicate_composite.yaml:6: descriptors[0].descriptors[1]: duplicate descriptor: composite key "a_b_c" (key_value) is also that of descriptors[0].descriptors[0] at line 5`},
		{"misspelled_key.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n",
			"$DIR/misspelled_key.yaml:5: descriptors[0].ratelimit: unknown field (want one of descriptors, detailed_metric, key, metadata, quota_mode, rate_limit, shadow_mode, share_threshold, value, value_to_metric)"},
		{"misspelled_key2.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
			"$DIR/misspelled_key2.yaml:6: descriptors[0].rate_limit.requestsperunit: unknown field (want one of name, replaces, requests_per_unit, unit, unlimited)"},
		{"non_string_key.yaml", "0.25: test-domain\n", "$DIR/non_string_key.yaml:1: 0.25: unknown field (want one of descriptors, domain)"},
		{"shadow_not_bool.yaml", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: yes please\n", `$DIR/shadow_not_bool.yaml:4: descriptors[0].shadow_mode: must be true or false, got "yes please"`},
		{"metadata_not_map.yaml", "domain: d\ndescriptors:\n  - key: k\n    metadata: [a]\n", "$DIR/metadata_not_map.yaml:4: descriptors[0].metadata: must be a mapping, got a list"},
		{"rate_limit_not_map.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: 5\n", `$DIR/rate_limit_not_map.yaml:4: descriptors[0].rate_limit: must be a mapping, got "5"`},
		{"bad_limit_unit.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
			`$DIR/bad_limit_unit.yaml:6: descriptors[0].rate_limit.unit: must be one of second, minute, hour, day, week, month, year; got "foo"`},
		{"unknown_unit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: unknown, requests_per_unit: 5}\n",
			`$DIR/unknown_unit.yaml:4: descriptors[0].rate_limit.unit: must be one of second, minute, hour, day, week, month, year; got "unknown"`},
		{"no_unit.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 5\n",
			"$DIR/no_unit.yaml:5: descriptors[0].rate_limit.unit: required (second, minute, hour, day, week, month, year) unless unlimited"},
		{"unlimited_with_unit.yaml", "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
			"$DIR/unlimited_with_unit.yaml:5: descriptors[0].rate_limit: unlimited must not have a unit"},
		{"count_negative.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: -1}\n",
			"$DIR/count_negative.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number from 0 to 4294967295, got -1"},
		{"count_too_big.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 4294967296}\n",
			"$DIR/count_too_big.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number from 0 to 4294967295, got 4294967296"},
		{"count_string.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: \"5\"}\n",
			`$DIR/count_string.yaml:4: descriptors[0].rate_limit.requests_per_unit: must be a whole number, got "5"`},
		{"replaces_not_list.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requests_per_unit: 5, replaces: a}\n",
			`$DIR/replaces_not_list.yaml:4: descriptors[0].rate_limit.replaces: must be a list of {name: ...}, got "a"`},
		{"replaces_empty.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
			"$DIR/replaces_empty.yaml:9: descriptors[0].descriptors[0].rate_limit.replaces[0].name: must be a string, got null"},
		{"replaces_no_name.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n      replaces: [{}]\n",
			"$DIR/replaces_no_name.yaml:7: descriptors[0].rate_limit.replaces[0].name: required, and not empty"},
		{"replaces_self.yaml", "domain: test-domain\ndescriptors:\n  - key: key1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
			"$DIR/replaces_self.yaml:9: descriptors[0].descriptors[0].rate_limit.replaces[0].name: a limit cannot replace itself"},
		{"replaces_self_named_after.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      replaces: [{name: a}]\n      name: a\n      unit: day\n      requests_per_unit: 5\n",
			`$DIR/replaces_self_named_after.yaml:5: descriptors[0].rate_limit.replaces: a limit cannot replace itself ("a")`},
		{"quota_mode.yaml", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: true\n",
			"$DIR/quota_mode.yaml:4: descriptors[0].quota_mode: not supported by tokengate-rls (docs/dropin.md#not-supported)"},
		{"share_threshold_no_wildcard.yaml", "domain: d\ndescriptors:\n  - key: files\n    value: files/a\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
			`$DIR/share_threshold_no_wildcard.yaml:5: descriptors[0].share_threshold: needs a pattern: a '*' in the key or the value, got composite key "files_files/a"`},
		{"share_threshold_not_bool.yaml", "domain: d\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: 1\n",
			`$DIR/share_threshold_not_bool.yaml:5: descriptors[0].share_threshold: must be true or false, got "1"`},
	} {
		t.Run(tc.file, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "a_ok.yaml"), []byte(okYAML), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, tc.file), []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			want := strings.ReplaceAll(tc.want, "$DIR", dir)
			ds, err := rlsyaml.LoadDir(dir, true)
			if err == nil {
				// Whatever LoadDir passes NewDropinConfig must accept:
				// its refusals have no file and line.
				_, err = rls.NewDropinConfig(ds, rls.DropinOptions{})
				t.Fatalf("LoadDir accepted it; NewDropinConfig: %v; want %s", err, want)
			}
			if got := err.Error(); got != want {
				t.Errorf("got  %s\nwant %s", got, want)
			}
		})
	}
	// The valid file alone loads, and NewDropinConfig accepts it.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a_ok.yaml"), []byte(okYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := rlsyaml.LoadDir(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rls.NewDropinConfig(ds, rls.DropinOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestParseShareThreshold: share_threshold is read onto its descriptor,
// at any level, and a pattern anywhere in the key or value may have it.
func TestParseShareThreshold(t *testing.T) {
	d, err := rlsyaml.Parse("share_threshold.yaml", []byte(`domain: share-threshold-test
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: path
        value: a*b
        share_threshold: true
        rate_limit: {unit: hour, requests_per_unit: 10}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := []bool{d.Descriptors[0].ShareThreshold, d.Descriptors[1].ShareThreshold, d.Descriptors[2].ShareThreshold, d.Descriptors[2].Descriptors[0].ShareThreshold}
	if want := []bool{true, false, true, true}; !slices.Equal(got, want) {
		t.Errorf("share_threshold %v, want %v", got, want)
	}
	if _, err := rls.NewDropinConfig([]*rls.Domain{d}, rls.DropinOptions{}); err != nil {
		t.Errorf("NewDropinConfig: %v", err)
	}
}

// TestLoadDirConfigMap: a directory mounted from a Kubernetes ConfigMap
// loads each file once, with RUNTIME_IGNOREDOTFILES or without; before,
// without it, each domain was read twice (as edge.yaml and as
// ..<timestamp>/edge.yaml) and refused as a domain in two files. Outside
// such a directory (no ..data symlink), a name starting with ".." is an
// ordinary dot file.
func TestLoadDirConfigMap(t *testing.T) {
	dir := t.TempDir()
	configmap.Lay(t, dir, "2026_11_28_17_00_00.000000001", map[string]string{"edge.yaml": "domain: edge\n", "api.yaml": "domain: api\n"})
	for _, ignoreDot := range []bool{false, true} {
		ds, err := rlsyaml.LoadDir(dir, ignoreDot)
		if err != nil {
			t.Fatalf("ignoreDot %v: %v", ignoreDot, err)
		}
		var names []string
		for _, d := range ds {
			names = append(names, d.Name)
		}
		if got := strings.Join(names, " "); got != "api edge" {
			t.Errorf("ignoreDot %v: domains %q, want \"api edge\"", ignoreDot, got)
		}
	}
	// An update: the new files are read.
	configmap.Lay(t, dir, "2026_11_28_17_05_00.000000002", map[string]string{"edge.yaml": "domain: edge2\n", "api.yaml": "domain: api\n"})
	ds, err := rlsyaml.LoadDir(dir, false)
	if err != nil || len(ds) != 2 || ds[1].Name != "edge2" {
		t.Fatalf("after the update: %v %v", ds, err)
	}
	// No ..data: "..x.yaml" is a dot file like another.
	plain := t.TempDir()
	if err := os.WriteFile(filepath.Join(plain, "..x.yaml"), []byte("domain: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if ds, err := rlsyaml.LoadDir(plain, false); err != nil || len(ds) != 1 || ds[0].Name != "x" {
		t.Errorf("..x.yaml without ..data, dot files allowed: %v %v", ds, err)
	}
	if ds, err := rlsyaml.LoadDir(plain, true); err != nil || len(ds) != 0 {
		t.Errorf("..x.yaml without ..data, dot files ignored: %v %v", ds, err)
	}
}

// FuzzParseThenConfig: whatever Parse accepts, NewDropinConfig accepts
// (its refusals carry no file and line, so Parse must make them all
// first), and Parse's refusals all have the form "x.yaml:<line>: ".
func FuzzParseThenConfig(f *testing.F) {
	for _, s := range []string{
		"domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
		"domain: d\ndescriptors:\n  - {key: a_b, value: c}\n  - {key: a, value: b_c}\n",
		"domain: d\ndescriptors:\n  - key: k\n    value: v*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: b}]}\n",
		"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n    descriptors: [{key: x, rate_limit: {unit: day}}]\n",
		"'''\n", "", "domain: [", "a: \x01",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := rlsyaml.Parse("x.yaml", []byte(s))
		if err != nil {
			rest, ok := strings.CutPrefix(err.Error(), "x.yaml:")
			n, _, ok2 := strings.Cut(rest, ": ")
			if !ok || !ok2 || n == "" || strings.Trim(n, "0123456789") != "" {
				t.Fatalf("refusal without file:line: %v", err)
			}
			return
		}
		if _, err := rls.NewDropinConfig([]*rls.Domain{d}, rls.DropinOptions{}); err != nil {
			t.Fatalf("Parse accepted %q, NewDropinConfig refused it: %v", s, err)
		}
	})
}
