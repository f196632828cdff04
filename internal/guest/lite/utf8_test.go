package lite

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func TestToValidUTF8MatchesStrings(t *testing.T) {
	inputs := []string{"", "a", "\xff", "\xff\xfe", "a\xffb", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "é\xc3", "\uFFFD\xff", "日本\x80語"}
	pieces := []string{"a", "é", "日", "😀", "\xff", "\x80", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf0\x9f", "\uFFFD"}
	r := rand.New(rand.NewPCG(11, 12))
	for range 20000 {
		var b strings.Builder
		for range r.IntN(8) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		inputs = append(inputs, b.String())
	}
	for _, in := range inputs {
		if got, want := ToValidUTF8(in), strings.ToValidUTF8(in, "\uFFFD"); got != want {
			t.Fatalf("ToValidUTF8(%q): got %q, want %q", in, got, want)
		}
	}
}
