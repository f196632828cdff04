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

// TestReserve walks a reserving bucket (nginx's limit_req burst=5 with
// delay=0 at 4 r/s: rate 4, burst 1, reservation 5) through admissions
// into the reservation, a rejection beyond it, and its repayment.
func TestReserve(t *testing.T) {
	l := Limit{Rate: 4, Burst: 1, MaxDebt: 5, Reserve: 5}
	steps := []struct {
		t, cost    float64
		allowed    bool
		tokens     float64
		retryAfter float64
		delay      float64
		fullIn     float64
	}{
		{t: t0, cost: 1, allowed: true, tokens: 0, fullIn: 0.25},
		{t: t0, cost: 1, allowed: true, tokens: -1, delay: 0.25, fullIn: 0.5},
		{t: t0, cost: 1, allowed: true, tokens: -2, delay: 0.5, fullIn: 0.75},
		{t: t0, cost: 3, allowed: true, tokens: -5, delay: 1.25, fullIn: 1.5},
		{t: t0, cost: 1, tokens: -5, retryAfter: 0.25, fullIn: 1.5},                  // beyond the reservation
		{t: t0, cost: 0, allowed: true, tokens: -5, delay: 1.25, fullIn: 1.5},        // 0 fits the reservation
		{t: t0 + 0.25, cost: 1, allowed: true, tokens: -5, delay: 1.25, fullIn: 1.5}, // 1 repaid, 1 taken
		{t: t0 + 0.75, cost: 7, tokens: -3, retryAfter: inf, fullIn: 1},              // above burst + reserve
		{t: t0 + 10, cost: 6, allowed: true, tokens: -5, delay: 1.25, fullIn: 1.5},   // burst + reserve from full
		{t: t0 + 10, cost: math.NaN(), tokens: -5, retryAfter: inf, fullIn: 1.5},
		{t: t0 + 10, cost: -1, allowed: true, tokens: -5, delay: 1.25, fullIn: 1.5}, // a negative cost is 0
	}
	s := l.Full(t0)
	for i, st := range steps {
		var res Result
		s, res = l.Take(s, st.t, st.cost)
		delay := l.Delay(res)
		if res.Allowed != st.allowed || !near(res.Tokens, st.tokens, 1e-9) || !near(s.Tokens, st.tokens, 1e-9) ||
			!near(res.RetryAfter, st.retryAfter, 1e-9) || !near(delay, st.delay, 1e-9) || !near(res.FullIn, st.fullIn, 1e-9) {
			t.Errorf("step %d: got %+v (state %v) delay %v; want allowed %v tokens %v retry %v delay %v fullIn %v",
				i, res, s.Tokens, delay, st.allowed, st.tokens, st.retryAfter, st.delay, st.fullIn)
		}
	}
}

// TestReserveEdges pins the edge cases Limit.Reserve's doc comment states.
func TestReserveEdges(t *testing.T) {
	full := func(l Limit) State { return l.Full(t0) }
	tests := []struct {
		name    string
		limit   Limit
		s       State
		cost    float64
		allowed bool
		tokens  float64
		retry   float64
	}{
		{name: "bounded by MaxDebt", limit: Limit{Rate: 1, Burst: 2, MaxDebt: 1, Reserve: 3}, cost: 3, allowed: true, tokens: -1},
		{name: "beyond MaxDebt", limit: Limit{Rate: 1, Burst: 2, MaxDebt: 1, Reserve: 3}, cost: 4, tokens: 2, retry: inf},
		{name: "no MaxDebt, no reservation", limit: Limit{Rate: 1, Burst: 2, Reserve: 3}, cost: 3, tokens: 2, retry: inf},
		{name: "NaN reserve", limit: Limit{Rate: 1, Burst: 2, MaxDebt: 3, Reserve: math.NaN()}, cost: 3, tokens: 2, retry: inf},
		{name: "infinite reserve", limit: Limit{Rate: 1, Burst: 2, MaxDebt: 3, Reserve: inf}, cost: 3, tokens: 2, retry: inf},
		{name: "negative reserve", limit: Limit{Rate: 1, Burst: 2, MaxDebt: 3, Reserve: -1}, cost: 3, tokens: 2, retry: inf},
		{name: "fixed window", limit: Limit{Rate: 2, Burst: 2, Window: 10, MaxDebt: 3, Reserve: 3}, cost: 3, tokens: 2, retry: inf},
		// Settled debt beyond the reservation: nothing passes, not even 0.
		{name: "debt beyond the reservation", limit: Limit{Rate: 1, Burst: 2, MaxDebt: 6, Reserve: 2}, s: State{Tokens: -4, Last: t0}, cost: 0, tokens: -4, retry: 2},
		{name: "debt within the reservation", limit: Limit{Rate: 1, Burst: 2, MaxDebt: 6, Reserve: 2}, s: State{Tokens: -1, Last: t0}, cost: 1, allowed: true, tokens: -2},
		// 0.09 + 0.3 >= 0.39, but 0.09 - 0.39 rounds below -0.3.
		{name: "rounding stays at -Reserve", limit: Limit{Rate: 1, Burst: 1, MaxDebt: 0.3, Reserve: 0.3}, s: State{Tokens: 0.09, Last: t0}, cost: 0.39, allowed: true, tokens: -0.3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.s
			if s == (State{}) {
				s = full(tc.limit)
			}
			s, res := tc.limit.Take(s, t0, tc.cost)
			if res.Allowed != tc.allowed || s.Tokens != tc.tokens || res.Tokens != tc.tokens || !near(res.RetryAfter, tc.retry, 1e-9) {
				t.Errorf("got %+v (state %v), want allowed %v tokens %v retry %v", res, s.Tokens, tc.allowed, tc.tokens, tc.retry)
			}
		})
	}
}

// TestDelay: Limit.Delay is the repayment time of an admission into the
// reservation and 0 for anything else.
func TestDelay(t *testing.T) {
	l := Limit{Rate: 4, Burst: 2, MaxDebt: 2, Reserve: 2}
	tests := []struct {
		limit Limit
		res   Result
		want  float64
	}{
		{l, Result{Allowed: true, Tokens: -1}, 0.25},
		{l, Result{Allowed: true, Tokens: 1}, 0},
		{l, Result{Allowed: true, Tokens: 0}, 0},
		{l, Result{Tokens: -1, RetryAfter: 1}, 0},
		{l, Result{Allowed: true, Tokens: math.NaN()}, 0},
		{Limit{Burst: 2, MaxDebt: 2, Reserve: 2}, Result{Allowed: true, Tokens: -1}, inf},
	}
	for i, tc := range tests {
		if got := tc.limit.Delay(tc.res); got != tc.want {
			t.Errorf("step %d: got %v, want %v", i, got, tc.want)
		}
	}
}
