package lite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// On ASCII text the ASCII case functions agree with the strings package;
// on other text they change no byte outside A-Z and a-z, and fold no pair
// that strings.EqualFold would not.
func TestASCIICaseMatchesStrings(t *testing.T) {
	inputs := []string{"", "a", "Z", "@[`{", "Content-Type", "RETRY-AFTER", "bearer ", "identity", "x-API-key",
		"\u212a", "\u017fet", "K", "\xff\xfeAb", "Éxample.COM", "ǅ", "ß"}
	r := rand.New(rand.NewPCG(9, 10))
	for range 20000 {
		b := make([]byte, r.IntN(10))
		for i := range b {
			b[i] = byte(r.IntN(128))
			if r.IntN(20) == 0 {
				b[i] = byte(128 + r.IntN(128))
			}
		}
		inputs = append(inputs, string(b))
	}
	ascii := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if s[i] >= 0x80 {
				return false
			}
		}
		return true
	}
	for _, in := range inputs {
		lo, up := ToLowerASCII(in), ToUpperASCII(in)
		if ascii(in) {
			if want := strings.ToLower(in); lo != want {
				t.Fatalf("ToLowerASCII(%q): got %q, want %q", in, lo, want)
			}
			if want := strings.ToUpper(in); up != want {
				t.Fatalf("ToUpperASCII(%q): got %q, want %q", in, up, want)
			}
		}
		for i := 0; i < len(in); i++ {
			c := in[i]
			isLetter := 'a' <= c|0x20 && c|0x20 <= 'z'
			if !isLetter && (lo[i] != c || up[i] != c) {
				t.Fatalf("%q: byte %d (%#x) changed to %#x / %#x", in, i, c, lo[i], up[i])
			}
		}
	}
	for range 100000 {
		a, b := inputs[r.IntN(len(inputs))], inputs[r.IntN(len(inputs))]
		if r.IntN(2) == 0 { // a case-changed copy
			b = flipCase(a, r)
		}
		got, want := EqualFoldASCII(a, b), strings.EqualFold(a, b)
		if got != want && (ascii(a) && ascii(b) || got) {
			t.Fatalf("EqualFoldASCII(%q, %q): got %v, strings.EqualFold says %v", a, b, got, want)
		}
	}
	for _, c := range []struct{ a, b string }{{"\u212a", "k"}, {"\u017fet", "SET"}, {"ǅ", "ǆ"}} {
		if EqualFoldASCII(c.a, c.b) {
			t.Errorf("EqualFoldASCII(%q, %q): got true, want false", c.a, c.b)
		}
	}
}

func flipCase(s string, r *rand.Rand) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c|0x20 && c|0x20 <= 'z' && r.IntN(2) == 0 {
			b[i] = c ^ 0x20
		}
	}
	return string(b)
}

func TestReplaceByteMatchesStrings(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for range 20000 {
		b := make([]byte, r.IntN(12))
		for i := range b {
			b[i] = "ab-_\"'\xff"[r.IntN(7)]
		}
		s := string(b)
		for _, p := range [][2]byte{{'-', '_'}, {'"', '\''}} {
			if got, want := ReplaceByte(s, p[0], p[1]), strings.ReplaceAll(s, string(p[0]), string(p[1])); got != want {
				t.Fatalf("ReplaceByte(%q, %q, %q): got %q, want %q", s, p[0], p[1], got, want)
			}
		}
	}
}
