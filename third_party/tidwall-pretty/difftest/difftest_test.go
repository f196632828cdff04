// Package difftest checks tokengate's replacement of tidwall/pretty
// (third_party/tidwall-pretty) against the upstream module it replaces. Ugly
// must give upstream's bytes exactly. Pretty and PrettyOptions must give the
// same document for valid JSON (equal once made ugly, keys in the same
// order), but may
// break lines differently: upstream keeps short arrays on one line, the
// replacement does not. gjson calls these only for its @pretty and @ugly
// modifiers, which tokengate never uses. It is its own module because the
// replacement has upstream's module path.
package difftest

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"

	"github.com/tidwall/pretty"
)

func randomJSON(r *rand.Rand, depth int) string {
	switch n := r.IntN(8); {
	case depth > 4 || n < 3:
		return []string{`1`, `-2.5e3`, `"s"`, `"a \" b\\n"`, `true`, `null`, `"ü"`, `0`}[r.IntN(8)]
	case n < 5:
		parts := make([]string, r.IntN(4))
		for i := range parts {
			parts[i] = randomJSON(r, depth+1)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	default:
		parts := make([]string, r.IntN(4))
		for i := range parts {
			parts[i] = `"` + string(rune('z'-i)) + `" :` + randomJSON(r, depth+1)
		}
		return "{ " + strings.Join(parts, ",\n") + " }"
	}
}

func TestMatchesUpstream(t *testing.T) {
	inputs := []string{``, `{}`, `[]`, ` { "a" : [ 1 , 2 ] , "b c" : "x \" y" } `, "\n\t[ ]\n", `"unterminated  `,
		`{"b":[1,2,3],"a":{"x":null,"y":"s"},"e":{},"f":[]}`, `[[1],{"k":[true]}]`, `{"a":1,}`, `[1 2]`}
	r := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		inputs = append(inputs, randomJSON(r, 0))
	}
	enc := make([]string, len(inputs))
	for i, in := range inputs {
		enc[i] = base64.StdEncoding.EncodeToString([]byte(in))
	}
	stdin, _ := json.Marshal(enc)
	cmd := exec.Command("go", "run", "./cmd/prettyout")
	cmd.Dir = ".."
	cmd.Stdin = bytes.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("running the replacement: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != 3*len(inputs) {
		t.Fatalf("%d output lines for %d inputs", len(lines), len(inputs))
	}
	opts := &pretty.Options{Width: 8, Prefix: "", Indent: "\t", SortKeys: true}
	for i, in := range inputs {
		b := []byte(in)
		for j, want := range [][]byte{pretty.Pretty(b), pretty.PrettyOptions(b, opts), pretty.Ugly(b)} {
			got, _ := base64.StdEncoding.DecodeString(lines[3*i+j])
			if j < 2 {
				if !json.Valid(b) {
					continue // gjson hands the modifiers valid JSON only
				}
				got, want = pretty.Ugly(got), pretty.Ugly(want) // same document, any line breaks
			}
			if !bytes.Equal(got, want) {
				t.Errorf("input %q, %s: got %q, want upstream's %q", in, []string{"Pretty", "PrettyOptions", "Ugly"}[j], got, want)
			}
		}
	}
}
