package sharedstate

import (
	"errors"
	"math"
	"strconv"
)

// Requests in flight
//
// A concurrency limit counts the requests of one identity that have been
// admitted and have not ended yet. Its shared-data value is
//
//	"{cur}:{prev}:{gen}"            (unbounded key)
//	"{cur}:{prev}:{gen}:{owner}"    (a slot, as for buckets)
//
// three unsigned integers: gen is the lease period the counts belong to,
// floor(now / lease); cur counts the requests admitted during period gen
// and not yet ended, prev those admitted during period gen-1. When the
// clock enters period gen+1 the counts shift (prev = cur, cur = 0); when
// it has moved two periods or more, both are dropped. A request releases
// its count in the period it was admitted in (cur) or the next (prev); a
// count nobody released, because the VM holding the stream died, is
// therefore forgotten after between one and two lease periods. A request
// that lasts longer than the lease may lose its count the same way, so the
// lease must exceed the longest request (docs/configuration.md).

// InFlight asks Updater.Acquire for one place among Max requests in flight
// under Key (and Alt, for a slotted identity, as Request does).
type InFlight struct {
	_               incomparable
	Key, Alt, Owner string
	Slotted         bool
	// Max is the number of requests that may be in flight at once, >= 1.
	Max int64
	// Lease is the lease period in seconds, > 0; see above.
	Lease float64

	// Stored and Gen are set by an acquiring Acquire: the key the count
	// was taken in and its period, for Release.
	Stored string
	Gen    int64
	// InFlight is the count after the decision (including this request
	// when it was admitted).
	InFlight int64
}

// inflightState is a decoded concurrency value.
type inflightState struct {
	cur, prev, gen int64
}

// total is the number of requests counted as in flight.
func (s inflightState) total() int64 { return s.cur + s.prev }

// advance moves s to period gen: counts older than the previous period are
// dropped. A clock behind s.gen changes nothing.
func (s inflightState) advance(gen int64) inflightState {
	switch {
	case gen <= s.gen:
		return s
	case gen == s.gen+1:
		return inflightState{cur: 0, prev: s.cur, gen: gen}
	}
	return inflightState{gen: gen}
}

// appendInflight appends the stored form of s (and its owner) to dst.
func appendInflight(dst []byte, s inflightState, owner string, hasOwner bool) []byte {
	dst = strconv.AppendInt(dst, s.cur, 10)
	dst = append(dst, ':')
	dst = strconv.AppendInt(dst, s.prev, 10)
	dst = append(dst, ':')
	dst = strconv.AppendInt(dst, s.gen, 10)
	if hasOwner {
		dst = append(dst, ':')
		dst = append(dst, owner...)
	}
	return dst
}

// maxInflightNumber bounds each stored number, so that sums never overflow.
const maxInflightNumber = 1 << 40

var errBadInflight = errors.New("sharedstate: bad in-flight value")

// parseInflight parses "cur:prev:gen[:owner]". The owner may contain ':'.
func parseInflight(b []byte) (s inflightState, owner []byte, hasOwner bool, err error) {
	var v [3]int64
	i := 0
	for f := range 3 {
		start := i
		var n int64
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			if n = n*10 + int64(b[i]-'0'); n >= maxInflightNumber {
				return s, nil, false, errBadInflight
			}
		}
		if i == start {
			return s, nil, false, errBadInflight
		}
		v[f] = n
		if f < 2 {
			if i == len(b) || b[i] != ':' {
				return s, nil, false, errBadInflight
			}
			i++
		}
	}
	s = inflightState{cur: v[0], prev: v[1], gen: v[2]}
	switch {
	case i == len(b):
		return s, nil, false, nil
	case b[i] == ':':
		return s, b[i+1:], true, nil
	}
	return inflightState{}, nil, false, errBadInflight
}

// ParseInFlight parses a concurrency value: the requests counted as in
// flight in lease period gen, with the owner of a slot. For tools and tests.
func ParseInFlight(b []byte) (cur, prev, gen int64, owner string, err error) {
	s, o, _, err := parseInflight(b)
	return s.cur, s.prev, s.gen, string(o), err
}

// leaseGen returns the lease period of now.
func leaseGen(now, lease float64) int64 {
	g := math.Floor(now / lease)
	if !(g >= 0) || g >= maxInflightNumber {
		return 0
	}
	return int64(g)
}

// inflightSlot is one candidate key as read.
type inflightSlot struct {
	key      string
	exists   bool
	state    inflightState // advanced to now's period; zero if missing or corrupt
	cas      uint32
	owner    []byte
	hasOwner bool
}

func (u *Updater) lookInflight(key string, gen int64) (inflightSlot, error) {
	v, cas, err := u.Store.Get(key)
	if errors.Is(err, ErrNotFound) {
		return inflightSlot{key: key, state: inflightState{gen: gen}}, nil
	}
	if err != nil {
		return inflightSlot{}, err
	}
	s, owner, hasOwner, perr := parseInflight(v)
	if perr != nil || s.gen > gen+1 {
		// Corrupt, or from a clock far ahead: counts nothing.
		return inflightSlot{key: key, exists: true, cas: cas, state: inflightState{gen: gen}}, nil
	}
	return inflightSlot{key: key, exists: true, state: s.advance(gen), cas: cas, owner: owner, hasOwner: hasOwner}, nil
}

// Acquire counts one more request in flight in every r of reqs if each has
// room (total < Max), and in none otherwise: each is its own bounded
// get → decide → compare-and-swap loop, and when the k-th has no room the
// k before it are released. It returns the index of the first full one, or
// -1 when all were counted, and the CAS mismatches seen. On an error
// (store failure, contention) nothing stays counted, except what a failed
// release could not undo.
//
// A slotted identity uses the candidate slot it owns; else one that is
// missing, corrupt or counts nothing (taken over); else it shares the
// candidate with fewer requests in flight, which can only make the limit
// stricter. A slot with a count in flight is never taken over, unlike a
// live bucket (TakeAll evicts the fuller of two): Release gives a count
// back to the slot it was taken in whoever owns it by then, so the evicted
// identity's releases would come off the newcomer's count
// (TestAcquireTakesOverIdleSlot).
func (u *Updater) Acquire(reqs []InFlight, now float64) (rejected, mismatches int, err error) {
	now = Quantize(now)
	if !(now > 0) || math.IsInf(now, 1) {
		return -1, 0, errBadNow
	}
	for i := range reqs {
		ok, n, err := u.acquire(&reqs[i], now)
		mismatches += n
		if err != nil || !ok {
			for j := 0; j < i; j++ {
				m, _ := u.Release(&reqs[j], now)
				mismatches += m
			}
			if err != nil {
				return -1, mismatches, err
			}
			return i, mismatches, nil
		}
	}
	return -1, mismatches, nil
}

func (u *Updater) acquire(r *InFlight, now float64) (bool, int, error) {
	gen := leaseGen(now, r.Lease)
	mismatches := 0
	for tries := 0; tries < u.maxAttempts(); tries++ {
		a, err := u.lookInflight(r.Key, gen)
		if err != nil {
			return false, mismatches, err
		}
		pick, owner, hasOwner := &a, r.Owner, r.Slotted
		var b inflightSlot
		if r.Slotted && !(a.hasOwner && string(a.owner) == r.Owner) {
			b = a
			if r.Alt != "" {
				if b, err = u.lookInflight(r.Alt, gen); err != nil {
					return false, mismatches, err
				}
			}
			mine := func(s *inflightSlot) bool { return s.hasOwner && string(s.owner) == r.Owner }
			free := func(s *inflightSlot) bool { return s.state.total() == 0 }
			switch {
			case mine(&b):
				pick = &b
			case free(&a):
			case free(&b):
				pick = &b
			default:
				// Both hold live counts of other identities: share the
				// one with fewer requests in flight, keeping its owner.
				if b.state.total() < a.state.total() {
					pick = &b
				}
				owner, hasOwner = string(pick.owner), pick.hasOwner
			}
		}
		r.InFlight = pick.state.total()
		if pick.state.total() >= r.Max {
			return false, mismatches, nil
		}
		if !pick.exists {
			// Seed the missing key with nothing in flight, never
			// overwriting one another worker created meanwhile (see
			// Updater), then read it again.
			u.buf = appendInflight(u.buf[:0], inflightState{gen: gen}, owner, hasOwner)
			n, err := create(u.Store, pick.key, u.buf)
			mismatches += n
			if err != nil {
				return false, mismatches, err
			}
			continue
		}
		next := pick.state
		next.cur++
		u.buf = appendInflight(u.buf[:0], next, owner, hasOwner)
		err = u.Store.Set(pick.key, u.buf, pick.cas)
		if err == nil {
			r.Stored, r.Gen, r.InFlight = pick.key, gen, next.total()
			return true, mismatches, nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return false, mismatches, err
		}
		mismatches++
		if u.Backoff != nil {
			u.Backoff(tries + 1)
		}
	}
	return false, mismatches, ErrContention
}

// Release ends the count an acquiring Acquire took for r, if it is still
// counted: in r.Gen's period (cur) or, once the clock has moved on by one
// period, as prev. A count older than that was already dropped by the
// lease and is left alone. It returns the CAS mismatches seen.
func (u *Updater) Release(r *InFlight, now float64) (int, error) {
	if r.Stored == "" {
		return 0, nil
	}
	now = Quantize(now)
	gen := leaseGen(now, r.Lease)
	if gen < r.Gen {
		gen = r.Gen // the clock went back: the count is still in cur
	}
	mismatches := 0
	for tries := 0; tries < u.maxAttempts(); tries++ {
		v, cas, err := u.Store.Get(r.Stored)
		if errors.Is(err, ErrNotFound) {
			return mismatches, nil
		}
		if err != nil {
			return mismatches, err
		}
		s, owner, hasOwner, perr := parseInflight(v)
		if perr != nil {
			return mismatches, nil
		}
		if s.gen < gen {
			s = s.advance(gen)
		}
		switch {
		case r.Gen == s.gen && s.cur > 0:
			s.cur--
		case r.Gen == s.gen-1 && s.prev > 0:
			s.prev--
		default:
			return mismatches, nil // dropped by the lease already
		}
		u.buf = appendInflight(u.buf[:0], s, string(owner), hasOwner)
		err = u.Store.Set(r.Stored, u.buf, cas)
		if err == nil {
			return mismatches, nil
		}
		if !errors.Is(err, ErrCASMismatch) {
			return mismatches, err
		}
		mismatches++
		if u.Backoff != nil {
			u.Backoff(tries + 1)
		}
	}
	return mismatches, ErrContention
}
