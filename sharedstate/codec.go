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
// never admits more than it holds; NaN and infinite tokens are written as 0
// (bucket.Limit never produces them). Negative tokens, a bucket in debt
// (bucket.Limit.MaxDebt: a settled cost, or an admission into a
// reservation), are written with a leading '-', floored too (the debt rounds
// up). From 2^53 micro-tokens
// (about 9.007e9 tokens) on, tokens are floored to a whole number. Last is
// formatted with strconv's 'f', 6 (rounded to the microsecond): pass a time
// from Quantize for an exact round trip.
//
// AppendState does not allocate when dst has room for the value; 48 bytes
// hold any state with tokens and last below 1e15.
func AppendState(dst []byte, s bucket.State) []byte {
	t := s.Tokens
	if t < 0 && t > -maxExactMicros/micro {
		// Debt: -ceil(-t) to the microunit, so that the stored debt is
		// never smaller than the exact one.
		d := floorMicro(-t)
		if d < -t {
			d = (math.Round(d*micro) + 1) / micro
		}
		if d > 0 {
			dst = append(dst, '-')
			dst = appendMicro(dst, d)
			dst = append(dst, ':')
			return appendMicro(dst, s.Last)
		}
	}
	switch {
	case !(t > 0) || math.IsInf(t, 1): // NaN, <= 0, +Inf
		t = 0
	case t*micro >= maxExactMicros:
		t = math.Floor(t)
	default:
		t = floorMicro(t)
	}
	dst = appendMicro(dst, t)
	dst = append(dst, ':')
	return appendMicro(dst, s.Last)
}

// maxFastMicro bounds the values appendMicro formats without strconv: below
// 2^33, half an ulp of a float64 is under half a microunit, so the nearest
// microunit n of x is what 'f', 6 prints whenever n/1e6 == x.
const maxFastMicro = 1 << 33

// appendMicro appends x as strconv.AppendFloat(dst, x, 'f', 6, 64) does.
// When x is a whole number of microunits (n/1e6 for an integer n, as
// Quantize and floorMicro return) below 2^33, which is every time and
// token count the Updater writes, it prints n's digits directly: strconv's
// 16-digit path costs several times more in the wasm guest.
func appendMicro(dst []byte, x float64) []byte {
	if !(x >= 0 && x < maxFastMicro) {
		return strconv.AppendFloat(dst, x, 'f', 6, 64)
	}
	n := math.Round(x * micro)
	if n/micro != x {
		return strconv.AppendFloat(dst, x, 'f', 6, 64)
	}
	// Digits by hand in 32-bit pieces: the Go wasm backend divides a
	// uint64 by a constant with a dozen emulated multiplies a step, a
	// uint32 with one.
	u := uint64(n)
	ip := uint64(x) // the whole part, corrected below (x may round up)
	if ip*micro > u {
		ip--
	}
	frac := u - ip*micro
	if frac >= micro {
		ip, frac = ip+1, frac-micro
	}
	var buf [24]byte
	i := len(buf)
	f := uint32(frac)
	for range 3 { // two digits a step: half the divisions
		i -= 2
		q := f / 100
		d := (f - q*100) * 2
		buf[i], buf[i+1] = digitPairs[d], digitPairs[d+1]
		f = q
	}
	i--
	buf[i] = '.'
	if ip >= 1<<32 {
		lo := uint32(ip % 1e9)
		ip /= 1e9
		for range 4 {
			i -= 2
			q := lo / 100
			d := (lo - q*100) * 2
			buf[i], buf[i+1] = digitPairs[d], digitPairs[d+1]
			lo = q
		}
		i--
		buf[i] = byte('0' + lo)
	}
	w := uint32(ip)
	for w >= 100 {
		i -= 2
		q := w / 100
		d := (w - q*100) * 2
		buf[i], buf[i+1] = digitPairs[d], digitPairs[d+1]
		w = q
	}
	if w >= 10 {
		i -= 2
		buf[i], buf[i+1] = digitPairs[2*w], digitPairs[2*w+1]
	} else {
		i--
		buf[i] = byte('0' + w)
	}
	return append(dst, buf[i:]...)
}

// digitPairs holds "00" to "99": appendMicro's digits, two at a time.
const digitPairs = "00010203040506070809101112131415161718192021222324252627282930313233343536373839" +
	"40414243444546474849505152535455565758596061626364656667686970717273747576777879" +
	"8081828384858687888990919293949596979899"

// ParseState parses a shared-data value written by AppendState.
//
// It is strict: the value must be two decimal numbers (digits with an
// optional fractional part, as AppendState writes, any number of decimals)
// separated by exactly one ':'; tokens may carry a leading '-' (a bucket in
// debt) and last_refill must be > 0, both finite. Signs, exponents, spaces, "NaN" and "Inf" are errors. The error
// names the problem and quotes the value, truncated to 48 bytes.
//
// ParseState does not check that last_refill is in the past: a timestamp far
// in the future is the caller's decision (see Updater.MaxFuture).
//
// ParseState does not allocate unless it returns an error.
func ParseState(b []byte) (bucket.State, error) {
	if binaryValues {
		if st, _, hasOwner, err, ok := parseBinary(b); ok {
			if err == nil && hasOwner {
				return bucket.State{}, errBinaryOwner
			}
			return st, err
		}
	}
	if st, end, ok := parseStateFast(b); ok && end == len(b) {
		return st, nil
	}
	return parseStateStrict(b)
}

// parseStateStrict is ParseState without the fast path: it validates every
// byte and says what is wrong.
func parseStateStrict(b []byte) (bucket.State, error) {
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
	tb, neg := b[:colon], false
	if len(tb) > 1 && tb[0] == '-' && isDecimal(tb[1:]) {
		tb, neg = tb[1:], true
	}
	tokens, msg := parseDecimal(tb, "tokens")
	if neg {
		tokens = -tokens
	}
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
	if v, ok := parseMicro(b); ok {
		return v, ""
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

// parseStateFast parses "{tokens}:{last_refill}" at the start of b in one
// pass, as AppendState writes it (digits, then '.' and one to six digits),
// with last_refill > 0, and returns the state and where it stopped: len(b),
// or the index of a ':' that follows (a slot value's owner). ok is false for
// anything else, which the strict path (ParseState) then handles. Inside the
// wasm guest each pass over the bytes costs a few nanoseconds a byte.
func parseStateFast(b []byte) (s bucket.State, end int, ok bool) {
	i := 0
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		i = 1
	}
	var v [2]float64
	for f := range 2 {
		// One comparison a byte: digits, then '.' and digits. At most 13
		// digits before the point (a valid value has 10; leading zeros
		// beyond that go to the strict path) keep n·10⁶ within a uint64,
		// so the bound 2^53 is checked once, at the end.
		start := i
		var n uint64
		for i < len(b) && b[i]-'0' <= 9 {
			n = n*10 + uint64(b[i]-'0')
			i++
		}
		digits := i - start
		if digits == 0 || digits > 13 {
			return s, 0, false
		}
		decimals := 0
		if i < len(b) && b[i] == '.' {
			i++
			from := i
			for i < len(b) && i-from < 7 && b[i]-'0' <= 9 {
				n = n*10 + uint64(b[i]-'0')
				i++
			}
			if decimals = i - from; decimals == 0 || decimals > 6 {
				return s, 0, false // a '.' without digits, or a seventh decimal
			}
		}
		if n *= pow10[6-decimals]; n >= maxExactMicros {
			return s, 0, false
		}
		v[f] = float64(n) / micro
		if f == 0 {
			if i == len(b) || b[i] != ':' {
				return s, 0, false
			}
			i++
		}
	}
	if i < len(b) && b[i] != ':' || !(v[1] > 0) {
		return s, 0, false
	}
	if neg {
		v[0] = -v[0]
	}
	return bucket.State{Tokens: v[0], Last: v[1]}, i, true
}

// pow10[k] is 10^k, for k in [0, 6].
var pow10 = [7]uint64{1, 10, 100, 1000, 10000, 100000, 1000000}

// parseMicro parses digits[.digits] with at most 6 decimals whose value in
// microunits n is below 2^53, the values AppendState writes, without
// strconv: n and 1e6 are exact float64s, so n/1e6 is the float64 nearest
// the decimal, exactly what strconv.ParseFloat returns. ok is false for
// anything else; b has passed isDecimal.
func parseMicro(b []byte) (float64, bool) {
	var n uint64
	decimals := -1
	for _, c := range b {
		if c == '.' {
			decimals = 0
			continue
		}
		if decimals >= 0 {
			if decimals == 6 {
				return 0, false
			}
			decimals++
		}
		n = n*10 + uint64(c-'0')
		if n >= maxExactMicros {
			return 0, false
		}
	}
	if decimals < 0 {
		decimals = 0
	}
	for ; decimals < 6; decimals++ {
		n *= 10
		if n >= maxExactMicros {
			return 0, false
		}
	}
	return float64(n) / micro, true
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

// AppendSlotValue appends "{tokens}:{last_refill}:{owner}" to dst.
func AppendSlotValue(dst []byte, s bucket.State, owner string) []byte {
	dst = AppendState(dst, s)
	dst = append(dst, ':')
	return append(dst, owner...)
}

// ParseSlotValue parses a slot value. hasOwner is false for a value in the
// unbounded "{tokens}:{last_refill}" format. The owner may itself contain
// ':' (IPv6 addresses); only the first two separate fields.
func ParseSlotValue(b []byte) (s bucket.State, owner string, hasOwner bool, err error) {
	s, o, hasOwner, err := parseValue(b)
	return s, string(o), hasOwner, err
}

// parseValue parses a value in either format, "{tokens}:{last_refill}" or
// a slot's "{tokens}:{last_refill}:{owner}": the one parser of stored
// values. owner is a sub-slice of b. It does not allocate unless it returns
// an error.
func parseValue(b []byte) (s bucket.State, owner []byte, hasOwner bool, err error) {
	if binaryValues {
		if s, owner, hasOwner, err, ok := parseBinary(b); ok {
			return s, owner, hasOwner, err
		}
	}
	if st, end, ok := parseStateFast(b); ok {
		if end < len(b) {
			return st, b[end+1:], true, nil
		}
		return st, nil, false, nil
	}
	state, owner, hasOwner := splitSlotValue(b)
	s, err = parseStateStrict(state)
	return s, owner, hasOwner, err
}

// splitSlotValue splits a slot value into its state and owner parts without
// copying; see ParseSlotValue.
func splitSlotValue(b []byte) (state, owner []byte, hasOwner bool) {
	first := -1
	for i, c := range b {
		if c != ':' {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		return b[:i], b[i+1:], true
	}
	return b, nil, false
}
