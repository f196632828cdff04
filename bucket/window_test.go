package bucket

import (
	"math"
	"testing"
)

// TestFixedWindow walks a fixed window of 10 tokens per 60 s with a
// rollover capacity of 15, windows aligned to the epoch: a new key starts
// full; tokens arrive only at window starts, never in between; unused
// tokens roll over up to the capacity; RetryAfter and FullIn point at the
// window start that brings the tokens.
func TestFixedWindow(t *testing.T) {
	l := Limit{Rate: 10, Burst: 15, Window: 60}
	w0 := 1_700_000_040.0 // a multiple of 60
	s := l.Full(w0 + 25)
	if s != (State{Tokens: 15, Last: w0}) {
		t.Fatalf("Full = %+v, want 15 tokens in the window starting at %v", s, w0)
	}
	steps := []struct {
		at, cost  float64
		allowed   bool
		tokens    float64
		retry     float64 // rejected only
		fullIn    float64
		lastAfter float64
	}{
		{25, 15, true, 0, 0, 95, w0},                 // spend everything; full again after two windows (60-25 + 60)
		{59.999, 1, false, 0, 0.001, 0.001 + 60, w0}, // no refill inside the window
		{60, 1, true, 9, 0, 60, w0 + 60},             // the window start brings 10
		{119, 10, false, 9, 1, 1, w0 + 60},           // needs 1 more: the next window, which also fills it
		{300, 1, true, 14, 0, 60, w0 + 300},          // 4 windows passed: 9 + 40 capped at 15
		{300, 14, true, 0, 0, 120, w0 + 300},
		{300, 16, false, 0, math.Inf(1), 120, w0 + 300}, // more than the capacity: never
	}
	for i, st := range steps {
		next, res := l.Take(s, w0+st.at, st.cost)
		if res.Allowed != st.allowed || math.Abs(res.Tokens-st.tokens) > 1e-9 || next.Last != st.lastAfter {
			t.Fatalf("step %d: %+v %+v, want allowed %v tokens %v last %v", i, res, next, st.allowed, st.tokens, st.lastAfter)
		}
		if !st.allowed && math.Abs(res.RetryAfter-st.retry) > 1e-6 && !(math.IsInf(st.retry, 1) && math.IsInf(res.RetryAfter, 1)) {
			t.Errorf("step %d: RetryAfter %v, want %v", i, res.RetryAfter, st.retry)
		}
		if math.Abs(res.FullIn-st.fullIn) > 1e-6 {
			t.Errorf("step %d: FullIn %v, want %v", i, res.FullIn, st.fullIn)
		}
		s = next
	}
	if got := l.FillTime(); got != 120 {
		t.Errorf("FillTime %v, want two windows, 120", got)
	}
}

// TestFixedWindowOffset: windows start at Offset + k × Window; a stored
// Last keeps its phase whatever the Offset of later calls; a clock stepped
// back far re-anchors at the current window, a little skew does not.
func TestFixedWindowOffset(t *testing.T) {
	l := Limit{Rate: 5, Burst: 5, Window: 10, Offset: 3.5}
	s := l.Full(1_700_000_000)
	if s.Last != 1_699_999_993.5 {
		t.Fatalf("Last %v, want 1699999993.5", s.Last)
	}
	other := l
	other.Offset = 7
	s, _ = other.Take(s, 1_700_000_003.4, 5) // still the first window
	if s.Tokens != 0 || s.Last != 1_699_999_993.5 {
		t.Fatalf("%+v", s)
	}
	if s2, _ := other.Take(s, 1_700_000_003.5, 1); s2.Tokens != 4 || s2.Last != 1_700_000_003.5 {
		t.Errorf("at the stored phase's window start: %+v", s2)
	}
	if s2 := l.Refill(s, s.Last-0.5); s2 != s {
		t.Errorf("skew: %+v, want unchanged", s2)
	}
	if s2 := l.Refill(s, s.Last-104.2); s2.Last != 1_699_999_883.5 {
		t.Errorf("stepped back: Last %v, want the window of the new clock", s2.Last)
	}
}
