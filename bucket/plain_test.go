package bucket

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestTakePlainEquivalence: Take's fast path for a plain continuous bucket
// (takePlain) decides exactly as the general path, bit for bit, on random
// limits, states, clocks and costs, edge values included. The general path
// is reached with MaxDebt -1: an invalid MaxDebt means no debt (the same
// limit), and takePlain declines any MaxDebt but 0.
func TestTakePlainEquivalence(t *testing.T) {
	rng := rand.New(rand.NewPCG(29, 2))
	inf, nan := math.Inf(1), math.NaN()
	edge := []float64{0, math.Copysign(0, -1), 1, 2, 0.5, 1e-300, 5e-324, math.MaxFloat64, -1, inf, -inf, nan, 1e6, 1e9, 3}
	pick := func(typical func() float64) float64 {
		if rng.IntN(5) == 0 {
			return edge[rng.IntN(len(edge))]
		}
		return typical()
	}
	same := func(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }
	plain, checked := 0, 0
	for range 2000000 {
		l := Limit{
			Rate:  pick(func() float64 { return []float64{1, 0.5, 10, 1e6, 7.3}[rng.IntN(5)] }),
			Burst: pick(func() float64 { return []float64{1, 2, 10, 1e6, 0.7}[rng.IntN(5)] }),
		}
		if rng.IntN(10) == 0 { // limits the fast path declines
			l.Window = pick(func() float64 { return 2 })
			l.Reserve = pick(func() float64 { return 1 })
		}
		if rng.IntN(10) == 0 {
			l.MaxDebt = pick(func() float64 { return 3 })
		}
		s := State{
			Tokens: pick(func() float64 { return rng.Float64() * l.Burst * 1.2 }),
			Last:   pick(func() float64 { return t0 + float64(rng.IntN(1000))/1e3 }),
		}
		now := pick(func() float64 { return t0 + float64(rng.IntN(3000))/1e3 })
		cost := pick(func() float64 { return []float64{1, 0, 0.25, 2, 5}[rng.IntN(5)] })

		gotS, gotR := l.Take(s, now, cost)
		g := l
		if g.MaxDebt == 0 {
			g.MaxDebt = -1
		}
		wantS, wantR := g.Take(s, now, cost)
		if !same(gotS.Tokens, wantS.Tokens) || !same(gotS.Last, wantS.Last) ||
			gotR.Allowed != wantR.Allowed || !same(gotR.Tokens, wantR.Tokens) ||
			!same(gotR.RetryAfter, wantR.RetryAfter) || !same(gotR.FullIn, wantR.FullIn) {
			t.Fatalf("%+v Take(%+v, %v, %v):\nfast path %+v %+v\ngeneral   %+v %+v", l, s, now, cost, gotS, gotR, wantS, wantR)
		}
		checked++
		if _, _, ok := l.takePlain(s, now, cost); ok {
			plain++
		}
	}
	if plain < checked/10 {
		t.Fatalf("the fast path decided %d of %d cases: too few to compare", plain, checked)
	}
}
