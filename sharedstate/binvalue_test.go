//go:build !wasip1

package sharedstate

import (
	"bytes"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

// A binary value must decode to exactly the state its text would parse
// back to, or a native host's buckets would drift from the guest's.
func TestBinaryValueMatchesText(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	states := []bucket.State{
		{Tokens: 0, Last: 1}, {Tokens: math.Copysign(0, -1), Last: 1736940000},
		{Tokens: 1e-7, Last: 1736940000.000001}, {Tokens: 999999.9999999, Last: Quantize(1736940000.1234567)},
		{Tokens: maxFastMicro - 1e-6, Last: maxFastMicro - 1e-6},
		// outside the binary domain: written as text
		{Tokens: -3.5, Last: 1736940000}, {Tokens: maxFastMicro, Last: 1}, {Tokens: math.NaN(), Last: 1},
		{Tokens: math.Inf(1), Last: 1}, {Tokens: 1, Last: 1736940000.0000004}, {Tokens: 1, Last: 0},
	}
	for range 100000 {
		last := Quantize(1.6e9 + r.Float64()*1e9)
		switch r.IntN(3) {
		case 0:
			states = append(states, bucket.State{Tokens: r.Float64() * 1e6, Last: last})
		case 1:
			states = append(states, bucket.State{Tokens: float64(r.IntN(1000)), Last: last})
		default:
			states = append(states, bucket.State{Tokens: floorMicro(r.Float64() * 1e9), Last: last})
		}
	}
	for _, s := range states {
		for _, o := range []struct {
			owner    string
			hasOwner bool
		}{{"", false}, {"", true}, {"10.0.0.1", true}, {"2001:db8::1|GET", true}} {
			owner, hasOwner := o.owner, o.hasOwner
			var text []byte
			if hasOwner {
				text = AppendSlotValue(nil, s, owner)
			} else {
				text = AppendState(nil, s)
			}
			wantS, wantO, wantH, wantErr := parseValue(text)
			bin := AppendBinaryValue(nil, s, owner, hasOwner)
			_, _, inDomain := binaryState(s, 0)
			if isBin := bin[0] >= binTag; isBin != inDomain {
				t.Fatalf("%+v: binary %v, want %v (value %q)", s, isBin, inDomain, bin)
			}
			if !inDomain && !bytes.Equal(bin, text) {
				t.Fatalf("%+v outside the binary domain: got %q, want the text %q", s, bin, text)
			}
			gotS, gotO, gotH, gotErr := parseValue(bin)
			if (gotErr != nil) != (wantErr != nil) || gotErr == nil && (gotS != wantS || string(gotO) != string(wantO) || gotH != wantH) {
				t.Fatalf("%+v owner %q: binary parses to %+v %q %v %v, text %q to %+v %q %v %v",
					s, owner, gotS, gotO, gotH, gotErr, text, wantS, wantO, wantH, wantErr)
			}
			if !hasOwner && inDomain {
				got, err := ParseState(bin)
				want, _ := ParseState(text)
				if err != nil || got != want {
					t.Fatalf("ParseState(binary %+v): got %+v, %v; want %+v", s, got, err, want)
				}
			}
		}
	}
}

func TestBinaryValueCorrupt(t *testing.T) {
	good := AppendBinaryValue(nil, bucket.State{Tokens: 5, Last: 1736940000}, "", false)
	owned := AppendBinaryValue(nil, bucket.State{Tokens: 5, Last: 1736940000}, "x", true)
	raw := func(tag byte, tokens, last float64) []byte {
		b := appendBinary(nil, tokens, last, "", false)
		b[0] = tag
		return b
	}
	for _, tc := range []struct {
		name  string
		value []byte
	}{
		{"short", good[:10]},
		{"tag only", good[:1]},
		{"trailing bytes without an owner tag", append(append([]byte(nil), good...), 'x')},
		{"NaN tokens", raw(binTag, math.NaN(), 1736940000)},
		{"negative tokens", raw(binTag, -1, 1736940000)},
		{"huge tokens", raw(binTag, 1e300, 1736940000)},
		{"zero last", raw(binTag, 1, 0)},
		{"Inf last", raw(binTag, 1, math.Inf(1))},
	} {
		if _, _, _, err := parseValue(tc.value); err == nil {
			t.Errorf("%s: parseValue(%q) accepted it", tc.name, tc.value)
		}
		if _, err := ParseState(tc.value); err == nil {
			t.Errorf("%s: ParseState(%q) accepted it", tc.name, tc.value)
		}
	}
	if _, err := ParseState(owned); err == nil {
		t.Errorf("ParseState accepted a binary slot value %q", owned)
	}
	if s, o, ok, err := parseValue(owned); err != nil || !ok || string(o) != "x" || s.Tokens != 5 {
		t.Errorf("parseValue(%q) = %+v %q %v %v", owned, s, o, ok, err)
	}
}

// binStore is a MemStore that accepts binary values, as procstore does.
type binStore struct{ *MemStore }

func (binStore) BinaryValues() bool { return true }

// An Updater over a store that accepts binary values writes them, and
// decides exactly as over a text store, also behind LocalFallback and in a
// bounded key space.
func TestUpdaterBinaryValues(t *testing.T) {
	for _, slotted := range []bool{false, true} {
		text := NewMemStore(Envoy)
		bin := binStore{NewMemStore(Envoy)}
		ut := &Updater{Store: &LocalFallback{Host: text}}
		ub := &Updater{Store: &LocalFallback{Host: bin}}
		lim := bucket.Limit{Rate: 3.3, Burst: 10}
		mk := func() []Request {
			r := Request{Key: "tb:r:k", Limit: lim, Cost: 1.7}
			if slotted {
				r = Request{Key: "tb:r:$1", Alt: "tb:r:$2", Owner: "10.0.0.1", Slotted: true, Limit: lim, Cost: 1.7}
			}
			return []Request{r}
		}
		now := 1736940000.0
		for i := range 200 {
			now += 0.0731
			ot := ut.TakeAll(mk(), now, nil)
			ob := ub.TakeAll(mk(), now, nil)
			if ot.Allowed != ob.Allowed || ot.Err != nil || ob.Err != nil || ot.Results[0] != ob.Results[0] {
				t.Fatalf("slotted %v, step %d: text %+v, binary %+v", slotted, i, ot, ob)
			}
		}
		keys := 0
		for _, key := range []string{"tb:r:k", "tb:r:$1", "tb:r:$2"} {
			v, _, err := bin.Get(key)
			if err != nil {
				continue
			}
			keys++
			if len(v) == 0 || v[0] < binTag {
				t.Errorf("slotted %v: the binary store holds %q under %s: not a binary value", slotted, v, key)
			}
			if v, _, _ := text.Get(key); len(v) == 0 || v[0] >= binTag {
				t.Errorf("slotted %v: the text store holds %q under %s", slotted, v, key)
			}
		}
		if keys != 1 {
			t.Errorf("slotted %v: %d keys in the binary store, want 1", slotted, keys)
		}
	}
}

// TestFloorMicroIdempotent: floorMicro of its own result changes nothing
// below maxFastMicro, so a last_refill equal to a quantized now needs no
// second floorMicro (binaryState's now), and binaryState answers the same
// with the hint as without it.
func TestFloorMicroIdempotent(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 3))
	for i := range 2000000 {
		var x float64
		switch i % 4 {
		case 0: // times around today
			x = 1.7e9 + rng.Float64()*1e8
		case 1: // anywhere in the fast range
			x = rng.Float64() * maxFastMicro
		case 2: // near powers of two, where the spacing of floats changes
			x = math.Ldexp(1, rng.IntN(34)) * (1 + (rng.Float64()-0.5)*1e-9)
		default: // small values
			x = rng.Float64() * math.Ldexp(1, -rng.IntN(20))
		}
		now := Quantize(x)
		if !(now > 0 && now < maxFastMicro) {
			continue
		}
		if f := floorMicro(now); f != now {
			t.Fatalf("floorMicro(%v) = %v, Quantize(%v) = %v", now, f, x, now)
		}
		s := bucket.State{Tokens: rng.Float64() * 10, Last: now}
		if rng.IntN(4) == 0 {
			s.Last = x // not quantized: the hint does not apply
		}
		t1, l1, ok1 := binaryState(s, now)
		t0, l0, ok0 := binaryState(s, 0)
		if t1 != t0 || l1 != l0 || ok1 != ok0 {
			t.Fatalf("binaryState(%+v) with now %v: %v %v %v, without: %v %v %v", s, now, t1, l1, ok1, t0, l0, ok0)
		}
	}
}
