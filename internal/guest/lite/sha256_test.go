package lite

import (
	"crypto/sha256"
	"strings"
	"testing"
)

func TestSHA256MatchesCrypto(t *testing.T) {
	for n := 0; n <= 300; n++ {
		v := strings.Repeat("ab\xff", n)[:n]
		if got, want := SHA256String(v), sha256.Sum256([]byte(v)); got != want {
			t.Fatalf("len %d: got %x, want %x", n, got, want)
		}
	}
}

func BenchmarkSHA256String(b *testing.B) {
	v := strings.Repeat("x", 200)
	b.ReportAllocs()
	for b.Loop() {
		SHA256String(v)
	}
}
