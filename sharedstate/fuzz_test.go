package sharedstate_test

import (
	"math"
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/sharedstate"
)

// FuzzSlotValue checks the slot codec ("{tokens}:{last_refill}:{owner}") and
// slot choice: any stored bytes parse without panic into a valid state or an
// error; a value written by AppendSlotValue parses back to the same owner,
// the same last_refill and no more tokens; the two candidate slots of an
// identity are distinct and in range.
func FuzzSlotValue(f *testing.F) {
	f.Add(87.4321, 1736940000.0, "2001:db8::1|GET%20/a", []byte("1.000000:1736940000.000000:10.0.0.1"), uint64(1), uint32(65536))
	f.Add(0.0, 1.0, "", []byte("1:2"), uint64(0), uint32(1))
	f.Add(1e12, 9e9, "#0123456789abcdef0123456789abcdef", []byte("NaN:1:x"), uint64(math.MaxUint64), uint32(2))
	f.Fuzz(func(t *testing.T, tokens, last float64, owner string, raw []byte, seed uint64, n uint32) {
		if s, o, hasOwner, err := sharedstate.ParseSlotValue(raw); err == nil {
			if math.IsNaN(s.Tokens) || math.IsInf(s.Tokens, 0) || !(s.Last > 0) || math.IsInf(s.Last, 0) {
				t.Fatalf("ParseSlotValue(%q) accepted %+v", raw, s)
			}
			if hasOwner {
				v := sharedstate.AppendSlotValue(nil, s, o)
				if _, o2, ok, err := sharedstate.ParseSlotValue(v); err != nil && s.Last >= 1e-6 || err == nil && (!ok || o2 != o) {
					t.Fatalf("%q re-encodes as %q, which parses to owner %q %v: %v", raw, v, o2, ok, err)
				}
			}
		}

		s := bucket.State{Tokens: tokens, Last: sharedstate.Quantize(last)}
		if tokens >= 0 && tokens < 1e15 && s.Last >= 1 && s.Last < 1e15 {
			v := sharedstate.AppendSlotValue(nil, s, owner)
			got, o, ok, err := sharedstate.ParseSlotValue(v)
			if err != nil || !ok || o != owner || got.Last != s.Last || got.Tokens > s.Tokens || s.Tokens-got.Tokens > 1 {
				t.Fatalf("%+v with owner %q: encoded %q, parsed %+v owner %q %v: %v", s, owner, v, got, o, ok, err)
			}
		}

		if n == 0 {
			return
		}
		a, b := sharedstate.SlotPair(seed, owner, n)
		if a >= n || b >= n || (n > 1 && a == b) {
			t.Fatalf("SlotPair(%d, %q, %d) = %d, %d", seed, owner, n, a, b)
		}
	})
}
