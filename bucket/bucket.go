// Package bucket implements a continuous-time token bucket with lazy refill
// as pure functions over a small State value.
//
// A bucket holds up to Limit.Burst tokens and gains Limit.Rate tokens per
// second, continuously; a request of cost c is allowed when the bucket holds
// at least c tokens, and then c tokens are taken. Nothing runs in the
// background: the refill is computed from the time elapsed since State.Last
// whenever the bucket is used.
//
// The tokens may go below zero, down to Limit.MaxDebt, by one mechanism with
// two uses: Charge settles a cost known only after the request was admitted,
// and Take admits a cost the bucket cannot pay at once into a reservation
// (Limit.Reserve, within MaxDebt), the debt Limit.Delay says how long to
// repay. A State stores the true, possibly negative, balance.
//
// Time is always an argument, in seconds since the Unix epoch as a float64,
// so the functions are deterministic and can be recomputed on every round of
// a compare-and-swap loop. Every function returns a new State and changes
// nothing in place; none allocates.
//
// The functions never panic and never return NaN or infinite token counts,
// whatever their inputs; the doc comments of Limit, State and Refill say how
// invalid values are treated.
package bucket

import "math"

// MaxClockSkew is how far, in seconds, now may lie before State.Last and
// still be treated as clock skew between workers rather than as the clock
// being stepped back. See Limit.Refill.
const MaxClockSkew = 1.0

// Limit is the configuration of a bucket.
//
// A valid Limit has a finite Rate > 0 and a finite Burst > 0 (see Valid).
// Other values never cause a panic or a NaN:
//   - a Rate of +Inf refills the bucket to Burst on every call;
//   - any other invalid Rate (NaN, <= 0, -Inf) is treated as 0: the bucket
//     never refills and a rejected Take has RetryAfter +Inf;
//   - an invalid Burst (NaN, <= 0, ±Inf) is treated as 0: the bucket is
//     always empty and every Take of positive cost is rejected with
//     RetryAfter +Inf.
type Limit struct {
	Rate  float64 // tokens per second, > 0 (per window for a fixed window)
	Burst float64 // capacity in tokens, > 0

	// Window, when > 0, makes the limit a fixed window of Window seconds
	// instead of a continuous bucket: Rate tokens arrive at once at the
	// start of each window, up to Burst (the rollover capacity), and
	// State.Last is the start of the window the tokens were counted in.
	// Windows start at Offset + k × Window seconds since the epoch; Offset
	// matters only when a state is created (Full), since a stored Last
	// carries its phase.
	Window, Offset float64

	// MaxDebt, when > 0, lets a continuous bucket's tokens go below zero,
	// down to -MaxDebt: it is the floor of the bucket. Charge may take the
	// tokens down to it (the cost of a request known only after it was
	// admitted), and Take down to the reservation (Reserve), which lies
	// within it. A bucket in debt refills at Rate like any other; beyond
	// its reservation it admits nothing (without one, not even a cost of
	// 0) until its tokens are back to the cost. Invalid values (NaN, <= 0,
	// ±Inf) mean no debt. Fixed windows ignore it.
	MaxDebt float64

	// Reserve, when > 0, is how far below zero Take may leave the tokens:
	// a cost is admitted when tokens - cost >= -Reserve, so a bucket that
	// cannot pay a cost at once may still take it, into debt, and
	// Limit.Delay says how long the debt takes to pay back (delayed
	// admission holds the request that long). It is bounded by MaxDebt:
	// the effective reservation is min(Reserve, MaxDebt), so a limit that
	// only reserves sets both to the same value. Without it (0, NaN, < 0,
	// ±Inf, or MaxDebt invalid) Take admits only what the bucket holds.
	// Fixed windows ignore it.
	//
	// # Notes
	//
	//   - The tokens go no lower than -Reserve through Take, whatever the
	//     rounding of tokens - cost.
	//   - A cost above Burst + Reserve is never admitted (RetryAfter +Inf).
	//   - A rejection's RetryAfter is the time until the cost fits the
	//     reservation again, not until the bucket holds it.
	Reserve float64
}

// State is the stored state of one bucket.
//
// Tokens outside [-MaxDebt, Burst] are clamped into it when the state is used, so
// a Burst reconfigured to a smaller value takes effect at once. A State with
// NaN or infinite Tokens, or a Last that is not finite, is treated as a full
// bucket anchored at now.
type State struct {
	Tokens float64 // tokens in the bucket at Last
	Last   float64 // seconds since the Unix epoch of the last refill
}

// Result is the decision of Limit.Take.
type Result struct {
	// Allowed reports whether the bucket held at least cost tokens.
	Allowed bool
	// Tokens is the number of tokens in the bucket after the decision:
	// after the refill, minus cost if allowed.
	Tokens float64
	// RetryAfter is the number of seconds until cost tokens will be
	// available, assuming nothing else takes from the bucket: 0 if allowed,
	// always > 0 if rejected, and +Inf if they never will be (cost > Burst,
	// or a Limit that does not refill). Callers that need whole seconds take
	// math.Ceil.
	RetryAfter float64
	// FullIn is the number of seconds until the bucket is full again,
	// assuming nothing takes from it (ResetAfter for a continuous bucket;
	// the start of the window that refills it for a fixed window).
	FullIn float64

	// Result keeps four fields: the compiler keeps a struct of at most
	// four fields in registers, and a fifth made BenchmarkTake half again
	// slower. The wait of an admission into the reservation is therefore
	// Limit.Delay, not a field.
}

// Valid reports whether l has a finite Rate > 0 and a finite Burst > 0.
func (l Limit) Valid() bool {
	return l.Rate > 0 && l.Rate <= math.MaxFloat64 && l.Burst > 0 && l.Burst <= math.MaxFloat64
}

// rate returns the effective rate: Rate if it is > 0 (including +Inf), else 0.
func (l Limit) rate() float64 {
	if l.Rate > 0 {
		return l.Rate
	}
	return 0
}

// burst returns the effective capacity: Burst if it is finite and > 0, else 0.
func (l Limit) burst() float64 {
	if l.Burst > 0 && l.Burst <= math.MaxFloat64 {
		return l.Burst
	}
	return 0
}

// debt returns the effective MaxDebt: MaxDebt if it is finite and > 0 and
// the limit is a continuous bucket, else 0.
func (l Limit) debt() float64 {
	if l.MaxDebt > 0 && l.MaxDebt <= math.MaxFloat64 && !l.fixed() {
		return l.MaxDebt
	}
	return 0
}

// reserve returns the effective reservation: Reserve if it is finite and
// > 0, at most the effective MaxDebt (so 0 for a fixed window).
func (l Limit) reserve() float64 {
	if l.Reserve > 0 && l.Reserve <= math.MaxFloat64 {
		return min(l.Reserve, l.debt())
	}
	return 0
}

// finite reports whether x is neither NaN nor ±Inf.
func finite(x float64) bool {
	return x-x == 0
}

// Full returns the state of a bucket never seen before: full at now.
//
// If now is not finite, the returned Last is not finite either; Refill
// treats such a state as a full bucket, so it is still safe to use.
func (l Limit) Full(now float64) State {
	return State{Tokens: l.burst(), Last: l.windowStart(now)}
}

// fixed reports whether l is a fixed window.
func (l Limit) fixed() bool { return l.Window > 0 && l.Window <= math.MaxFloat64 }

// windowStart returns the start of the window holding now: now itself for
// a continuous bucket.
func (l Limit) windowStart(now float64) float64 {
	if !l.fixed() || !finite(now) {
		return now
	}
	off := l.Offset
	if !finite(off) {
		off = 0
	}
	return off + math.Floor((now-off)/l.Window)*l.Window
}

// FillTime returns the number of seconds a bucket takes to refill from empty
// to full: Burst/Rate. It is 0 for a Rate of +Inf or an invalid Burst, and
// +Inf for an invalid Rate with a valid Burst.
func (l Limit) FillTime() float64 {
	if l.fixed() {
		if l.rate() == 0 {
			return math.Inf(1)
		}
		return math.Ceil(l.burst()/l.rate()) * l.Window
	}
	return l.ResetAfter(0)
}

// ResetAfter returns the number of seconds until a bucket holding tokens is
// full again, assuming nothing takes from it: (Burst-tokens)/Rate, never
// negative. Tokens outside [-MaxDebt, Burst] are clamped, and NaN or infinite tokens
// count as a full bucket (0). It is 0 when the bucket is full or the Rate is
// +Inf, and +Inf when the bucket is not full and the Rate is invalid.
func (l Limit) ResetAfter(tokens float64) float64 {
	if tokens < 0 && finite(tokens) {
		if d := l.debt(); tokens < -d {
			tokens = -d
		}
	}
	return l.resetAfter(tokens)
}

// resetAfter is ResetAfter for tokens already clamped below (or not
// finite). Kept apart so that it inlines into the hot path (FullAfter from
// Take), which the debt clamp made too big to inline: Take went from 9 to
// 40 ns.
func (l Limit) resetAfter(tokens float64) float64 {
	burst := l.burst()
	if !finite(tokens) || tokens >= burst {
		return 0
	}
	return (burst - tokens) / l.rate() // x/0 = +Inf, x/+Inf = 0 for x > 0
}

// Refill returns s advanced to now: the tokens gained since s.Last, capped at
// Burst.
//
// Edge cases:
//   - Tokens are first clamped to [-MaxDebt, Burst]; a state with NaN or infinite
//     Tokens, or a non-finite Last, is a full bucket anchored at now.
//   - If now is NaN or infinite, nothing is refilled and Last is unchanged.
//   - If now >= s.Last, elapsed*Rate tokens are added (at most up to Burst,
//     however large the gap) and Last becomes now.
//   - If now < s.Last the clock went backwards and nothing is refilled. When
//     the gap is at most MaxClockSkew, Last is kept, so that a worker whose
//     clock read slightly earlier than another's does not count the same
//     interval twice; when it is larger, the clock was stepped back and Last
//     becomes now, so that the bucket does not freeze until the clock
//     catches up.
//   - A Rate of +Inf makes the bucket full whatever the elapsed time.
func (l Limit) Refill(s State, now float64) State {
	burst := l.burst()
	if !finite(s.Tokens) || !finite(s.Last) {
		if finite(now) {
			return State{Tokens: burst, Last: l.windowStart(now)}
		}
		return State{Tokens: burst, Last: s.Last}
	}
	if l.fixed() {
		return l.refillWindows(s, now)
	}
	tokens := s.Tokens
	if tokens > burst {
		tokens = burst
	} else if d := l.debt(); tokens < -d {
		tokens = -d
	}
	rate := l.rate()
	if math.IsInf(rate, 1) {
		tokens = burst
	}
	switch {
	case !finite(now):
		return State{Tokens: tokens, Last: s.Last}
	case now < s.Last:
		if s.Last-now > MaxClockSkew {
			return State{Tokens: tokens, Last: now}
		}
		return State{Tokens: tokens, Last: s.Last}
	}
	// now >= s.Last; elapsed may be +Inf if both are huge and of opposite
	// signs, and elapsed*rate may overflow to +Inf: refilled's comparison
	// caps either at burst without producing NaN.
	if elapsed := now - s.Last; elapsed > 0 && tokens < burst {
		tokens = refilled(tokens, burst, elapsed*rate)
	}
	return State{Tokens: tokens, Last: now}
}

// refilled is tokens with add more, capped at burst (add may be +Inf;
// tokens < burst).
func refilled(tokens, burst, add float64) float64 {
	if add >= burst-tokens {
		return burst
	}
	if add > 0 {
		tokens += add
		if tokens > burst { // rounding
			return burst
		}
	}
	return tokens
}

// refillWindows is Refill for a fixed window: Rate tokens for each window
// start passed since s.Last, up to Burst, and Last moved to the start of the
// current window. A clock behind s.Last refills nothing.
func (l Limit) refillWindows(s State, now float64) State {
	burst := l.burst()
	tokens := math.Min(math.Max(s.Tokens, 0), burst)
	if !finite(now) || now < s.Last {
		if finite(now) && s.Last-now > MaxClockSkew {
			return State{Tokens: tokens, Last: l.windowStart(now)}
		}
		return State{Tokens: tokens, Last: s.Last}
	}
	n := math.Floor((now - s.Last) / l.Window)
	if n >= 1 {
		if add := n * l.rate(); add >= burst-tokens {
			tokens = burst
		} else if add > 0 {
			tokens += add
		}
		s.Last += n * l.Window
	}
	return State{Tokens: tokens, Last: s.Last}
}

// Take refills s to now and takes cost tokens if the bucket holds at least
// that many, or, with a reservation (Limit.Reserve), if taking them leaves
// at least -Reserve. It returns the new state and the decision.
//
// On rejection the returned State is the refilled one: nothing is taken, but
// storing it is harmless. A cost below 0 is treated as 0 (always allowed,
// unless the bucket is in debt beyond its reservation; takes nothing); a NaN
// or infinite cost, or a cost above Burst + Reserve, is never allowed
// (RetryAfter +Inf). Take does not allocate.
func (l Limit) Take(s State, now, cost float64) (State, Result) {
	if fastTake {
		if next, res, ok := l.takePlain(s, now, cost); ok {
			return next, res
		}
	}
	s = l.Refill(s, now)
	if cost < 0 {
		cost = 0
	}
	r := l.reserve()
	if s.Tokens+r >= cost { // false for a NaN cost
		s.Tokens -= cost // without a reservation never below 0: rounding is monotonic
		if s.Tokens < 0 {
			return l.reserved(s, now, r)
		}
		return s, Result{Allowed: true, Tokens: s.Tokens, FullIn: l.FullAfter(s, now)}
	}
	retry := l.retryAfter(s.Tokens+r, cost, r)
	if l.fixed() && !math.IsInf(retry, 1) {
		retry = l.untilWindows(s, now, cost-s.Tokens)
	}
	return s, Result{Tokens: s.Tokens, RetryAfter: retry, FullIn: l.FullAfter(s, now)}
}

// takePlain is Take for the common case, a continuous bucket (Window 0)
// without debt (MaxDebt 0) whose rate and burst are finite and > 0,
// holding 0 to Burst tokens, read at a finite now not before its Last,
// admitting a cost >= 0: Take's arithmetic without the checks and clamps
// that cannot apply. It reports false, having decided nothing, for
// anything else (a rejection included), which the rest of Take decides.
// Its results are those of the rest of Take, bit for bit
// (TestTakePlainEquivalence).
func (l Limit) takePlain(s State, now, cost float64) (State, Result, bool) {
	rate, burst, tokens := l.Rate, l.Burst, s.Tokens
	elapsed := now - s.Last // NaN or ±Inf unless both are finite (or overflow)
	if l.Window != 0 || l.MaxDebt != 0 || !(rate > 0 && rate <= math.MaxFloat64) ||
		!(burst > 0 && burst <= math.MaxFloat64) || !(tokens >= 0 && tokens <= burst) ||
		!(now <= math.MaxFloat64 && elapsed >= 0 && elapsed <= math.MaxFloat64) || !(cost >= 0) {
		return State{}, Result{}, false
	}
	// Refill: now >= s.Last, both finite.
	if elapsed > 0 && tokens < burst {
		tokens = refilled(tokens, burst, elapsed*rate)
	}
	if !(tokens >= cost) {
		return State{}, Result{}, false
	}
	tokens -= cost // never below 0: rounding is monotonic
	full := 0.0
	if tokens < burst {
		full = (burst - tokens) / rate
	}
	return State{Tokens: tokens, Last: now}, Result{Allowed: true, Tokens: tokens, FullIn: full}, true
}

// reserved is the result of a Take that admitted a cost into the
// reservation r > 0, leaving s.Tokens < 0: the tokens are kept at -r or
// above (tokens - cost may round below it).
func (l Limit) reserved(s State, now, r float64) (State, Result) {
	s.Tokens = max(s.Tokens, -r)
	return s, Result{Allowed: true, Tokens: s.Tokens, FullIn: l.FullAfter(s, now)}
}

// Delay returns the number of seconds until the tokens are back at zero
// after res, a decision of Take, admitted a cost into the reservation
// (Limit.Reserve), leaving res.Tokens below zero: how long a caller that
// holds the request until its debt is paid back waits, -Tokens/Rate. It is
// 0 for any other result (rejected, or tokens >= 0), and so always 0
// without a reservation; +Inf if the Limit does not refill.
func (l Limit) Delay(res Result) float64 {
	if !res.Allowed || !(res.Tokens < 0) {
		return 0
	}
	return -res.Tokens / l.rate()
}

// FullAfter returns the seconds from now until s, refilled to now, is full,
// assuming nothing takes from it.
func (l Limit) FullAfter(s State, now float64) float64 {
	if !l.fixed() {
		if s.Tokens >= 0 {
			return l.resetAfter(s.Tokens)
		}
		return l.ResetAfter(s.Tokens)
	}
	if s.Tokens >= l.burst() {
		return 0
	}
	if l.rate() == 0 {
		return math.Inf(1)
	}
	return l.untilWindows(s, now, l.burst()-s.Tokens)
}

// untilWindows returns the seconds from now until the window start that
// brings need more tokens to s: always > 0.
func (l Limit) untilWindows(s State, now, need float64) float64 {
	d := s.Last + math.Ceil(need/l.rate())*l.Window - now
	if d <= 0 {
		return math.SmallestNonzeroFloat64
	}
	return d
}

// retryAfter returns the seconds until tokens grow to cost > tokens: always
// > 0, +Inf if never. tokens include the reservation r, so a cost up to
// Burst + r can be met.
func (l Limit) retryAfter(tokens, cost, r float64) float64 {
	rate := l.rate()
	if !(cost <= l.burst()+r) || rate == 0 {
		return math.Inf(1)
	}
	d := (cost - tokens) / rate
	if d <= 0 { // underflow with tiny shortfalls and huge rates
		return math.SmallestNonzeroFloat64
	}
	return d
}

// Refund refills s to now and gives cost tokens back, capped at Burst. It
// compensates for a Take whose effect had to be undone, for example when a
// later bucket of an all-or-nothing update failed to commit. A cost that is
// not > 0 (including NaN) changes nothing but the refill; +Inf fills the
// bucket.
func (l Limit) Refund(s State, now, cost float64) State {
	s = l.Refill(s, now)
	if cost > 0 {
		burst := l.burst()
		if cost >= burst-s.Tokens {
			s.Tokens = burst
		} else {
			s.Tokens += cost
		}
	}
	return s
}

// Charge refills s to now and takes cost tokens whatever the bucket holds:
// the tokens may go below zero, down to -MaxDebt, and what lies beyond that
// is forgiven. It settles the cost of a request that was admitted before its
// cost was known (the tokens a response reports). Without MaxDebt the tokens
// stop at 0. A cost that is not > 0 (including NaN) changes nothing but the
// refill; +Inf empties the bucket down to -MaxDebt.
func (l Limit) Charge(s State, now, cost float64) State {
	s = l.Refill(s, now)
	if cost > 0 {
		floor := -l.debt()
		if cost >= s.Tokens-floor {
			s.Tokens = floor
		} else {
			s.Tokens -= cost
		}
	}
	return s
}

// Reset returns a full bucket at now, keeping the phase of a fixed window:
// "reset after a successful login".
func (l Limit) Reset(s State, now float64) State {
	s = l.Refill(s, now)
	s.Tokens = l.burst()
	return s
}
