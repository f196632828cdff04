package ljson

import (
	"strings"
	"testing"
)

// TestPointerScannerLax: what lax readers (Python's json, pydantic) read
// at /n, and what the scanner says of it: the number (Found), the number a
// string holds (Quoted), or that it cannot read it (Unreadable). Every
// document is also fed one byte at a time.
func TestPointerScannerLax(t *testing.T) {
	tests := []struct {
		name, doc      string
		found, quoted  float64 // -1: none
		wantUnreadable bool
	}{
		{"plain", `{"n":5}`, 5, -1, false},
		{"a string holding a number", `{"n":"500"}`, -1, 500, false},
		{"a string with an exponent", `{"n":"5e2"}`, -1, 500, false},
		{"an escaped string", `{"n":"\u0035\u0030"}`, -1, 50, false},
		{"a string then a number", `{"n":"7","n":3}`, 3, 7, false},
		{"a string holding no number", `{"n":"five"}`, -1, -1, true},
		{"a string holding a negative number", `{"n":"-5"}`, -1, -1, true},
		{"a string holding a surrogate", `{"n":"5\ud800"}`, -1, -1, true},
		{"a string longer than 40 bytes", `{"n":"` + strings.Repeat("1", 41) + `"}`, -1, -1, true},
		{"a string elsewhere", `{"m":"five","n":2}`, 2, -1, false},
		{"a number of 40 bytes", `{"n":` + strings.Repeat("1", 40) + `}`, 1111111111111111111111111111111111111111, -1, false},
		{"a number longer than 40 bytes", `{"n":` + strings.Repeat("1", 41) + `}`, -1, -1, true},
		{"a long number elsewhere", `{"m":` + strings.Repeat("1", 60) + `,"n":1}`, 1, -1, false},
		{"a UTF-8 byte order mark", "\xef\xbb\xbf{\"n\":4}", 4, -1, false},
		{"a byte order mark after a space", " \xef\xbb\xbf{\"n\":4}", -1, -1, false},
		{"NaN and Infinity", `{"a":NaN,"b":Infinity,"c":-Infinity,"n":6}`, 6, -1, false},
		{"NaN at the pointer", `{"n":NaN}`, -1, -1, false},
		{"UTF-16LE", "{\x00\"\x00n\x00\"\x00:\x005\x00}\x00", -1, -1, true},
		{"UTF-16BE", "\x00{\x00\"\x00n\x00\"\x00:\x005\x00}", -1, -1, true},
		{"a UTF-16 byte order mark", "\xff\xfe{\x00", -1, -1, true},
		{"nesting past 512", `{"a":` + strings.Repeat("[", 513) + strings.Repeat("]", 513) + `,"n":1}`, -1, -1, true},
		{"nesting of 512", strings.Repeat("[", 511) + `{"n":1}` + strings.Repeat("]", 511), -1, -1, false},
		{"not JSON", `{"n" 1}`, -1, -1, false},
	}
	p, _ := ParsePointer("/n")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, bytewise := range []bool{false, true} {
				var s PointerScanner
				s.Reset(p)
				if bytewise {
					for i := 0; i < len(tt.doc); i++ {
						s.Write([]byte{tt.doc[i]})
					}
				} else {
					s.Write([]byte(tt.doc))
				}
				s.End()
				f, fok := s.Found()
				q, qok := s.Quoted()
				if !fok {
					f = -1
				}
				if !qok {
					q = -1
				}
				if f != tt.found || q != tt.quoted || s.Unreadable() != tt.wantUnreadable {
					t.Errorf("bytewise %v: got found %v quoted %v unreadable %v, want %v %v %v",
						bytewise, f, q, s.Unreadable(), tt.found, tt.quoted, tt.wantUnreadable)
				}
			}
		})
	}
}

// FuzzPointerScannerLax: what Quoted and Unreadable report does not depend
// on where the document was split, byte order marks and UTF-16 included.
func FuzzPointerScannerLax(f *testing.F) {
	f.Add([]byte("\xef\xbb\xbf{\"n\":\"500\"}"), uint(2))
	f.Add([]byte("\xff\xfe{\x00\"\x00"), uint(1))
	f.Add([]byte(`{"n":NaN,"n":-Infinity,"n":"5e2"}`), uint(9))
	f.Add([]byte(`{"n":"`+strings.Repeat("9", 41)+`"}`), uint(20))
	p, _ := ParsePointer("/n")
	scan := func(parts ...[]byte) (float64, bool, bool) {
		var s PointerScanner
		s.Reset(p)
		for _, b := range parts {
			s.Write(b)
		}
		s.End()
		q, ok := s.Quoted()
		return q, ok, s.Unreadable()
	}
	f.Fuzz(func(t *testing.T, doc []byte, cut uint) {
		c := int(cut % uint(len(doc)+1))
		q1, ok1, u1 := scan(doc)
		q2, ok2, u2 := scan(doc[:c], doc[c:])
		if ok1 != ok2 || (ok1 && q1 != q2) || u1 != u2 {
			t.Fatalf("%q: whole %v %v %v, split at %d %v %v %v", doc, q1, ok1, u1, c, q2, ok2, u2)
		}
	})
}

// TestPointerScannerFolded: with Fold, the keys Go's encoding/json
// matches to a field whose name is the pointer's token (any case of ASCII
// letters, the Kelvin sign for k, the long s for s; issue 30: the scanner
// did not see {"MAX_TOKENS":5000}), and the largest number when the
// pointer is met several times, since a lax reader may keep the first or
// the last. Reset (the response's usage) still compares exactly and keeps
// the last. Every document is also fed one byte at a time.
func TestPointerScannerFolded(t *testing.T) {
	tests := []struct {
		name, ptr, doc string
		found, quoted  float64 // -1: none; with Reset, then with ResetFolded
		exact          [2]float64
	}{
		{"upper case", "/max_tokens", `{"MAX_TOKENS":5}`, 5, -1, [2]float64{-1, -1}},
		{"mixed case", "/max_tokens", `{"Max_Tokens":5}`, 5, -1, [2]float64{-1, -1}},
		{"escaped upper case", "/max_tokens", `{"\u004dAX_TOKENS":5}`, 5, -1, [2]float64{-1, -1}},
		{"Kelvin sign, raw", "/max_tokens", "{\"max_to\u212aens\":5}", 5, -1, [2]float64{-1, -1}},
		{"Kelvin sign, escaped", "/max_tokens", `{"max_to\u212Aens":5}`, 5, -1, [2]float64{-1, -1}},
		{"long s", "/max_tokens", "{\"max_token\u017f\":5}", 5, -1, [2]float64{-1, -1}},
		{"a Kelvin sign cut short", "/max_tokens", "{\"max_to\xe2\x84ens\":5}", -1, -1, [2]float64{-1, -1}},
		{"another sign of the same lead byte", "/max_tokens", "{\"max_to\u2122ens\":5}", -1, -1, [2]float64{-1, -1}},
		{"not a letter: @ is not `", "/a`b", `{"a@b":5}`, -1, -1, [2]float64{-1, -1}},
		{"not a letter: [ is not {", "/a{", `{"a[":5}`, -1, -1, [2]float64{-1, -1}},
		{"a longer key", "/max_tokens", `{"MAX_TOKENSX":5}`, -1, -1, [2]float64{-1, -1}},
		{"nested, folded at each level", "/usage/max", `{"USAGE":{"Max":7}}`, 7, -1, [2]float64{-1, -1}},
		{"repeated, larger first", "/n", `{"n":9,"n":2}`, 9, -1, [2]float64{2, -1}},
		{"repeated, larger last", "/n", `{"n":2,"n":9}`, 9, -1, [2]float64{9, -1}},
		{"two spellings, larger first", "/n", `{"N":9,"n":2}`, 9, -1, [2]float64{2, -1}},
		{"strings repeated, larger first", "/n", `{"n":"9","n":"2"}`, -1, 9, [2]float64{-1, 2}},
		{"a string and a number", "/n", `{"N":"9","n":2}`, 2, 9, [2]float64{2, -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := ParsePointer(tt.ptr)
			if !ok {
				t.Fatalf("pointer %q", tt.ptr)
			}
			for _, folded := range []bool{false, true} {
				want := [2]float64{tt.found, tt.quoted}
				if !folded {
					want = tt.exact
				}
				for _, bytewise := range []bool{false, true} {
					var s PointerScanner
					s.Reset(p)
					s.Fold = folded
					if bytewise {
						for i := 0; i < len(tt.doc); i++ {
							s.Write([]byte{tt.doc[i]})
						}
					} else {
						s.Write([]byte(tt.doc))
					}
					s.End()
					got := [2]float64{-1, -1}
					if v, ok := s.Found(); ok {
						got[0] = v
					}
					if v, ok := s.Quoted(); ok {
						got[1] = v
					}
					if got != want || s.Unreadable() || s.Failed() {
						t.Errorf("folded %v bytewise %v: found, quoted %v (unreadable %v, failed %v), want %v",
							folded, bytewise, got, s.Unreadable(), s.Failed(), want)
					}
				}
			}
		})
	}
}
