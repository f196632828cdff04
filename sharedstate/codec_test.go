package sharedstate

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

// t0 is a realistic instant, 2025-01-15.
const t0 = 1736940000.0

func TestAppendState(t *testing.T) {
	tests := []struct {
		name     string
		input    bucket.State
		expected string
	}{
		{"design note example", bucket.State{Tokens: 87.4321, Last: t0}, "87.432100:1736940000.000000"},
		{"zero", bucket.State{Tokens: 0, Last: t0 + 0.5}, "0.000000:1736940000.500000"},
		{"tokens floored, not rounded", bucket.State{Tokens: 0.9999999, Last: t0}, "0.999999:1736940000.000000"},
		{"tokens just below a micro", bucket.State{Tokens: math.Nextafter(2.833333, 0), Last: t0}, "2.833332:1736940000.000000"},
		{"tokens exactly a micro", bucket.State{Tokens: 2.833333, Last: t0}, "2.833333:1736940000.000000"},
		{"quantized last", bucket.State{Tokens: 1, Last: Quantize(t0 + 0.1234567)}, "1.000000:1736940000.123456"},
		{"negative tokens: debt", bucket.State{Tokens: -1, Last: t0}, "-1.000000:1736940000.000000"},
		{"debt rounds up", bucket.State{Tokens: -1.0000001, Last: t0}, "-1.000001:1736940000.000000"},
		{"negative zero", bucket.State{Tokens: math.Copysign(0, -1), Last: t0}, "0.000000:1736940000.000000"},
		{"NaN tokens", bucket.State{Tokens: math.NaN(), Last: t0}, "0.000000:1736940000.000000"},
		{"+Inf tokens", bucket.State{Tokens: math.Inf(1), Last: t0}, "0.000000:1736940000.000000"},
		{"huge tokens floored to whole", bucket.State{Tokens: 1e10 + 0.75, Last: t0}, "10000000000.000000:1736940000.000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(AppendState(nil, tt.input)); got != tt.expected {
				t.Errorf("got %q, want %q", got, tt.expected)
			}
		})
	}
}

func TestParseState(t *testing.T) {
	tests := []struct {
		name        string
		input       string
		expected    bucket.State
		expectedErr string
	}{
		{name: "design note example", input: "87.432100:1736940000.000000", expected: bucket.State{Tokens: 87.4321, Last: t0}},
		{name: "integers", input: "5:1736940000", expected: bucket.State{Tokens: 5, Last: t0}},
		{name: "many decimals", input: "0.1234567890:1.5", expected: bucket.State{Tokens: 0.123456789, Last: 1.5}},
		{name: "far future is not a codec error", input: "1:9999999999999", expected: bucket.State{Tokens: 1, Last: 9999999999999}},
		{name: "empty", input: "", expectedErr: `sharedstate: bad state "": missing ':'`},
		{name: "no colon", input: "abc", expectedErr: `sharedstate: bad state "abc": missing ':'`},
		{name: "two colons", input: "1:2:3", expectedErr: `sharedstate: bad state "1:2:3": more than one ':'`},
		{name: "empty tokens", input: ":5", expectedErr: `sharedstate: bad state ":5": tokens: empty`},
		{name: "empty last", input: "5:", expectedErr: `sharedstate: bad state "5:": last_refill: empty`},
		{name: "NaN tokens", input: "NaN:1", expectedErr: `sharedstate: bad state "NaN:1": tokens: not a decimal number`},
		{name: "NaN last", input: "1:NaN", expectedErr: `sharedstate: bad state "1:NaN": last_refill: not a decimal number`},
		{name: "Inf tokens", input: "Inf:1", expectedErr: `sharedstate: bad state "Inf:1": tokens: not a decimal number`},
		{name: "negative tokens: debt", input: "-1:5", expected: bucket.State{Tokens: -1, Last: 5}},
		{name: "two minuses", input: "--1:5", expectedErr: `sharedstate: bad state "--1:5": tokens: not a decimal number`},
		{name: "negative last", input: "1:-5", expectedErr: `sharedstate: bad state "1:-5": last_refill: negative`},
		{name: "minus only", input: "-:5", expectedErr: `sharedstate: bad state "-:5": tokens: not a decimal number`},
		{name: "leading space", input: " 1:2", expectedErr: `sharedstate: bad state " 1:2": tokens: not a decimal number`},
		{name: "trailing newline", input: "1:2\n", expectedErr: `sharedstate: bad state "1:2\n": last_refill: not a decimal number`},
		{name: "plus sign", input: "+1:2", expectedErr: `sharedstate: bad state "+1:2": tokens: not a decimal number`},
		{name: "exponent", input: "1e3:2", expectedErr: `sharedstate: bad state "1e3:2": tokens: not a decimal number`},
		{name: "hex float", input: "0x1p3:2", expectedErr: `sharedstate: bad state "0x1p3:2": tokens: not a decimal number`},
		{name: "underscore", input: "1_0:2", expectedErr: `sharedstate: bad state "1_0:2": tokens: not a decimal number`},
		{name: "bare dot", input: "1.:2", expectedErr: `sharedstate: bad state "1.:2": tokens: not a decimal number`},
		{name: "leading dot", input: ".5:2", expectedErr: `sharedstate: bad state ".5:2": tokens: not a decimal number`},
		{name: "zero last", input: "1:0.000000", expectedErr: `sharedstate: bad state "1:0.000000": last_refill: must be > 0`},
		{name: "overflow", input: "19" + zeros(400) + ":1", expectedErr: `sharedstate: bad state "19` + zeros(46) + `"...: tokens: out of range`},
		{name: "binary", input: "\x00\xff:1", expectedErr: `sharedstate: bad state "\x00\xff:1": tokens: not a decimal number`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseState([]byte(tt.input))
			if tt.expectedErr != "" {
				if err == nil {
					t.Fatalf("got %+v, want error %q", got, tt.expectedErr)
				}
				if err.Error() != tt.expectedErr {
					t.Errorf("got error %q, want %q", err, tt.expectedErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %q, want %+v", err, tt.expected)
			}
			if got != tt.expected {
				t.Errorf("got %+v, want %+v", got, tt.expected)
			}
		})
	}
}

func zeros(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = '0'
	}
	return string(b)
}

// TestRoundTrip checks that a quantized time and floored tokens survive
// AppendState → ParseState bit for bit, and that tokens never round up.
func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 200000; i++ {
		now := Quantize(t0 + rng.Float64()*1e8)
		tokens := rng.Float64() * math.Pow(10, float64(rng.IntN(10)))
		got, err := ParseState(AppendState(nil, bucket.State{Tokens: tokens, Last: now}))
		if err != nil {
			t.Fatalf("step %d: got error %v", i, err)
		}
		if got.Last != now {
			t.Fatalf("step %d: got last %v, want %v", i, got.Last, now)
		}
		if got.Tokens > tokens || tokens-got.Tokens >= 1e-6 {
			t.Fatalf("step %d: got tokens %v, want floor of %v to 6 decimals", i, got.Tokens, tokens)
		}
		again, _ := ParseState(AppendState(nil, got))
		if again != got {
			t.Fatalf("step %d: second round trip got %+v, want %+v", i, again, got)
		}
	}
}

func TestQuantize(t *testing.T) {
	tests := []struct {
		input    float64
		expected float64
	}{
		{t0, t0},
		{t0 + 0.5, t0 + 0.5},
		{1736940000.1234566, 1736940000.123456},
		{math.Nextafter(1736940000.123456, 0), 1736940000.123455},
		{1e10 + 0.5, 1e10}, // beyond 2^53 µs: whole seconds
		{0, 0},
		{-1.5, -1.5},
	}
	for i, tt := range tests {
		if got := Quantize(tt.input); got != tt.expected {
			t.Errorf("step %d: Quantize(%v): got %v, want %v", i, tt.input, got, tt.expected)
		}
	}
	for i, x := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if got := Quantize(x); math.Float64bits(got) != math.Float64bits(x) {
			t.Errorf("step %d: Quantize(%v): got %v, want it unchanged", i, x, got)
		}
	}
	// Every microsecond of a few seconds round-trips exactly.
	for us := int64(0); us < 3_000_000; us += 7 {
		now := Quantize(t0 + float64(us)/1e6)
		s := strconv.FormatFloat(now, 'f', 6, 64)
		if back, _ := strconv.ParseFloat(s, 64); back != now {
			t.Fatalf("step %d: %v formats as %s which parses as %v", us, now, s, back)
		}
	}
}

func TestCodecAllocs(t *testing.T) {
	b := []byte("87.432100:1736940000.000000")
	if n := testing.AllocsPerRun(1000, func() { _, _ = ParseState(b) }); n != 0 {
		t.Errorf("ParseState: got %v allocations, want 0", n)
	}
	dst := make([]byte, 0, 48)
	s := bucket.State{Tokens: 87.4321, Last: t0}
	if n := testing.AllocsPerRun(1000, func() { dst = AppendState(dst[:0], s) }); n != 0 {
		t.Errorf("AppendState: got %v allocations, want 0", n)
	}
}

func FuzzParseState(f *testing.F) {
	for _, s := range []string{"87.432100:1736940000.000000", "0:1", "", "abc", "NaN:1", "1:NaN", "-1:5", "1:2:3", "Inf:1", " 1:2", "1:9999999999999", "0.0000001:1.0000001"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseState(b)
		if err != nil {
			return
		}
		if math.IsNaN(s.Tokens) || math.IsInf(s.Tokens, 0) || !(s.Last > 0) || math.IsInf(s.Last, 0) {
			t.Fatalf("ParseState(%q) accepted %+v", b, s)
		}
		enc := AppendState(nil, s)
		s2, err := ParseState(enc)
		if err != nil && s.Last < 1e-6 {
			return // rounds to last_refill 0.000000, which is rejected
		}
		if err != nil {
			t.Fatalf("ParseState(%q) = %+v re-encodes as %q: %v", b, s, enc, err)
		}
		if s2.Tokens > s.Tokens {
			t.Fatalf("%q: tokens grew from %v to %v", b, s.Tokens, s2.Tokens)
		}
		// From the second encoding on, the value is stable.
		if enc2 := AppendState(nil, s2); string(enc2) != string(enc) && s2.Last*1e6 < 1<<53 {
			t.Fatalf("%q: encodes as %q then %q", b, enc, enc2)
		}
	})
}
