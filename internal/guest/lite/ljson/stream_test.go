package ljson

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func scanAll(p Pointer, doc string, cuts ...int) (float64, bool) {
	var s PointerScanner
	s.Reset(p)
	prev := 0
	for _, c := range cuts {
		s.Write([]byte(doc[prev:c]))
		prev = c
	}
	s.Write([]byte(doc[prev:]))
	s.End()
	return s.Found()
}

func TestPointerScannerEveryBoundary(t *testing.T) {
	doc := `{"id":"chatcmpl-1","choices":[{"message":{"content":"a \"usage\": {\"total_tokens\": 9}"}}],` +
		`"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42},"x":[1,{"usage":{"total_tokens":7}}]}`
	p, ok := ParsePointer("/usage/total_tokens")
	if !ok {
		t.Fatal("pointer")
	}
	for i := 0; i <= len(doc); i++ {
		for j := i; j <= len(doc); j += 7 {
			if v, ok := scanAll(p, doc, i, j); !ok || v != 42 {
				t.Fatalf("cut at %d and %d: got %v %v, want 42", i, j, v, ok)
			}
		}
	}
	// One byte at a time.
	var s PointerScanner
	s.Reset(p)
	for i := 0; i < len(doc); i++ {
		s.Write([]byte{doc[i]})
	}
	if v, ok := s.Found(); !ok || v != 42 || !s.Done() {
		t.Fatalf("byte by byte: got %v %v done %v", v, ok, s.Done())
	}
}

func TestPointerScannerCases(t *testing.T) {
	tests := []struct {
		name, ptr, doc string
		want           float64
		found          bool
	}{
		{"top level", "/n", `{"n": 5}`, 5, true},
		{"array index", "/a/1/v", `{"a":[{"v":1},{"v":2},{"v":3}]}`, 2, true},
		{"array index of scalars", "/a/2", `{"a":[10, 20, 30]}`, 30, true},
		{"nested arrays", "/a/1/0", `{"a":[[1,2],[3,4]]}`, 3, true},
		{"empty containers", "/b", `{"a":[],"c":{},"b":8}`, 8, true},
		{"escaped key", "/a~1b/c~0d", `{"a/b":{"c~d":4}}`, 4, true},
		{"unicode escape in key", "/k\u00e9y", `{"k\u00e9y": 3}`, 3, true},
		{"key escaped in JSON", "/key", `{"k\u0065y": 6}`, 6, true},
		{"last of repeated keys", "/n", `{"n":1,"n":2}`, 2, true},
		{"not a number", "/n", `{"n":"5"}`, 0, false},
		{"negative ignored", "/n", `{"n":-5}`, 0, false},
		{"exponent", "/n", `{"n":1.5e3}`, 1500, true},
		{"missing", "/m", `{"n":1}`, 0, false},
		{"deeper than the value", "/n/x", `{"n":1}`, 0, false},
		{"same name elsewhere", "/u/t", `{"x":{"u":{"t":1}},"u":{"t":2}}`, 2, true},
		{"in a string", "/u", `{"s":"{\"u\":1}"}`, 0, false},
		{"not JSON", "/n", `{"n" 1}`, 0, false},
		{"trailing comma", "/n", `{"a":[1,],"n":1}`, 0, false},
		{"root array", "/0", `[7]`, 7, true},
		{"literals", "/n", `{"a":true,"b":null,"c":false,"n":9}`, 9, true},
		{"leading zero index never matches", "/a/01", `{"a":[1,2]}`, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := ParsePointer(tt.ptr)
			if !ok {
				t.Fatalf("ParsePointer(%q) failed", tt.ptr)
			}
			if v, ok := scanAll(p, tt.doc); ok != tt.found || v != tt.want {
				t.Errorf("got %v %v, want %v %v", v, ok, tt.want, tt.found)
			}
		})
	}
}

func TestParsePointer(t *testing.T) {
	for _, s := range []string{"", "/", "x", "/a~", "/a~2", "/1/2/3/4/5/6/7/8/9"} {
		if _, ok := ParsePointer(s); ok && s != "/" {
			t.Errorf("ParsePointer(%q) accepted", s)
		}
	}
	if p, ok := ParsePointer("/a~1b/~0"); !ok || len(p) != 2 || p[0] != "a/b" || p[1] != "~" || p.String() != "/a~1b/~0" {
		t.Errorf("got %q %v", p, ok)
	}
}

// TestPointerScannerMatchesEncodingJSON: on generated documents, the number
// at every path the document has, found in random pieces, is the one
// encoding/json finds.
func TestPointerScannerMatchesEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	checked := 0
	for n := 0; n < 3000; n++ {
		doc := randomJSON(r, 0)
		var v any
		if json.Unmarshal([]byte(doc), &v) != nil {
			continue
		}
		paths(v, nil, func(p Pointer, leaf any) {
			want, isNum := leaf.(float64)
			if len(p) == 0 || len(p) > MaxPointerTokens || !isNum || want < 0 {
				return
			}
			if surrogates(p) {
				return
			}
			var cuts []int
			for c := 0; c < len(doc); c += 1 + r.IntN(5) {
				cuts = append(cuts, c)
			}
			got, ok := scanAll(p, doc, cuts...)
			if !ok || got != want {
				t.Fatalf("%s in %s: got %v %v, want %v", p, doc, got, ok, want)
			}
			checked++
		})
	}
	if checked < 100 {
		t.Fatalf("only %d paths checked", checked)
	}
}

// surrogates reports whether a token holds a character outside the BMP or
// the replacement of an invalid surrogate: keys the scanner documents as
// never matching (escaped surrogate pairs).
func surrogates(p Pointer) bool {
	for _, tok := range p {
		if strings.ContainsRune(tok, utf8.RuneError) {
			return true
		}
		for i := 0; i < len(tok); i++ {
			if tok[i] >= 0xF0 {
				return true
			}
		}
	}
	return false
}

func paths(v any, prefix Pointer, fn func(Pointer, any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			paths(e, append(append(Pointer(nil), prefix...), k), fn)
		}
	case []any:
		for i, e := range x {
			paths(e, append(append(Pointer(nil), prefix...), strconv.Itoa(i)), fn)
		}
	default:
		fn(prefix, v)
	}
}

func BenchmarkPointerScanner(b *testing.B) {
	doc := []byte(`{"id":"x","choices":[{"message":{"content":"` + string(make([]byte, 0)) + `hello world, a long answer"}}],"usage":{"total_tokens":42}}`)
	p, _ := ParsePointer("/usage/total_tokens")
	var s PointerScanner
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s.Reset(p)
		s.Write(doc)
	}
}

// FuzzPointerScanner: any bytes, split anywhere, never panic, and the
// result does not depend on where the document was split.
func FuzzPointerScanner(f *testing.F) {
	f.Add([]byte(`{"usage":{"total_tokens":42}}`), uint(7))
	f.Add([]byte(`[[[[[[`), uint(2))
	f.Add([]byte(`{"usage":{"total_tokens":4e2},"usage":{"total_tokens":"x"}}`), uint(30))
	p, _ := ParsePointer("/usage/total_tokens")
	f.Fuzz(func(t *testing.T, doc []byte, cut uint) {
		c := int(cut % uint(len(doc)+1))
		v1, ok1 := scanAll(p, string(doc))
		v2, ok2 := scanAll(p, string(doc), c)
		if ok1 != ok2 || (ok1 && v1 != v2) {
			t.Fatalf("%q: whole %v %v, split at %d %v %v", doc, v1, ok1, c, v2, ok2)
		}
	})
}

func TestPointerScannerDeepNesting(t *testing.T) {
	p, _ := ParsePointer("/a")
	var s PointerScanner
	s.Reset(p)
	s.Write([]byte(strings.Repeat("[", 100000)))
	if !s.Failed() || !s.Done() {
		t.Fatal("100,000 levels: want the scan stopped")
	}
	s.Reset(p)
	s.Write([]byte(strings.Repeat("[", 511) + `{"a":1}` + strings.Repeat("]", 511)))
	if _, ok := s.Found(); ok || s.Failed() {
		t.Fatal("511 levels: want followed, /a not at the root")
	}
}
