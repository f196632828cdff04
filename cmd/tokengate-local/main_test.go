package main

import (
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

func TestRuleNames(t *testing.T) {
	tests := []struct {
		name        string
		input       string
		expected    []string
		expectedErr string
	}{
		{name: "bundle with fallbacks", input: `{"bundle_version":1,"policies":[
			{"id":"api","spec":{"rules":[{"name":"a","algorithm_config":{"rps":1,"burst":1}},{"name":"b","algorithm_config":{"rps":1,"burst":1}}],
			 "fallback_limit":{"algorithm_config":{"rps":1,"burst":1}}}},
			{"id":"x","spec":{"rules":[{"name":"c","algorithm_config":{"rps":1,"burst":1}}]}}]}`,
			expected: []string{"a", "b", "api-fallback", "c"}},
		{name: "rules", input: `{"rules":[{"name":"per-ip","algorithm_config":{"rps":1,"burst":1}}]}`, expected: []string{"per-ip"}},
		{name: "single", input: `{"name":"only","algorithm_config":{"rps":5,"burst":5}}`, expected: []string{"only"}},
		{name: "empty", input: ``, expectedErr: "(invalid configuration: configuration is empty)"},
		{name: "not json", input: `{"rules":`, expectedErr: "(invalid configuration: configuration is not valid JSON: line 1, column 10: unexpected end of input)"},
		{name: "invalid", input: `{"name":"a","algorithm_config":{"rps":5}}`, expectedErr: "(invalid configuration: algorithm_config.burst: is required)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ruleNames([]byte(tc.input))
			if tc.expectedErr != "" {
				if err == nil || err.Error() != tc.expectedErr {
					t.Fatalf("got error %v, want %q", err, tc.expectedErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.expected) {
				t.Errorf("got %q, %v; want %q", got, err, tc.expected)
			}
		})
	}
}

func TestWriteSharedData(t *testing.T) {
	var b strings.Builder
	err := writeSharedData(&b, []wasmhost.Entry{{Key: "tg:a", Value: "4.5:1700000000", CAS: 3}, {Key: "tg:b", Value: "\x00\n", CAS: 9}}, 42)
	want := "# 2 keys, 42 bytes of keys and values\n" +
		`"tg:a" cas=3 value="4.5:1700000000"` + "\n" +
		`"tg:b" cas=9 value="\x00\n"` + "\n"
	if err != nil || b.String() != want {
		t.Errorf("got %q, %v\nwant %q", b.String(), err, want)
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name        string
		args        []string
		expected    settings
		expectedErr string
	}{
		{name: "defaults", expected: settings{wasm: "build/tokengate.wasm", envoy: "envoy.yaml", listen: "127.0.0.1:10000",
			admin: "127.0.0.1:10001", logLevel: "info"}},
		{name: "all", args: []string{"-wasm", "x.wasm", "-config", "c.json", "-listen", ":0", "-admin", "", "-workers", "4",
			"-upstream", "http://u", "-kong", "-log-level", "debug", "-plugin", "p", "-no-filter", "-check", "f"},
			expected: settings{wasm: "x.wasm", envoy: "envoy.yaml", config: "c.json", plugin: "p", listen: ":0", admin: "",
				upstream: "http://u", workers: 4, kong: true, noFilter: true, check: "f", logLevel: "debug"}},
		{name: "stray argument", args: []string{"extra"}, expectedErr: `unexpected arguments: ["extra"]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFlags(tc.args, io.Discard)
			if tc.expectedErr != "" {
				if err == nil || err.Error() != tc.expectedErr {
					t.Fatalf("got error %v, want %q", err, tc.expectedErr)
				}
				return
			}
			if err != nil || got != tc.expected {
				t.Errorf("got %+v, %v\nwant %+v", got, err, tc.expected)
			}
		})
	}
	if _, err := parseLevel("warn"); err != nil {
		t.Errorf("parseLevel(warn): %v", err)
	}
	if _, err := parseLevel("loud"); err == nil || err.Error() != `-log-level: unknown level "loud"` {
		t.Errorf("parseLevel(loud): %v", err)
	}
}
