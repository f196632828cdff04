package pretty

import "testing"

func TestUgly(t *testing.T) {
	tests := []struct{ input, expected string }{
		{` { "a" : [ 1 , 2 ] , "b c" : "x \" y" } `, `{"a":[1,2],"b c":"x \" y"}`},
		{"\n\t[ ]\n", `[]`},
		{`"unterminated  `, `"unterminated  `},
	}
	for _, tc := range tests {
		if got := string(Ugly([]byte(tc.input))); got != tc.expected {
			t.Errorf("Ugly(%q): got %q, want %q", tc.input, got, tc.expected)
		}
	}
}

func TestPretty(t *testing.T) {
	tests := []struct {
		input    string
		opts     *Options
		expected string
	}{
		{`{"b":[1,2,3],"a":{"x":null,"y":"s"},"e":{},"f":[]}`, nil,
			"{\n  \"b\": [1,2,3],\n  \"a\": {\n    \"x\": null,\n    \"y\": \"s\"\n  },\n  \"e\": {},\n  \"f\": []\n}\n"},
		{`{"b":1,"a":2}`, &Options{Width: 80, Indent: "\t", SortKeys: true},
			"{\n\t\"a\": 2,\n\t\"b\": 1\n}\n"},
		{`[1,2,3]`, &Options{Width: 4, Indent: " "}, "[\n 1,\n 2,\n 3\n]\n"},
		{`[[1],{"k":[true]}]`, &Options{Width: 80, Prefix: "> ", Indent: "  "},
			"> [\n>   [1],\n>   {\n>     \"k\": [true]\n>   }\n> ]\n"},
		{`"s"`, nil, "\"s\"\n"},
	}
	for _, tc := range tests {
		if got := string(PrettyOptions([]byte(tc.input), tc.opts)); got != tc.expected {
			t.Errorf("PrettyOptions(%q): got\n%s\nwant\n%s", tc.input, got, tc.expected)
		}
	}
}

// Malformed input never panics or loops.
func FuzzPretty(f *testing.F) {
	for _, s := range []string{`{"a":[1,{"b":2}]}`, `{`, `[,,]`, `{"a"`, `"\`, `}{`, `:::`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		Pretty([]byte(s))
		Ugly([]byte(s))
	})
}
