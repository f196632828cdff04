package ljson

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSyntaxErrors: an invalid document says where it breaks and why
// (configuration errors quote it).
func TestSyntaxErrors(t *testing.T) {
	tests := []struct{ input, expected string }{
		{`{"name":"a",}`, `line 1, column 13: trailing comma`},
		{`{"name":"a", 5}`, `line 1, column 14: expected a string key`},
		{"{\n  \"name\": \"a\"\n  \"rules\": []\n}", `line 3, column 3: expected ',' or '}'`},
		{`{"a":[1,2,]}`, `line 1, column 11: trailing comma`},
		{`{"a": tru}`, `line 1, column 7: unexpected character 't'`},
		{`{"a": "x`, `line 1, column 9: unterminated string`},
		{`{"a": 01}`, `line 1, column 7: number with a leading zero`},
		{`{"a": 1} x`, `line 1, column 10: unexpected data after the top-level value`},
		{"{\"a\":\n\n  -}", `line 3, column 4: expected a digit`},
		{`{"a" 1}`, `line 1, column 6: expected ':' after an object key`},
		{`{"a":"\q"}`, `line 1, column 8: bad escape in a string`},
		{strings.Repeat("[", 10100), `line 1, column 10001: nested too deeply`},
	}
	for _, tc := range tests {
		if json.Valid([]byte(tc.input)) {
			t.Fatalf("%q is valid JSON", tc.input)
		}
		if Valid([]byte(tc.input)) {
			t.Fatalf("%q: Valid says yes", tc.input)
		}
		if got := SyntaxError([]byte(tc.input)); got != tc.expected {
			t.Errorf("%q: got %q, want %q", tc.input, got, tc.expected)
		}
	}
}
