package sharedstate

import (
	"errors"
	"strconv"
)

// Lease mode (docs/lease.md): a proxy process keeps, per cluster bucket, an
// allowance of tokens leased from the global bucket, in one shared-data
// record updated with a bounded compare-and-swap loop.

const leaseKeyPrefix = "tl:"

// LeaseHolderKey is the shared-data key of the process's holder id, 16 hex
// digits, created by the first worker that needs it.
const LeaseHolderKey = "tl:holder"

// AppendLeaseKey appends the allowance key "tl:{rule}:{composite}" to dst;
// the values are encoded as AppendKey encodes them.
func AppendLeaseKey(dst []byte, rule string, values []string) []byte {
	dst = append(dst, leaseKeyPrefix...)
	dst = append(dst, rule...)
	dst = append(dst, ':')
	for i, v := range values {
		if i > 0 {
			dst = append(dst, '|')
		}
		dst = appendValue(dst, v)
	}
	return dst
}

// LeaseRecord is a process's allowance for one cluster bucket. Times are
// seconds since the Unix epoch; 0 means unset.
type LeaseRecord struct {
	_ incomparable
	// Tokens is the unspent allowance, worthless from Expiry on.
	Tokens float64
	// Expiry is when the allowance stops being spendable.
	Expiry float64
	// Grant is the id of the grant the tokens belong to (0: none).
	Grant uint64
	// Used is the tokens debited, or asked for by cold requests, since
	// Since: the observed local demand.
	Used  float64
	Since float64
	// Claim is the deadline of the lease call in flight (0: none) and
	// Claimer the sequence number of the last claim: every claim adds one,
	// so a value that did not change means no lease request was sent.
	Claim   float64
	Claimer uint32
	// Retry is the time until which the global bucket is known empty.
	Retry float64
	// Down is the time the last lease call failed (0 once one succeeds):
	// the requests that were waiting for it meet on_error.
	Down float64
	// Hold is the time before which the periodic refill does not call
	// again (one call per refill period and process).
	Hold float64
	// Ramp is the allowance size the last call aimed for, when the service
	// granted all of it (0 otherwise): a request that finds the allowance
	// spent may then ask at once for at least twice as much.
	Ramp float64
	// RTT is the measured round trip of lease calls, seconds (a moving
	// average; 0 before the first answer).
	RTT float64
	// Wait is the cost of the requests that started waiting since the
	// last claim: what an exact take for them asks.
	Wait float64
	// Taken is what is left of the tokens the last exact take took from
	// the global bucket for the requests counted in Wait when it was
	// claimed, and TakenSeq that claim's sequence number: only those
	// requests (counted while Claimer was TakenSeq's predecessor) may
	// spend them.
	Taken    float64
	TakenSeq uint32
}

// Spendable returns the tokens that may be spent at now: Tokens before
// Expiry, else 0.
func (r *LeaseRecord) Spendable(now float64) float64 {
	if now < r.Expiry {
		return r.Tokens
	}
	return 0
}

// AppendLeaseRecord appends the stored form of r,
// "tokens:expiry:grant:used:since:claim:claimer:retry:down:hold:ramp:rtt:wait:taken:takenseq",
// to dst. Tokens, Used, Wait and Taken are floored to 6 decimals (a stored
// allowance never holds more than r), times are written with 6 decimals.
func AppendLeaseRecord(dst []byte, r LeaseRecord) []byte {
	dst = appendMicro(dst, nonNeg(r.Tokens))
	dst = append(dst, ':')
	dst = appendMicro(dst, nonNeg(r.Expiry))
	dst = append(dst, ':')
	dst = strconv.AppendUint(dst, r.Grant, 10)
	dst = append(dst, ':')
	dst = appendMicro(dst, nonNeg(r.Used))
	dst = append(dst, ':')
	dst = appendMicro(dst, nonNeg(r.Since))
	dst = append(dst, ':')
	dst = appendMicro(dst, nonNeg(r.Claim))
	dst = append(dst, ':')
	dst = strconv.AppendUint(dst, uint64(r.Claimer), 10)
	dst = append(dst, ':')
	dst = appendMicro(dst, nonNeg(r.Retry))
	for _, x := range [...]float64{r.Down, r.Hold, r.Ramp, r.RTT, r.Wait, r.Taken} {
		dst = append(dst, ':')
		dst = appendMicro(dst, nonNeg(x))
	}
	dst = append(dst, ':')
	return strconv.AppendUint(dst, uint64(r.TakenSeq), 10)
}

// nonNeg floors x to 6 decimals; NaN, negative and huge values become 0
// (never valid here).
func nonNeg(x float64) float64 {
	if !(x > 0) || x*micro >= maxExactMicros {
		return 0
	}
	return floorMicro(x)
}

var errLeaseRecord = errors.New("sharedstate: malformed lease record")

// ParseLeaseRecord parses a value written by AppendLeaseRecord. It does not
// allocate unless it fails.
func ParseLeaseRecord(b []byte) (LeaseRecord, error) {
	var r LeaseRecord
	var f [15][]byte
	n := 0
	start := 0
	for i := 0; i <= len(b); i++ {
		if i == len(b) || b[i] == ':' {
			if n == len(f) {
				return r, errLeaseRecord
			}
			f[n] = b[start:i]
			n++
			start = i + 1
		}
	}
	if n != len(f) {
		return r, errLeaseRecord
	}
	floats := [...]*float64{0: &r.Tokens, 1: &r.Expiry, 3: &r.Used, 4: &r.Since, 5: &r.Claim, 7: &r.Retry, 8: &r.Down,
		9: &r.Hold, 10: &r.Ramp, 11: &r.RTT, 12: &r.Wait, 13: &r.Taken}
	for i, dst := range floats {
		if dst == nil {
			continue
		}
		if !isDecimal(f[i]) {
			return r, errLeaseRecord
		}
		v, ok := parseMicro(f[i])
		if !ok {
			return r, errLeaseRecord
		}
		*dst = v
	}
	g, ok := parseUint(f[2])
	c, ok2 := parseUint(f[6])
	ts, ok3 := parseUint(f[14])
	if !ok || !ok2 || !ok3 || c > 1<<32-1 || ts > 1<<32-1 {
		return r, errLeaseRecord
	}
	r.Grant, r.Claimer, r.TakenSeq = g, uint32(c), uint32(ts)
	return r, nil
}

func parseUint(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, true
}

// LeaseUpdater updates allowance records with a bounded get → change →
// compare-and-swap loop. A missing key is first created holding an empty
// record (as Updater seeds buckets: never overwriting a record another
// worker created), so two workers can never both believe they wrote first.
// A corrupt record reads as an empty one, which only loses tokens.
//
// Use it from one goroutine (one per plugin, like Updater).
type LeaseUpdater struct {
	Store Store
	// MaxAttempts bounds the rounds (DefaultMaxAttempts when <= 0).
	MaxAttempts int
	// Backoff, if set, runs after a CAS mismatch.
	Backoff func(attempt int)

	buf []byte
}

// Update reads the record under key, lets change modify it, and writes it
// if change returns true, retrying from the read on a CAS mismatch. It
// returns the record as last read and changed, whether it was written, and
// the store's error or ErrContention. change may run several times and must
// depend only on its argument.
func (u *LeaseUpdater) Update(key string, change func(r *LeaseRecord) bool) (LeaseRecord, bool, error) {
	attempts := u.MaxAttempts
	if attempts <= 0 {
		attempts = DefaultMaxAttempts
	}
	for a := 1; a <= attempts; a++ {
		v, cas, err := u.Store.Get(key)
		if errors.Is(err, ErrNotFound) {
			u.buf = AppendLeaseRecord(u.buf[:0], LeaseRecord{})
			if _, err := create(u.Store, key, u.buf); err != nil {
				return LeaseRecord{}, false, err
			}
			continue
		}
		if err != nil {
			return LeaseRecord{}, false, err
		}
		r, perr := ParseLeaseRecord(v)
		if perr != nil {
			r = LeaseRecord{}
		}
		if !change(&r) {
			return r, false, nil
		}
		u.buf = AppendLeaseRecord(u.buf[:0], r)
		err = u.Store.Set(key, u.buf, cas)
		if err == nil {
			return r, true, nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return LeaseRecord{}, false, err
		}
		if u.Backoff != nil {
			u.Backoff(a)
		}
	}
	return LeaseRecord{}, false, ErrContention
}
