package sharedstate

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

// The codec's fast paths (appendMicro, parseMicro) must agree with strconv
// to the bit, or a stored bucket would drift on every round trip.

func TestAppendMicroMatchesStrconv(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	values := []float64{0, 1e-6, 0.5, 1, 999999.999999, 1736940000, 1736940000.000001,
		maxFastMicro - 1e-6, maxFastMicro, 1e12, math.Nextafter(1, 2), 0.1, 2.5e-7}
	for range 200000 {
		switch r.IntN(4) {
		case 0:
			values = append(values, Quantize(1.6e9+r.Float64()*1e9))
		case 1:
			values = append(values, floorMicro(r.Float64()*1e6))
		case 2:
			values = append(values, r.Float64()*float64(r.IntN(1<<34)))
		default:
			values = append(values, float64(r.Uint64N(1<<53))/micro)
		}
	}
	for _, x := range values {
		got := string(appendMicro(nil, x))
		want := strconv.FormatFloat(x, 'f', 6, 64)
		if got != want {
			t.Fatalf("appendMicro(%v): got %q, want %q", x, got, want)
		}
	}
}

func TestParseMicroMatchesStrconv(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	inputs := []string{"0", "0.0", "1", "1.5", "000001.000001", "9007199254.740991", "9007199254.740992",
		"1736940000.123456", "1736940000.1234567", "123.", "99999999999999999999"}
	for range 200000 {
		s := strconv.FormatUint(r.Uint64N(1<<uint(r.IntN(40)+1)), 10)
		if r.IntN(4) > 0 {
			s += "."
			for range 1 + r.IntN(6) {
				s += strconv.Itoa(r.IntN(10))
			}
		}
		inputs = append(inputs, s)
	}
	for _, in := range inputs {
		if !isDecimal([]byte(in)) {
			continue
		}
		got, ok := parseMicro([]byte(in))
		if !ok {
			continue
		}
		want, err := strconv.ParseFloat(in, 64)
		if err != nil || got != want {
			t.Fatalf("parseMicro(%q): got %v, want %v (%v)", in, got, want, err)
		}
	}
}

func TestParseMicroFallsBack(t *testing.T) {
	for _, in := range []string{"1.1234567", "9007199254.740992", "99999999999999999999"} {
		if v, ok := parseMicro([]byte(in)); ok {
			t.Errorf("parseMicro(%q) = %v, want a fall back to strconv", in, v)
		}
	}
}

// parseStateFast must agree with the strict parser wherever it accepts.
func TestParseStateFastMatchesStrict(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	pieces := []string{"0", "1", "9", "12", "1736940000", ".", "..", ".5", ":", "123456", "1234567", "-", "e", " ", "00"}
	inputs := []string{"0:1", "1.5:1736940000.000001", "0.000000:0.000000", "1:0", "1.:2", ":", "1:2:3", "1:2:", "1.1234567:2",
		"9007199254.740991:1", "9007199254.740992:1", "5:1736940000.123456:10.0.0.1", "5:1736940000.123456:2001:db8::1"}
	for range 300000 {
		var b []byte
		for range 1 + r.IntN(6) {
			b = append(b, pieces[r.IntN(len(pieces))]...)
		}
		inputs = append(inputs, string(b))
		inputs = append(inputs, string(AppendSlotValue(nil, bucket.State{Tokens: floorMicro(r.Float64() * 1e6), Last: Quantize(1e9 + r.Float64()*1e9)}, "o")))
	}
	// What AppendState and AppendSlotValue write takes the fast path.
	for range 10000 {
		st := bucket.State{Tokens: floorMicro(r.Float64() * 1e6), Last: Quantize(1e9 + r.Float64()*1e9)}
		for _, in := range [][]byte{AppendState(nil, st), AppendSlotValue(nil, st, "10.0.0.1")} {
			if got, _, ok := parseStateFast(in); !ok || got != st {
				t.Fatalf("parseStateFast(%q) = %v, %v; want %v, true", in, got, ok, st)
			}
		}
	}
	for _, in := range inputs {
		s, end, ok := parseStateFast([]byte(in))
		if !ok {
			continue
		}
		want, err := parseStateStrict([]byte(in[:end]))
		if err != nil || s != want {
			t.Fatalf("parseStateFast(%q) = %v (end %d); strict parser of %q: %v, %v", in, s, end, in[:end], want, err)
		}
		if end < len(in) && in[end] != ':' {
			t.Fatalf("parseStateFast(%q) stopped at %d, not at a ':'", in, end)
		}
	}
}

// BenchmarkAppendState is the stored form of a typical bucket: a token
// count and a time, both whole microunits (run it compiled to wasm too).
func BenchmarkAppendState(b *testing.B) {
	s := bucket.State{Tokens: 999998.5, Last: Quantize(1736940000.123456)}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendState(buf[:0], s)
	}
}

// BenchmarkParseState parses what BenchmarkAppendState writes.
func BenchmarkParseState(b *testing.B) {
	v := AppendState(nil, bucket.State{Tokens: 999998.5, Last: Quantize(1736940000.123456)})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseState(v); err != nil {
			b.Fatal(err)
		}
	}
}
