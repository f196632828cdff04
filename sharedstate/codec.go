package sharedstate

import (
	"errors"
	"math"
	"strconv"

	"github.com/tokengate/tokengate/bucket"
)

// micro is the resolution of the stored numbers: 6 decimals.
const micro = 1e6

// maxExactMicros is 2^53: below it every whole number of microunits is an
// exact float64, so n/micro is the float64 nearest to the decimal n·10⁻⁶,
// which is what strconv.ParseFloat returns for it.
const maxExactMicros = 1 << 53

// floorMicro returns the largest float64 of the form n/1e6 (n an integer) not
// above x, for finite x >= 0 with x*1e6 < 2^53. Formatting it with 'f', 6
// prints n exactly, and parsing that back returns the same float64.
func floorMicro(x float64) float64 {
	n := math.Floor(x * micro)
	// x*micro is rounded, so n may be one off either way; n/micro is
	// correctly rounded, so comparing it with x decides exactly.
	if (n+1)/micro <= x {
		n++
	} else if n > 0 && n/micro > x {
		n--
	}
	return n / micro
}

// Quantize floors now, in seconds since the Unix epoch, to the microsecond,
// so that a last_refill written by AppendState parses back to exactly the
// same float64 and a re-read bucket sees no phantom elapsed time.
//
// From 2^53 µs (about 9.007e9 s, the year 2255) on, a float64 cannot hold
// microseconds and Quantize floors to the second. NaN, ±Inf and values <= 0
// (never a valid time here) are returned unchanged.
func Quantize(now float64) float64 {
	switch {
	case !(now > 0) || math.IsInf(now, 1):
		return now
	case now*micro >= maxExactMicros:
		return math.Floor(now)
	}
	return floorMicro(now)
}

// AppendState appends the shared-data value of s, "{tokens}:{last_refill}"
// with exactly 6 decimals each (for example "87.432100:1736940000.000000"),
// to dst and returns the extended slice.
//
// Tokens are floored to 6 decimals, never rounded up, so that storing a state
// never admits more than it holds; NaN, infinite or negative tokens are
// written as 0 (bucket.Limit never produces them). From 2^53 micro-tokens
// (about 9.007e9 tokens) on, tokens are floored to a whole number. Last is
// formatted with strconv's 'f', 6 (rounded to the microsecond): pass a time
// from Quantize for an exact round trip.
//
// AppendState does not allocate when dst has room for the value; 48 bytes
// hold any state with tokens and last below 1e15.
func AppendState(dst []byte, s bucket.State) []byte {
	t := s.Tokens
	switch {
	case !(t > 0) || math.IsInf(t, 1): // NaN, <= 0, +Inf
		t = 0
	case t*micro >= maxExactMicros:
		t = math.Floor(t)
	default:
		t = floorMicro(t)
	}
	dst = strconv.AppendFloat(dst, t, 'f', 6, 64)
	dst = append(dst, ':')
	return strconv.AppendFloat(dst, s.Last, 'f', 6, 64)
}

// ParseState parses a shared-data value written by AppendState.
//
// It is strict: the value must be two decimal numbers (digits with an
// optional fractional part, as AppendState writes, any number of decimals)
// separated by exactly one ':'; tokens must be >= 0 and last_refill > 0, both
// finite. Signs, exponents, spaces, "NaN" and "Inf" are errors. The error
// names the problem and quotes the value, truncated to 48 bytes.
//
// ParseState does not check that last_refill is in the past: a timestamp far
// in the future is the caller's decision (see Updater.MaxFuture).
//
// ParseState does not allocate unless it returns an error.
func ParseState(b []byte) (bucket.State, error) {
	colon := -1
	for i, c := range b {
		if c == ':' {
			if colon >= 0 {
				return bucket.State{}, stateError("more than one ':'", b)
			}
			colon = i
		}
	}
	if colon < 0 {
		return bucket.State{}, stateError("missing ':'", b)
	}
	tokens, msg := parseDecimal(b[:colon], "tokens")
	if msg != "" {
		return bucket.State{}, stateError(msg, b)
	}
	last, msg := parseDecimal(b[colon+1:], "last_refill")
	if msg != "" {
		return bucket.State{}, stateError(msg, b)
	}
	if !(last > 0) {
		return bucket.State{}, stateError("last_refill: must be > 0", b)
	}
	return bucket.State{Tokens: tokens, Last: last}, nil
}

// parseDecimal parses digits[.digits] (a leading '-' is reported as
// negative) and returns the value, or a message starting with field.
func parseDecimal(b []byte, field string) (float64, string) {
	if len(b) == 0 {
		return 0, field + ": empty"
	}
	if b[0] == '-' {
		if isDecimal(b[1:]) {
			return 0, field + ": negative"
		}
		return 0, field + ": not a decimal number"
	}
	if !isDecimal(b) {
		return 0, field + ": not a decimal number"
	}
	// The conversion does not escape, so for short values the compiler
	// keeps it on the stack; b is digits only, so the only possible error
	// is a value out of range.
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil || math.IsInf(v, 0) {
		return 0, field + ": out of range"
	}
	return v, ""
}

// isDecimal reports whether b is one or more digits, optionally followed by
// '.' and one or more digits.
func isDecimal(b []byte) bool {
	i := 0
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	if i == 0 {
		return false
	}
	if i == len(b) {
		return true
	}
	if b[i] != '.' || i+1 == len(b) {
		return false
	}
	for i++; i < len(b); i++ {
		if b[i] < '0' || '9' < b[i] {
			return false
		}
	}
	return true
}

// maxQuoted is how much of a bad value an error message quotes.
const maxQuoted = 48

// stateError returns the error for a bad stored value b.
func stateError(msg string, b []byte) error {
	q := b
	more := ""
	if len(q) > maxQuoted {
		q = q[:maxQuoted]
		more = "..."
	}
	return errors.New("sharedstate: bad state " + strconv.Quote(string(q)) + more + ": " + msg)
}
