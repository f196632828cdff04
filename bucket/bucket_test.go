package bucket

import (
	"math"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

// t0 is a realistic instant; quarter seconds after it are exact in float64.
const t0 = 1736940000.0

var inf = math.Inf(1)

// step is one call of Take at a fixed instant and what it must return.
type step struct {
	t          float64
	cost       float64
	allowed    bool
	tokens     float64
	retryAfter float64
	last       float64
}

// runSteps threads one state through the steps, starting from s, comparing
// results within tol (0 means exact).
func runSteps(t *testing.T, l Limit, s State, steps []step, tol float64) State {
	t.Helper()
	for i, st := range steps {
		var r Result
		s, r = l.Take(s, st.t, st.cost)
		if r.Allowed != st.allowed {
			t.Errorf("step %d: got allowed %v, want %v", i, r.Allowed, st.allowed)
		}
		if !near(r.Tokens, st.tokens, tol) || !near(s.Tokens, st.tokens, tol) {
			t.Errorf("step %d: got tokens %v (state %v), want %v", i, r.Tokens, s.Tokens, st.tokens)
		}
		if !near(r.RetryAfter, st.retryAfter, tol) {
			t.Errorf("step %d: got retryAfter %v, want %v", i, r.RetryAfter, st.retryAfter)
		}
		if s.Last != st.last {
			t.Errorf("step %d: got last %v, want %v", i, s.Last, st.last)
		}
	}
	return s
}

// near reports whether got is want within tol; infinities must match exactly.
func near(got, want, tol float64) bool {
	if got == want {
		return true
	}
	return math.Abs(got-want) <= tol
}

func TestTakeSteps(t *testing.T) {
	l := Limit{Rate: 2, Burst: 4}
	runSteps(t, l, l.Full(t0), []step{
		{t: t0, cost: 1, allowed: true, tokens: 3, last: t0},
		{t: t0, cost: 3, allowed: true, tokens: 0, last: t0},
		{t: t0, cost: 1, allowed: false, tokens: 0, retryAfter: 0.5, last: t0},
		{t: t0 + 0.25, cost: 1, allowed: false, tokens: 0.5, retryAfter: 0.25, last: t0 + 0.25},
		{t: t0 + 0.5, cost: 1, allowed: true, tokens: 0, last: t0 + 0.5},
		{t: t0 + 10, cost: 4, allowed: true, tokens: 0, last: t0 + 10}, // refill capped at burst
		{t: t0 + 10, cost: 0, allowed: true, tokens: 0, last: t0 + 10}, // cost 0 always allowed
		{t: t0 + 10, cost: 5, allowed: false, tokens: 0, retryAfter: inf, last: t0 + 10},
		{t: t0 + 11, cost: 2.5, allowed: false, tokens: 2, retryAfter: 0.25, last: t0 + 11},
		{t: t0 + 11.25, cost: 2.5, allowed: true, tokens: 0, last: t0 + 11.25},
		{t: t0 + 12, cost: -3, allowed: true, tokens: 1.5, last: t0 + 12}, // negative cost is 0
	}, 0)
}

// TestWorkedExample is the example from the design notes: rate 10/s, burst
// 50, a full bucket, one request every 1/60 s for 10 s.
func TestWorkedExample(t *testing.T) {
	l := Limit{Rate: 10, Burst: 50}
	s := l.Full(0)
	perSecond := make([]int, 10)
	firstReject, total := -1, 0
	for k := 0; k < 600; k++ {
		var r Result
		s, r = l.Take(s, float64(k)/60, 1)
		if r.Allowed {
			perSecond[k/60]++
			total++
		} else if firstReject < 0 {
			firstReject = k
		}
	}
	if firstReject != 59 {
		t.Errorf("got first rejection at request %d, want 59 (the 60th)", firstReject)
	}
	want := []int{59, 10, 10, 10, 10, 10, 10, 10, 10, 10}
	for i := range want {
		if perSecond[i] != want[i] {
			t.Errorf("second %d: got %d allowed, want %d", i, perSecond[i], want[i])
		}
	}
	if total != 149 {
		t.Errorf("got %d allowed in all, want 149", total)
	}
}

func TestClockBackwards(t *testing.T) {
	l := Limit{Rate: 1, Burst: 10}
	t.Run("small skew keeps last", func(t *testing.T) {
		// A worker at t0+5 empties the bucket; another whose clock read
		// t0+4.5 arrives later. It must not refill, and must not move Last
		// back, or the half second would be counted twice.
		runSteps(t, l, State{Tokens: 3, Last: t0}, []step{
			{t: t0 + 5, cost: 8, allowed: true, tokens: 0, last: t0 + 5},
			{t: t0 + 4.5, cost: 1, allowed: false, tokens: 0, retryAfter: 1, last: t0 + 5},
			{t: t0 + 4, cost: 1, allowed: false, tokens: 0, retryAfter: 1, last: t0 + 5}, // exactly MaxClockSkew
			{t: t0 + 6, cost: 1, allowed: true, tokens: 0, last: t0 + 6},
		}, 0)
	})
	t.Run("large step back re-anchors", func(t *testing.T) {
		// The clock is stepped back by an hour: Last follows it, so the
		// bucket keeps refilling instead of freezing for an hour.
		runSteps(t, l, State{Tokens: 0, Last: t0}, []step{
			{t: t0 - 3600, cost: 1, allowed: false, tokens: 0, retryAfter: 1, last: t0 - 3600},
			{t: t0 - 3598, cost: 1, allowed: true, tokens: 1, last: t0 - 3598},
		}, 0)
	})
	t.Run("just over skew re-anchors", func(t *testing.T) {
		runSteps(t, l, State{Tokens: 2, Last: t0}, []step{
			{t: t0 - 1.25, cost: 1, allowed: true, tokens: 1, last: t0 - 1.25},
		}, 0)
	})
}

func TestLargeForwardJump(t *testing.T) {
	const year = 365.25 * 24 * 3600
	tests := []struct {
		name  string
		limit Limit
		s     State
		now   float64
	}{
		{"ten years", Limit{Rate: 10, Burst: 50}, State{Tokens: 0, Last: t0}, t0 + 10*year},
		{"from epoch 0", Limit{Rate: 0.001, Burst: 7}, State{Tokens: 1, Last: 0}, t0},
		{"huge rate", Limit{Rate: math.MaxFloat64, Burst: 3}, State{Tokens: 0, Last: t0}, t0 + 1},
		{"overflowing elapsed", Limit{Rate: 1, Burst: 3}, State{Tokens: 0, Last: -math.MaxFloat64}, math.MaxFloat64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.limit.Refill(tt.s, tt.now)
			if want := (State{Tokens: tt.limit.Burst, Last: tt.now}); got != want {
				t.Errorf("got %+v, want %+v", got, want)
			}
		})
	}
}

func TestFractionalRates(t *testing.T) {
	t.Run("0.1/s", func(t *testing.T) {
		l := Limit{Rate: 0.1, Burst: 1}
		runSteps(t, l, l.Full(t0), []step{
			{t: t0, cost: 1, allowed: true, tokens: 0, last: t0},
			{t: t0 + 5, cost: 1, allowed: false, tokens: 0.5, retryAfter: 5, last: t0 + 5},
			{t: t0 + 9.5, cost: 1, allowed: false, tokens: 0.95, retryAfter: 0.5, last: t0 + 9.5},
			{t: t0 + 10, cost: 1, allowed: true, tokens: 0, last: t0 + 10},
			{t: t0 + 1000, cost: 1, allowed: true, tokens: 0, last: t0 + 1000},
		}, 1e-9)
	})
	t.Run("0.5/s", func(t *testing.T) {
		l := Limit{Rate: 0.5, Burst: 2}
		runSteps(t, l, l.Full(t0), []step{
			{t: t0, cost: 2, allowed: true, tokens: 0, last: t0},
			{t: t0 + 1, cost: 1, allowed: false, tokens: 0.5, retryAfter: 1, last: t0 + 1},
			{t: t0 + 2, cost: 1, allowed: true, tokens: 0, last: t0 + 2},
			{t: t0 + 2.5, cost: 0.25, allowed: true, tokens: 0, last: t0 + 2.5},
		}, 0)
	})
}

func TestCostAboveBurst(t *testing.T) {
	l := Limit{Rate: 100, Burst: 10}
	s := l.Full(t0)
	for i, now := range []float64{t0, t0 + 1, t0 + 1e6} {
		var r Result
		s, r = l.Take(s, now, 10.5)
		if r.Allowed || r.RetryAfter != inf || r.Tokens != 10 {
			t.Errorf("step %d: got %+v, want rejected with 10 tokens and RetryAfter +Inf", i, r)
		}
	}
}

func TestFractionalCost(t *testing.T) {
	l := Limit{Rate: 1, Burst: 1}
	runSteps(t, l, l.Full(t0), []step{
		{t: t0, cost: 0.25, allowed: true, tokens: 0.75, last: t0},
		{t: t0, cost: 0.5, allowed: true, tokens: 0.25, last: t0},
		{t: t0, cost: 0.375, allowed: false, tokens: 0.25, retryAfter: 0.125, last: t0},
		{t: t0 + 0.125, cost: 0.375, allowed: true, tokens: 0, last: t0 + 0.125},
	}, 0)
}

func TestRefund(t *testing.T) {
	l := Limit{Rate: 2, Burst: 10}
	tests := []struct {
		name string
		s    State
		now  float64
		cost float64
		want State
	}{
		{"adds cost", State{Tokens: 3, Last: t0}, t0, 2, State{Tokens: 5, Last: t0}},
		{"refills first", State{Tokens: 3, Last: t0}, t0 + 1, 2, State{Tokens: 7, Last: t0 + 1}},
		{"clamps to burst", State{Tokens: 9, Last: t0}, t0, 5, State{Tokens: 10, Last: t0}},
		{"clamps after refill", State{Tokens: 3, Last: t0}, t0 + 3, 2, State{Tokens: 10, Last: t0 + 3}},
		{"infinite cost fills", State{Tokens: 0, Last: t0}, t0, inf, State{Tokens: 10, Last: t0}},
		{"negative cost ignored", State{Tokens: 4, Last: t0}, t0, -1, State{Tokens: 4, Last: t0}},
		{"NaN cost ignored", State{Tokens: 4, Last: t0}, t0, math.NaN(), State{Tokens: 4, Last: t0}},
		{"over-full state clamps", State{Tokens: 50, Last: t0}, t0, 1, State{Tokens: 10, Last: t0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := l.Refund(tt.s, tt.now, tt.cost); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	t.Run("undoes take", func(t *testing.T) {
		s := State{Tokens: 6.5, Last: t0}
		taken, _ := l.Take(s, t0+0.5, 3)
		if got, want := l.Refund(taken, t0+0.5, 3), l.Refill(s, t0+0.5); got != want {
			t.Errorf("got %+v, want %+v", got, want)
		}
	})
}

// TestSmallerBurstClamps pins that a bucket stored under a larger burst is
// clamped when the limit is reconfigured.
func TestSmallerBurstClamps(t *testing.T) {
	l := Limit{Rate: 1, Burst: 5}
	s, r := l.Take(State{Tokens: 100, Last: t0}, t0, 1)
	if want := (State{Tokens: 4, Last: t0}); s != want || !r.Allowed || r.Tokens != 4 {
		t.Errorf("got %+v %+v, want %+v and allowed with 4 tokens", s, r, want)
	}
}

func TestNonFinite(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		name  string
		limit Limit
		s     State
		now   float64
		cost  float64
		want  State
		res   Result
	}{
		{"NaN tokens is full", Limit{Rate: 1, Burst: 5}, State{nan, t0}, t0 + 1, 1, State{4, t0 + 1}, Result{Allowed: true, Tokens: 4, RetryAfter: 0}},
		{"+Inf tokens is full", Limit{Rate: 1, Burst: 5}, State{inf, t0}, t0, 1, State{4, t0}, Result{Allowed: true, Tokens: 4, RetryAfter: 0}},
		{"-Inf tokens is full", Limit{Rate: 1, Burst: 5}, State{-inf, t0}, t0, 1, State{4, t0}, Result{Allowed: true, Tokens: 4, RetryAfter: 0}},
		{"NaN last is full at now", Limit{Rate: 1, Burst: 5}, State{0, nan}, t0, 1, State{4, t0}, Result{Allowed: true, Tokens: 4, RetryAfter: 0}},
		{"+Inf last is full at now", Limit{Rate: 1, Burst: 5}, State{0, inf}, t0, 1, State{4, t0}, Result{Allowed: true, Tokens: 4, RetryAfter: 0}},
		{"negative tokens clamp to 0", Limit{Rate: 1, Burst: 5}, State{-3, t0}, t0 + 1, 1, State{0, t0 + 1}, Result{Allowed: true, Tokens: 0, RetryAfter: 0}},
		{"NaN now: no refill, last kept", Limit{Rate: 1, Burst: 5}, State{2, t0}, nan, 1, State{1, t0}, Result{Allowed: true, Tokens: 1, RetryAfter: 0}},
		{"+Inf now: no refill, last kept", Limit{Rate: 1, Burst: 5}, State{2, t0}, inf, 1, State{1, t0}, Result{Allowed: true, Tokens: 1, RetryAfter: 0}},
		{"-Inf now: no refill, last kept", Limit{Rate: 1, Burst: 5}, State{2, t0}, -inf, 3, State{2, t0}, Result{Allowed: false, Tokens: 2, RetryAfter: 1}},
		{"NaN cost never", Limit{Rate: 1, Burst: 5}, State{5, t0}, t0, nan, State{5, t0}, Result{Allowed: false, Tokens: 5, RetryAfter: inf}},
		{"+Inf cost never", Limit{Rate: 1, Burst: 5}, State{5, t0}, t0, inf, State{5, t0}, Result{Allowed: false, Tokens: 5, RetryAfter: inf}},
		{"-Inf cost is 0", Limit{Rate: 1, Burst: 5}, State{5, t0}, t0, -inf, State{5, t0}, Result{Allowed: true, Tokens: 5, RetryAfter: 0}},
		{"NaN rate never refills", Limit{Rate: nan, Burst: 5}, State{0, t0}, t0 + 9, 1, State{0, t0 + 9}, Result{Allowed: false, Tokens: 0, RetryAfter: inf}},
		{"zero rate never refills", Limit{Rate: 0, Burst: 5}, State{2, t0}, t0 + 9, 1, State{1, t0 + 9}, Result{Allowed: true, Tokens: 1, RetryAfter: 0}},
		{"+Inf rate always full", Limit{Rate: inf, Burst: 5}, State{0, t0}, t0, 5, State{0, t0}, Result{Allowed: true, Tokens: 0, RetryAfter: 0}},
		{"+Inf rate, cost above burst", Limit{Rate: inf, Burst: 5}, State{0, t0}, t0, 6, State{5, t0}, Result{Allowed: false, Tokens: 5, RetryAfter: inf}},
		{"NaN burst is empty", Limit{Rate: 1, Burst: nan}, State{3, t0}, t0 + 9, 1, State{0, t0 + 9}, Result{Allowed: false, Tokens: 0, RetryAfter: inf}},
		{"+Inf burst is empty", Limit{Rate: 1, Burst: inf}, State{3, t0}, t0 + 9, 1, State{0, t0 + 9}, Result{Allowed: false, Tokens: 0, RetryAfter: inf}},
		{"zero burst is empty", Limit{Rate: 1, Burst: 0}, State{3, t0}, t0 + 9, 0, State{0, t0 + 9}, Result{Allowed: true, Tokens: 0, RetryAfter: 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, r := tt.limit.Take(tt.s, tt.now, tt.cost)
			if s != tt.want {
				t.Errorf("got state %+v, want %+v", s, tt.want)
			}
			// A continuous bucket is full in ResetAfter(tokens).
			if full := tt.limit.ResetAfter(r.Tokens); r.FullIn != full {
				t.Errorf("FullIn %v, want ResetAfter(%v) = %v", r.FullIn, r.Tokens, full)
			}
			r.FullIn = 0
			if r != tt.res {
				t.Errorf("got result %+v, want %+v", r, tt.res)
			}
		})
	}
}

func TestResetAfterAndFillTime(t *testing.T) {
	tests := []struct {
		name   string
		limit  Limit
		tokens float64
		reset  float64
		fill   float64
	}{
		{"empty", Limit{Rate: 2, Burst: 10}, 0, 5, 5},
		{"half", Limit{Rate: 2, Burst: 10}, 5, 2.5, 5},
		{"full", Limit{Rate: 2, Burst: 10}, 10, 0, 5},
		{"over full", Limit{Rate: 2, Burst: 10}, 12, 0, 5},
		{"negative", Limit{Rate: 2, Burst: 10}, -1, 5, 5},
		{"NaN tokens", Limit{Rate: 2, Burst: 10}, math.NaN(), 0, 5},
		{"fractional rate", Limit{Rate: 0.5, Burst: 2}, 1, 2, 4},
		{"zero rate", Limit{Rate: 0, Burst: 2}, 1, inf, inf},
		{"infinite rate", Limit{Rate: inf, Burst: 2}, 1, 0, 0},
		{"invalid burst", Limit{Rate: 1, Burst: math.NaN()}, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.limit.ResetAfter(tt.tokens); got != tt.reset {
				t.Errorf("ResetAfter: got %v, want %v", got, tt.reset)
			}
			if got := tt.limit.FillTime(); got != tt.fill {
				t.Errorf("FillTime: got %v, want %v", got, tt.fill)
			}
		})
	}
}

func TestValid(t *testing.T) {
	tests := []struct {
		limit Limit
		want  bool
	}{
		{Limit{Rate: 1, Burst: 1}, true},
		{Limit{Rate: 0.1, Burst: 1e9}, true},
		{Limit{Rate: 0, Burst: 1}, false},
		{Limit{Rate: 1, Burst: 0}, false},
		{Limit{Rate: -1, Burst: 1}, false},
		{Limit{Rate: inf, Burst: 1}, false},
		{Limit{Rate: 1, Burst: inf}, false},
		{Limit{Rate: math.NaN(), Burst: 1}, false},
		{Limit{Rate: 1, Burst: math.NaN()}, false},
	}
	for i, tt := range tests {
		if got := tt.limit.Valid(); got != tt.want {
			t.Errorf("step %d: %+v: got %v, want %v", i, tt.limit, got, tt.want)
		}
	}
}

func TestTakeAllocs(t *testing.T) {
	l := Limit{Rate: 10, Burst: 50}
	s := l.Full(t0)
	now := t0
	if n := testing.AllocsPerRun(1000, func() {
		now += 0.01
		s, _ = l.Take(s, now, 1)
	}); n != 0 {
		t.Errorf("got %v allocations per Take, want 0", n)
	}
	r := Limit{Rate: 10, Burst: 1, MaxDebt: 50, Reserve: 50}
	s = State{Tokens: -10, Last: t0}
	if n := testing.AllocsPerRun(1000, func() {
		now += 0.1
		var res Result
		s, res = r.Take(s, now, 1)
		_ = r.Delay(res)
	}); n != 0 {
		t.Errorf("got %v allocations per Take into a reservation, want 0", n)
	}
}

func FuzzTake(f *testing.F) {
	f.Add(10.0, 50.0, 3.0, t0, t0+0.5, 1.0, 0.0, 0.0)
	f.Add(0.1, 1.0, 0.0, t0, t0-0.5, 1.0, 0.0, 0.0)
	f.Add(1.0, 5.0, 2.0, t0, t0-100, 0.5, 0.0, 0.0)
	f.Add(1.0, 5.0, math.NaN(), math.Inf(1), t0, 6.0, 0.0, 0.0)
	f.Add(10.0, 1.0, -3.0, t0, t0+0.1, 1.0, 5.0, 5.0)
	f.Add(10.0, 1.0, -9.0, t0, t0, 1.0, 6.0, 2.0)
	f.Add(1.0, 1.0, 0.09, t0, t0, 0.39, 0.3, 0.3)
	f.Fuzz(func(t *testing.T, rate, burst, tokens, last, now, cost, maxDebt, reserve float64) {
		l := Limit{Rate: rate, Burst: burst, MaxDebt: maxDebt, Reserve: reserve}
		refilled := l.Refill(State{Tokens: tokens, Last: last}, now)
		s, r := l.Take(State{Tokens: tokens, Last: last}, now, cost)
		capacity, floor, res := l.burst(), -l.debt(), l.reserve()
		if !(res >= 0 && res <= -floor) {
			t.Fatalf("reservation %v outside [0, MaxDebt %v]", res, -floor)
		}
		for _, x := range []float64{s.Tokens, r.Tokens, refilled.Tokens} {
			if math.IsNaN(x) || x < floor || x > capacity {
				t.Fatalf("tokens %v outside [%v, %v]: state %+v result %+v", x, floor, capacity, s, r)
			}
		}
		if s.Tokens != r.Tokens {
			t.Fatalf("state tokens %v != result tokens %v", s.Tokens, r.Tokens)
		}
		if math.Float64bits(s.Last) != math.Float64bits(refilled.Last) {
			t.Fatalf("take last %v != refill last %v", s.Last, refilled.Last)
		}
		delay := l.Delay(r)
		if math.IsNaN(delay) || delay < 0 || delay > 0 && res == 0 {
			t.Fatalf("delay %v with reservation %v: result %+v", delay, res, r)
		}
		if r.Allowed {
			if r.RetryAfter != 0 {
				t.Fatalf("allowed with RetryAfter %v", r.RetryAfter)
			}
			if s.Tokens < -res {
				t.Fatalf("allowed into %v tokens, below the reservation %v", s.Tokens, res)
			}
		} else {
			if s.Tokens != refilled.Tokens {
				t.Fatalf("rejected take left %v tokens, refill gives %v", s.Tokens, refilled.Tokens)
			}
			if !(r.RetryAfter > 0) {
				t.Fatalf("rejected with RetryAfter %v", r.RetryAfter)
			}
		}
		if back := l.Refund(s, now, cost); math.IsNaN(back.Tokens) || back.Tokens < floor || back.Tokens > capacity {
			t.Fatalf("refund gives %v tokens", back.Tokens)
		}
		if c := l.Charge(s, now, cost); math.IsNaN(c.Tokens) || c.Tokens < floor || c.Tokens > capacity {
			t.Fatalf("charge gives %v tokens", c.Tokens)
		}
		if ra := l.ResetAfter(s.Tokens); math.IsNaN(ra) || ra < 0 {
			t.Fatalf("ResetAfter %v", ra)
		}
	})
}

// BenchmarkTakeReserved is BenchmarkTake admitting into a reservation: the
// bucket stays in debt and every Take reports a Delay.
func BenchmarkTakeReserved(b *testing.B) {
	l := Limit{Rate: 1e6, Burst: 1, MaxDebt: 1e6, Reserve: 1e6}
	s := State{Tokens: -1e5, Last: t0}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now += 1e-6
		var r Result
		s, r = l.Take(s, now, 1)
		if l.Delay(r) <= 0 {
			b.Fatalf("no delay: %+v", r)
		}
	}
}

func BenchmarkTake(b *testing.B) {
	l := Limit{Rate: 1e6, Burst: 1e6}
	s := l.Full(t0)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now += 1e-6
		s, _ = l.Take(s, now, 1)
	}
}

// BenchmarkXTimeRateAllowN is the same work with golang.org/x/time/rate, for
// comparison; it includes x/time/rate's mutex.
func BenchmarkXTimeRateAllowN(b *testing.B) {
	lim := rate.NewLimiter(1e6, 1e6)
	now := time.Unix(t0, 0)
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		lim.AllowN(now, 1)
	}
}
