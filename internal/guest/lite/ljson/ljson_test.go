package ljson

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// randomJSON returns a random document, valid unless broken is set, with
// the escapes and number forms that matter.
func randomJSON(r *rand.Rand, depth int) string {
	strs := []string{`"a"`, `""`, `"a\"b"`, `"\u00fc\n"`, `"\ud83d\ude00"`, `"\ud800x"`, `"tab\there"`, `"sl\/ash"`, `"ü"`, `"k\u0065y"`}
	nums := []string{`0`, `-1`, `2.5`, `1e3`, `-0.0e-2`, `123456789012345678901234567890`, `1E+2`}
	switch n := r.IntN(10); {
	case depth > 5 || n < 4:
		all := append(append([]string{`true`, `false`, `null`}, strs...), nums...)
		return all[r.IntN(len(all))]
	case n < 7:
		parts := make([]string, r.IntN(5))
		for i := range parts {
			parts[i] = randomJSON(r, depth+1)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	default:
		parts := make([]string, r.IntN(5))
		keys := []string{`"a"`, `"b"`, `"name"`, `"k\u0065y"`, `""`, `"a"`}
		for i := range parts {
			parts[i] = keys[r.IntN(len(keys))] + " :" + randomJSON(r, depth+1)
		}
		return "{ " + strings.Join(parts, ",\n") + "}"
	}
}

// same compares a Result with gjson's for the same value, recursively.
func same(t *testing.T, doc string, got Result, want gjson.Result) {
	t.Helper()
	if got.Exists() != want.Exists() || got.Type != Type(want.Type) || got.Raw != want.Raw {
		t.Fatalf("%s: got %v %q, gjson %v %q", doc, got.Type, got.Raw, want.Type, want.Raw)
	}
	if got.Type == String && got.Str != want.Str && utf8.ValidString(want.Str) {
		// gjson keeps a lone surrogate's escape as U+FFFD too; compare
		// with encoding/json, the verifiers' reading, when they differ.
		var s string
		if err := json.Unmarshal([]byte(got.Raw), &s); err != nil || s != got.Str {
			t.Fatalf("%s: string %q, gjson %q, encoding/json %q", doc, got.Str, want.Str, s)
		}
	}
	// Numbers: Raw is compared above; String() is Raw here (numbers as
	// written), where gjson reformats them.
	if got.Type != JSON {
		return
	}
	var gk, gv []Result
	got.ForEach(func(k, v Result) bool { gk, gv = append(gk, k), append(gv, v); return true })
	var wk, wv []gjson.Result
	want.ForEach(func(k, v gjson.Result) bool { wk, wv = append(wk, k), append(wv, v); return true })
	if len(gk) != len(wk) {
		t.Fatalf("%s: %d members, gjson %d", doc, len(gk), len(wk))
	}
	for i := range gk {
		if gk[i].Str != wk[i].Str || gk[i].String() != wk[i].String() {
			t.Fatalf("%s: key %d %q (%q), gjson %q (%q)", doc, i, gk[i].Str, gk[i].String(), wk[i].Str, wk[i].String())
		}
		same(t, doc, gv[i], wv[i])
	}
	if got.IsObject() {
		for _, name := range []string{"a", "b", "name", "missing", ""} {
			if name == "" {
				continue // gjson's path "" means the document itself
			}
			same(t, doc+" .Get("+name+")", got.Get(name), want.Get(name))
		}
	}
	if ga, wa := got.Array(), want.Array(); len(ga) != len(wa) {
		t.Fatalf("%s: Array %d, gjson %d", doc, len(ga), len(wa))
	}
}

// TestMatchesGjson: on valid documents ljson reads what gjson reads (types,
// raw text, unescaped strings, members in order, Get of a member, Array);
// Valid agrees with encoding/json on valid and broken documents.
func TestMatchesGjson(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 5000 {
		doc := randomJSON(r, 0)
		if i%3 == 0 {
			doc = " \n" + doc + "\t "
		}
		if !Valid([]byte(doc)) || !json.Valid([]byte(doc)) {
			t.Fatalf("%q: Valid %v, encoding/json %v", doc, Valid([]byte(doc)), json.Valid([]byte(doc)))
		}
		same(t, doc, Parse(doc), gjson.Parse(strings.TrimSpace(doc))) // gjson keeps trailing space in Raw
		// Broken copies: cut, a byte changed, a trailing comma.
		for _, bad := range []string{doc[:r.IntN(len(doc)+1)], doc + ",", strings.Replace(doc, ":", "", 1),
			strings.Replace(doc, `"`, "", 1), strings.Replace(doc, "]", ",]", 1)} {
			if got, want := Valid([]byte(bad)), json.Valid([]byte(bad)); got != want {
				t.Fatalf("%q: Valid %v, encoding/json %v", bad, got, want)
			}
		}
	}
}

func TestSyntaxErrorPosition(t *testing.T) {
	for doc, want := range map[string]string{
		"{\n  \"a\": 1\n  \"b\": 2}": `line 3, column 3: expected ',' or '}'`,
		`[1, 2,]`:                    `line 1, column 7: trailing comma`,
		`{"a": 01}`:                  `line 1, column 7: number with a leading zero`,
		"\"a\x01\"":                  `line 1, column 3: control character in a string`,
		`{"a": 1} x`:                 `line 1, column 10: unexpected data after the top-level value`,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001): "line 1, column 10001: nested too deeply",
	} {
		if got := SyntaxError([]byte(doc)); got != want {
			t.Errorf("%.40q: %q, want %q", doc, got, want)
		}
	}
	// The same limit as encoding/json's.
	for _, n := range []int{10000, 10001} {
		doc := []byte(strings.Repeat("[", n) + strings.Repeat("]", n))
		if Valid(doc) != json.Valid(doc) {
			t.Errorf("%d levels: Valid %v, encoding/json %v", n, Valid(doc), json.Valid(doc))
		}
	}
}

func TestNotAValue(t *testing.T) {
	for _, s := range []string{"", "x", "{", `"abc`, "[1,", "tru"} {
		r := Parse(s)
		r.ForEach(func(k, v Result) bool { return true })
		_ = r.Get("a")
		_ = r.Array()
		_ = r.String() + strconv.Itoa(int(r.Type))
	}
}
