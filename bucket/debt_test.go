package bucket

import (
	"math"
	"testing"
)

func TestDebt(t *testing.T) {
	l := Limit{Rate: 2, Burst: 10, MaxDebt: 6}
	steps := []struct {
		op         string // take, charge, refund, reset
		t, cost    float64
		allowed    bool
		tokens     float64
		retryAfter float64
	}{
		{op: "take", t: t0, cost: 4, allowed: true, tokens: 6},
		{op: "charge", t: t0, cost: 10, tokens: -4},
		{op: "take", t: t0, cost: 0, tokens: -4, retryAfter: 2}, // in debt: not even 0 passes
		{op: "take", t: t0 + 1, cost: 1, tokens: -2, retryAfter: 1.5},
		{op: "take", t: t0 + 2, cost: 0, allowed: true, tokens: 0}, // repaid
		{op: "charge", t: t0 + 2, cost: 100, tokens: -6},           // capped at -MaxDebt
		{op: "refund", t: t0 + 2, cost: 1, tokens: -5},
		{op: "reset", t: t0 + 2, tokens: 10},
		{op: "charge", t: t0 + 2, cost: math.NaN(), tokens: 10},
		{op: "charge", t: t0 + 2, cost: math.Inf(1), tokens: -6},
	}
	s := l.Full(t0)
	for i, st := range steps {
		var res Result
		switch st.op {
		case "take":
			s, res = l.Take(s, st.t, st.cost)
			if res.Allowed != st.allowed || math.Abs(res.RetryAfter-st.retryAfter) > 1e-9 {
				t.Fatalf("step %d: got %+v, want allowed %v retry %v", i, res, st.allowed, st.retryAfter)
			}
		case "charge":
			s = l.Charge(s, st.t, st.cost)
		case "refund":
			s = l.Refund(s, st.t, st.cost)
		case "reset":
			s = l.Reset(s, st.t)
		}
		if math.Abs(s.Tokens-st.tokens) > 1e-9 {
			t.Fatalf("step %d (%s): got %v tokens, want %v", i, st.op, s.Tokens, st.tokens)
		}
	}
	if got := l.ResetAfter(-6); got != 8 {
		t.Errorf("ResetAfter(-6): got %v, want 8", got)
	}
	// Without MaxDebt a charge stops at 0 and negative stored tokens read as 0.
	nl := Limit{Rate: 1, Burst: 5}
	if s := nl.Charge(nl.Full(t0), t0, 9); s.Tokens != 0 {
		t.Errorf("no debt: got %v, want 0", s.Tokens)
	}
	if s := nl.Refill(State{Tokens: -3, Last: t0}, t0); s.Tokens != 0 {
		t.Errorf("no debt refill: got %v, want 0", s.Tokens)
	}
	// Fixed windows have no debt.
	w := Limit{Rate: 5, Burst: 5, Window: 10, MaxDebt: 5}
	if s := w.Charge(w.Full(t0), t0, 9); s.Tokens != 0 {
		t.Errorf("window: got %v, want 0", s.Tokens)
	}
}

// TestTakeSmallestCost pins what the filter's "admit while the balance is
// positive" (a response_* rule with pre_charge 0) relies on: a cost of
// math.SmallestNonzeroFloat64 is admitted exactly when the tokens are above
// zero, leaves any balance a stored value can hold unchanged, and in debt
// says how long until the balance is back above zero.
func TestTakeSmallestCost(t *testing.T) {
	const tiny = math.SmallestNonzeroFloat64
	l := Limit{Rate: 2, Burst: 10, MaxDebt: 10}
	for _, tc := range []struct {
		tokens  float64
		allowed bool
		retry   float64
	}{
		{10, true, 0}, {0.000001, true, 0}, {1e-300, true, 0},
		{0, false, tiny / 2}, {-6, false, 3},
	} {
		s, res := l.Take(State{Tokens: tc.tokens, Last: t0}, t0, tiny)
		if res.Allowed != tc.allowed || math.Abs(res.RetryAfter-tc.retry) > 1e-9 || (tc.allowed && tc.tokens > 1e-300 && s.Tokens != tc.tokens) {
			t.Errorf("tokens %v: got %+v, tokens after %v; want allowed %v, retry %v, tokens unchanged", tc.tokens, res, s.Tokens, tc.allowed, tc.retry)
		}
	}
}
