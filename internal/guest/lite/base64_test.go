package lite

import (
	"bytes"
	"encoding/base64"
	"math/rand/v2"
	"strings"
	"testing"
)

// DecodeBase64 must agree with encoding/base64 on every input, valid or
// not, for the four encodings the guest uses.
func TestDecodeBase64MatchesLibrary(t *testing.T) {
	encodings := []struct {
		name        string
		url, padded bool
		enc         *base64.Encoding
	}{
		{"StdEncoding", false, true, base64.StdEncoding},
		{"RawStdEncoding", false, false, base64.RawStdEncoding},
		{"URLEncoding", true, true, base64.URLEncoding},
		{"RawURLEncoding", true, false, base64.RawURLEncoding},
	}
	inputs := []string{"", "=", "==", "A", "AA", "AA=", "AA==", "AA===", "AAA", "AAA=", "AAA==", "AAAA", "AAAA=",
		"AA\n==", "AA=\n=", "AA==\r\n", "AA==x", "\n", "A\nA\rA\nA", "AB==", "AB=A", "ABC=\n\nA", "+/-_", "-_+/",
		"eyJzdWIiOiJhbGljZSJ9", "eyJzdWIiOiJhbGljZSJ9==", "a b", "AAAA\x00", "AAA\xff"}
	r := rand.New(rand.NewPCG(7, 8))
	alphabet := "AZaz09+/-_=\r\n.! "
	for range 50000 {
		// noise over the alphabets and their neighbours
		var b strings.Builder
		for range r.IntN(14) {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		inputs = append(inputs, b.String())
		// a real encoding, sometimes with line breaks or a cut
		raw := make([]byte, r.IntN(12))
		for i := range raw {
			raw[i] = byte(r.IntN(256))
		}
		s := encodings[r.IntN(4)].enc.EncodeToString(raw)
		if len(s) > 0 && r.IntN(3) == 0 {
			i := r.IntN(len(s) + 1)
			s = s[:i] + []string{"\n", "\r\n", "=", ""}[r.IntN(4)] + s[i:]
		}
		if len(s) > 0 && r.IntN(5) == 0 {
			s = s[:r.IntN(len(s))]
		}
		inputs = append(inputs, s)
	}
	for _, e := range encodings {
		for _, in := range inputs {
			got, gotOK := DecodeBase64(in, e.url, e.padded)
			want, err := e.enc.DecodeString(in)
			if gotOK != (err == nil) || gotOK && !bytes.Equal(got, want) {
				t.Fatalf("%s: DecodeBase64(%q): got %x %v, want %x (error %v)", e.name, in, got, gotOK, want, err)
			}
		}
	}
}
