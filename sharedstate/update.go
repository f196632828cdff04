package sharedstate

import (
	"errors"
	"math"

	"github.com/tokengate/tokengate/bucket"
)

// SeedCAS is the cas with which Updater creates a missing key.
//
// On Envoy a missing key is created whatever the cas, and cas 0 is an
// unconditional write; a non-zero cas, however, fails with a CAS mismatch if
// another worker created the key in the meantime, so seeding with SeedCAS
// never overwrites a bucket someone else has just consumed from. Envoy's
// global counter only hands out MaxUint32 once every 2^32-1 writes; the
// residual risk is that a key whose current cas is exactly MaxUint32 and
// which is seeded at that moment by a worker that saw it missing (a worker
// that read NOT_FOUND just before the key was created) is reset to full.
//
// On Kong a non-zero cas on a missing key is a CAS mismatch, so Updater
// seeds there in two steps; see Updater.
const SeedCAS = math.MaxUint32

// DefaultMaxAttempts is the bound on read-decide-write rounds used when
// Updater.MaxAttempts is <= 0.
const DefaultMaxAttempts = 64

// DefaultMaxFuture is the value, in seconds, used when Updater.MaxFuture is
// not > 0.
const DefaultMaxFuture = 86400.0

// ErrContention is Outcome.Err when every attempt of Updater.TakeAll (or a
// bounded refund or seeding loop within it) lost its compare-and-swap race.
// The caller fails open.
var ErrContention = errors.New("sharedstate: too much contention: attempts exhausted")

var (
	errBadNow       = errors.New("sharedstate: now must be a finite time > 0 in seconds since the Unix epoch")
	errDuplicateKey = errors.New("sharedstate: the same key appears twice in one update")
)

// Request asks Updater.TakeAll to take Cost tokens from the bucket stored
// under Key, which refills according to Limit.
type Request struct {
	_     incomparable
	Key   string       // shared-data key, see AppendKey; the first candidate slot when Slotted
	Limit bucket.Limit // the bucket's rate and burst
	Cost  float64      // tokens to take

	// Slotted marks a request in a bounded key space (see "Bounded key
	// space" in key.go): Key and Alt are the identity's two candidate
	// slot keys (Alt empty if there is only one slot) and Owner its
	// composite key.
	Slotted bool
	Alt     string
	Owner   string

	// TookOver and Collided are set by TakeAll, for this request's bucket
	// in the last attempt: its slot was taken over from an idle or corrupt
	// owner (only if the new state was written), or both candidates held
	// live buckets of other identities and it evicted the fuller one.
	// Bounded key space only.
	TookOver, Collided bool

	// Stored is set by an allowed TakeAll: the key the cost was taken from
	// (Key, or Alt for a slotted request), for a later Refund.
	Stored string
}

// Outcome is the result of Updater.TakeAll.
type Outcome struct {
	// Allowed reports whether every bucket had enough tokens and every new
	// state was written.
	Allowed bool
	// Rejected is the index of the first request whose bucket lacked
	// tokens, or -1 if none did (also when Err is set).
	Rejected int
	// Results holds one result per request, from the last attempt; they are
	// meaningful when Err is nil. In a rejected outcome nothing was taken
	// from any bucket: a request whose bucket had enough tokens has
	// Allowed true but Tokens equal to the refilled, untouched count.
	Results []bucket.Result
	// Attempts is the number of read-decide-write rounds made; 1 means no
	// contention.
	Attempts int
	// CASRetries is the number of CAS mismatches seen, including those while
	// seeding missing keys (on Kong every new key costs one) and refunding.
	CASRetries int
	// Corrupt is the number of stored values read that did not parse or had
	// a last_refill more than MaxFuture after now. Each was treated as a full
	// bucket and overwritten with a valid state. A value read corrupt on two
	// attempts counts twice.
	Corrupt int
	// Takeovers is the number of slots taken over from an idle or corrupt
	// owner, and Collisions the number of requests that found both their
	// candidates live and evicted another identity's bucket (bounded key
	// space); Request.TookOver and Request.Collided say which. They describe
	// the last attempt; a takeover counts only if it was written.
	Takeovers, Collisions int
	// Err is non-nil when the store failed with something other than a CAS
	// mismatch, when attempts ran out (ErrContention), or when the inputs
	// were unusable (now not a finite time > 0, a key repeated). The caller
	// fails open. The buckets are left as they were: a partial commit has
	// been refunded, unless the refund itself failed, in which case tokens
	// were taken for a request that was not admitted (never the reverse).
	Err error
}

// Updater takes tokens from one or several buckets in a host's shared data,
// all or nothing, with a bounded get → decide → compare-and-swap loop.
//
// An Updater keeps scratch buffers so that TakeAll does not allocate; use it
// from one goroutine at a time (a proxy-wasm VM is single-threaded: keep one
// per plugin context). Store.Set must not keep the value slice after it
// returns (hosts copy it).
//
// # Algorithm
//
// now is first floored to the microsecond (Quantize). Each attempt:
//
//  1. Read every key. A missing key is seeded with a full bucket (below) and
//     read again. A value that does not parse, or whose last_refill is more
//     than MaxFuture after now, is corrupt and treated as a full bucket.
//  2. Decide each request with bucket.Limit.Take on the value read.
//  3. If any bucket lacks tokens, write nothing except repairs (with the
//     cas read; a failure is ignored): the full bucket replacing a corrupt
//     value, and the refilled state of a bucket re-anchored after the clock
//     stepped back; return Rejected = the first such index.
//  4. Otherwise Set each new state with the cas read for it. If the k-th
//     Set is a CAS mismatch, refund the k buckets already written and start
//     a new attempt; if it fails otherwise, refund them and return the
//     error.
//
// After MaxAttempts attempts the outcome is ErrContention. A refund is its
// own bounded loop per key: get, bucket.Limit.Refund, Set with that cas,
// retried on mismatch; a key that has vanished or turned corrupt is left
// alone (both read as a full bucket). A Get error other than NOT_FOUND
// returns at once, with nothing written in that attempt.
//
// # Seeding
//
// A missing key is created holding a full bucket at now, with cas SeedCAS:
// on Envoy that creates it, and fails if another worker created it first
// (where cas 0 would overwrite that worker's consumption). On a mismatch the
// key is read again: if it exists, another worker created it and it is used
// as read; if it is still missing, the host does not create keys with a
// non-zero cas (Kong, where cas 0 means "must be absent"), and the key is
// created with cas 0. Seeding only writes a full bucket and takes nothing,
// so losing any of these races costs a retry, never an over-admission.
//
// # Notes
//
// Stored tokens are floored to 6 decimals, so a refund restores a bucket to
// within 1e-6 tokens of its state, always downwards.
type Updater struct {
	// Store is the host's shared data.
	Store Store
	// MaxAttempts bounds the read-decide-write rounds of one TakeAll, and
	// each refund and seeding loop within it; DefaultMaxAttempts (64) when
	// <= 0.
	MaxAttempts int
	// MaxFuture is how far, in seconds, a stored last_refill may lie after
	// now before the value is treated as corrupt; DefaultMaxFuture (one day)
	// when not > 0. Smaller clock differences between workers are handled by
	// bucket.Limit.Refill.
	MaxFuture float64
	// Backoff, if set, is called after a CAS mismatch, before the next
	// attempt, with the number of attempts made so far. Without it
	// contenders retry in lockstep and a hot key shared by many workers
	// exhausts MaxAttempts far more often; see SpinBackoff.
	Backoff func(attempt int)

	buf  []byte    // encoding scratch
	pend []pending // per-request scratch
}

// pending is what one attempt read and decided for one request.
type pending struct {
	read    bucket.State // as read (full at now if missing or corrupt)
	next    bucket.State // after Take
	cas     uint32
	corrupt bool

	// For a slotted request: the slot key chosen, the owner to write, and
	// how the slot was obtained.
	key               string
	owner             string
	hasOwner          bool
	takeover, collide bool
}

// value appends the stored form of s for this pending write.
func (p *pending) value(dst []byte, s bucket.State) []byte {
	if p.hasOwner {
		return AppendSlotValue(dst, s, p.owner)
	}
	return AppendState(dst, s)
}

func (u *Updater) maxAttempts() int {
	if u.MaxAttempts > 0 {
		return u.MaxAttempts
	}
	return DefaultMaxAttempts
}

func (u *Updater) maxFuture() float64 {
	if u.MaxFuture > 0 {
		return u.MaxFuture
	}
	return DefaultMaxFuture
}

// TakeAll takes each request's cost from its bucket if every bucket has
// enough tokens, and from none otherwise; see Updater for the algorithm.
//
// now is in seconds since the Unix epoch. res is scratch for the results,
// returned as Outcome.Results: pass a slice of len(reqs) to avoid an
// allocation (a shorter one is replaced). Keys must be distinct. With no
// requests the outcome is allowed after 0 attempts.
func (u *Updater) TakeAll(reqs []Request, now float64, res []bucket.Result) Outcome {
	if binaryValues && len(reqs) == 1 && len(res) >= 1 {
		// One request, the common case: the general path below without
		// its loops over the requests (no duplicate to look for, nothing
		// to refund when the write fails: it is the first). Each step is
		// the general path's, with the same helpers, so the outcome, the
		// store's calls and the values written are the same
		// (TestTakeOneEquivalence). Native builds only (binaryValues): the
		// wasm guest has no room for a second copy of the loop.
		res = res[:1]
		out := Outcome{Rejected: -1, Results: res}
		r := &reqs[0]
		r.TookOver, r.Collided = false, false
		now = Quantize(now)
		if !(now > 0) || math.IsInf(now, 1) {
			out.Err = errBadNow
			return out
		}
		if cap(u.pend) < 1 {
			u.pend = make([]pending, 1)
		}
		pend := u.pend[:1]
		p := &pend[0]
		for out.Attempts < u.maxAttempts() {
			out.Attempts++
			var err error
			if r.Slotted {
				err = u.readSlot(r, now, &out, p)
			} else {
				*p = pending{key: r.Key}
				p.read, p.cas, p.corrupt, err = u.read(r, now, &out)
			}
			if err != nil {
				out.Err = err
				return out
			}
			p.next, res[0] = r.Limit.Take(p.read, now, r.Cost)
			if !res[0].Allowed {
				u.reject(reqs, pend, now, &out)
				out.Rejected = 0
				countSlots(reqs, pend, &out, false)
				return out
			}
			u.buf = appendStored(u.Store, u.buf[:0], p, p.next, now) // commit
			if err = u.Store.Set(p.key, u.buf, p.cas); err == nil {
				r.Stored = p.key
				out.Allowed = true
				countSlots(reqs, pend, &out, true)
				return out
			}
			if !errors.Is(err, ErrCASMismatch) {
				out.Err = err
				return out
			}
			out.CASRetries++
			if u.Backoff != nil {
				u.Backoff(out.Attempts)
			}
		}
		out.Err = ErrContention
		return out
	}
	out := Outcome{Rejected: -1}
	if len(res) < len(reqs) {
		res = make([]bucket.Result, len(reqs))
	}
	res = res[:len(reqs)]
	out.Results = res
	for i := range reqs {
		reqs[i].TookOver, reqs[i].Collided = false, false
	}
	now = Quantize(now)
	if !(now > 0) || math.IsInf(now, 1) {
		out.Err = errBadNow
		return out
	}
	for i := range reqs {
		for j := i + 1; j < len(reqs); j++ {
			if reqs[i].Key == reqs[j].Key {
				out.Err = errDuplicateKey
				return out
			}
		}
	}
	if len(reqs) == 0 {
		out.Allowed = true
		return out
	}
	if cap(u.pend) < len(reqs) {
		u.pend = make([]pending, len(reqs))
	}
	pend := u.pend[:len(reqs)]

	for out.Attempts < u.maxAttempts() {
		out.Attempts++
		rejected := -1
		for i := range reqs {
			p := &pend[i]
			var err error
			if reqs[i].Slotted {
				err = u.readSlot(&reqs[i], now, &out, p)
			} else {
				*p = pending{key: reqs[i].Key}
				p.read, p.cas, p.corrupt, err = u.read(&reqs[i], now, &out)
			}
			if err != nil {
				out.Err = err
				return out
			}
			p.next, res[i] = reqs[i].Limit.Take(p.read, now, reqs[i].Cost)
			if !res[i].Allowed && rejected < 0 {
				rejected = i
			}
		}
		if rejected >= 0 {
			u.reject(reqs, pend, now, &out)
			out.Rejected = rejected
			countSlots(reqs, pend, &out, false)
			return out
		}
		k, err := u.commit(reqs, pend, now)
		if err == nil {
			for i := range reqs {
				reqs[i].Stored = pend[i].key
			}
			out.Allowed = true
			countSlots(reqs, pend, &out, true)
			return out
		}
		if rerr := u.refund(reqs[:k], pend[:k], now, &out); rerr != nil {
			out.Err = rerr
			return out
		}
		if !errors.Is(err, ErrCASMismatch) {
			out.Err = err
			return out
		}
		out.CASRetries++
		if u.Backoff != nil {
			u.Backoff(out.Attempts)
		}
	}
	out.Err = ErrContention
	return out
}

// read returns the state stored for r, seeding a missing key, with the cas to
// write it back and whether the stored value was corrupt.
func (u *Updater) read(r *Request, now float64, out *Outcome) (bucket.State, uint32, bool, error) {
	for seeds := 0; ; seeds++ {
		v, cas, err := u.Store.Get(r.Key)
		if err == nil {
			s, perr := ParseState(v)
			if perr != nil || s.Last > now+u.maxFuture() {
				out.Corrupt++
				return r.Limit.Full(now), cas, true, nil
			}
			return s, cas, false, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return bucket.State{}, 0, false, err
		}
		if seeds == u.maxAttempts() { // the key keeps vanishing
			return bucket.State{}, 0, false, ErrContention
		}
		if err := u.seed(r, now, out); err != nil {
			return bucket.State{}, 0, false, err
		}
	}
}

// seed creates r's missing key holding a full bucket, without ever
// overwriting a value another worker wrote; see Updater. A nil error means
// the key now exists (or vanished again) and must be read.
func (u *Updater) seed(r *Request, now float64, out *Outcome) error {
	u.buf = AppendState(u.buf[:0], r.Limit.Full(now))
	n, err := create(u.Store, r.Key, u.buf)
	out.CASRetries += n
	return err
}

// countSlots records the slot events of the final attempt in reqs and out;
// takeovers count only when they were written.
func countSlots(reqs []Request, pend []pending, out *Outcome, written bool) {
	for i := range pend {
		reqs[i].TookOver = pend[i].takeover && written
		reqs[i].Collided = pend[i].collide
		if reqs[i].TookOver {
			out.Takeovers++
		}
		if reqs[i].Collided {
			out.Collisions++
		}
	}
}

// reject finishes a rejected attempt: it reports untouched token counts and
// repairs corrupt values.
func (u *Updater) reject(reqs []Request, pend []pending, now float64, out *Outcome) {
	for i := range reqs {
		p := &pend[i]
		refilled := reqs[i].Limit.Refill(p.read, now)
		out.Results[i].Tokens = refilled.Tokens
		out.Results[i].FullIn = reqs[i].Limit.FullAfter(refilled, now)
		// A corrupt value is repaired, and a bucket whose last refill lies
		// beyond the clock (stepped back by more than bucket.MaxClockSkew)
		// is stored re-anchored at now: otherwise an empty bucket would
		// stay empty until the clock caught up with the old time.
		if !p.corrupt && refilled.Last >= p.read.Last {
			continue
		}
		u.buf = p.value(u.buf[:0], refilled)
		// The decision stands whatever happens to the repair: on a mismatch
		// another worker has already replaced the value, and any other
		// failure leaves the corrupt value to be repaired next time.
		if err := u.Store.Set(p.key, u.buf, p.cas); errors.Is(err, ErrCASMismatch) {
			out.CASRetries++
		}
	}
}

// commit writes each pending state with its cas, in order, and returns how
// many were written before the first error.
func (u *Updater) commit(reqs []Request, pend []pending, now float64) (int, error) {
	for k := range reqs {
		if binaryValues {
			u.buf = appendStored(u.Store, u.buf[:0], &pend[k], pend[k].next, now)
		} else {
			u.buf = pend[k].value(u.buf[:0], pend[k].next)
		}
		if err := u.Store.Set(pend[k].key, u.buf, pend[k].cas); err != nil {
			return k, err
		}
	}
	return len(reqs), nil
}

// Refund gives back the cost of requests an earlier allowed TakeAll took
// (Request.Stored names each key), when the decision is undone later: a
// cluster-wide rule rejected the request after the local buckets admitted
// it. Each bucket has its own bounded get → refund → compare-and-swap loop;
// a bucket that was evicted or overwritten meanwhile is left alone. It
// returns the CAS mismatches seen.
func (u *Updater) Refund(reqs []Request, now float64) (int, error) {
	if len(reqs) == 0 {
		return 0, nil
	}
	if cap(u.pend) < len(reqs) {
		u.pend = make([]pending, len(reqs))
	}
	pend := u.pend[:len(reqs)]
	for i := range reqs {
		if reqs[i].Stored == "" {
			return 0, errors.New("sharedstate: Refund of a request TakeAll did not store")
		}
		pend[i] = pending{key: reqs[i].Stored}
	}
	var out Outcome
	err := u.refund(reqs, pend, Quantize(now), &out)
	return out.CASRetries, err
}

// refund gives back the cost of each request, already committed, each with
// its own bounded get → Refund → compare-and-swap loop. A slot keeps whatever
// owner it has by then.
func (u *Updater) refund(reqs []Request, pend []pending, now float64, out *Outcome) error {
	for i := range reqs {
		r, key := &reqs[i], pend[i].key
		for tries := 0; ; tries++ {
			if tries == u.maxAttempts() {
				return ErrContention
			}
			v, cas, err := u.Store.Get(key)
			if errors.Is(err, ErrNotFound) {
				break // evicted: it reads as a full bucket
			}
			if err != nil {
				return err
			}
			s, owner, hasOwner, perr := parseValue(v)
			if perr != nil || s.Last > now+u.maxFuture() {
				break // overwritten with garbage: it reads as a full bucket
			}
			p := pending{owner: string(owner), hasOwner: hasOwner}
			u.buf = p.value(u.buf[:0], r.Limit.Refund(s, now, r.Cost))
			err = u.Store.Set(key, u.buf, cas)
			if err == nil {
				break
			}
			if !errors.Is(err, ErrCASMismatch) {
				return err
			}
			out.CASRetries++
		}
	}
	return nil
}

// slotRead is one candidate slot as read.
type slotRead struct {
	key      string
	exists   bool
	corrupt  bool
	state    bucket.State
	cas      uint32
	owner    []byte // in the store's returned value: valid during TakeAll
	hasOwner bool
}

func (u *Updater) lookSlot(key string, now float64) (slotRead, error) {
	v, cas, err := u.Store.Get(key)
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return slotRead{key: key}, nil
		}
		return slotRead{}, err
	}
	s, owner, hasOwner, perr := parseValue(v)
	sr := slotRead{key: key, exists: true, state: s, cas: cas, owner: owner, hasOwner: hasOwner}
	sr.corrupt = perr != nil || s.Last > now+u.maxFuture()
	return sr, nil
}

// mine reports whether the slot holds r's identity's bucket.
func (s *slotRead) mine(r *Request) bool {
	return s.exists && !s.corrupt && s.hasOwner && string(s.owner) == r.Owner
}

// free reports whether r's identity may take the slot over: it is missing,
// corrupt, or its bucket would be full by now.
func (s *slotRead) free(r *Request, now float64) bool {
	return !s.exists || s.corrupt || r.Limit.Refill(s.state, now).Tokens >= r.Limit.Burst
}

// readSlot fills p with the slot a slotted request takes from; see
// "Bounded key space" in key.go. A missing slot it chooses is seeded with
// a full bucket owned by r.Owner, then both candidates are read again.
func (u *Updater) readSlot(r *Request, now float64, out *Outcome, p *pending) error {
	for seeds := 0; ; seeds++ {
		var a slotRead
		if binaryValues {
			// Native builds read the first candidate as lookSlot does,
			// inline: when it is r's own (the common case), p is filled
			// straight from the value read. (The wasm guest has no room.)
			v, cas, err := u.Store.Get(r.Key)
			switch {
			case err == nil:
				s, owner, hasOwner, perr, isBinary := parseBinary(v) // parseValue's first step
				if !isBinary {
					s, owner, hasOwner, perr = parseValue(v)
				}
				corrupt := perr != nil || s.Last > now+u.maxFuture()
				if !corrupt && hasOwner && string(owner) == r.Owner { // a.mine(r)
					// use(p, &a, r.Owner), field by field: p.next is
					// written by Take before any use.
					p.read, p.cas, p.key, p.owner = s, cas, r.Key, r.Owner
					p.hasOwner, p.corrupt, p.takeover, p.collide = true, false, false, false
					return nil
				}
				a = slotRead{key: r.Key, exists: true, corrupt: corrupt, state: s, cas: cas, owner: owner, hasOwner: hasOwner}
			case errors.Is(err, ErrNotFound):
				a = slotRead{key: r.Key}
			default:
				return err
			}
		} else {
			var err error
			if a, err = u.lookSlot(r.Key, now); err != nil {
				return err
			}
			if a.mine(r) {
				use(p, &a, r.Owner)
				return nil
			}
		}
		b := a
		if r.Alt != "" {
			var err error
			if b, err = u.lookSlot(r.Alt, now); err != nil {
				return err
			}
			if b.mine(r) {
				use(p, &b, r.Owner)
				return nil
			}
		}
		var pick *slotRead
		switch {
		case a.free(r, now):
			pick = &a
		case b.free(r, now):
			pick = &b
		}
		if pick == nil {
			// A live collision: evict the candidate with more tokens, whose
			// owner loses the least if it comes back to a full bucket.
			pick = &a
			if r.Limit.Refill(b.state, now).Tokens > r.Limit.Refill(a.state, now).Tokens {
				pick = &b
			}
			*p = pending{read: r.Limit.Full(now), cas: pick.cas, key: pick.key, owner: r.Owner, hasOwner: true, collide: true}
			return nil
		}
		if pick.exists {
			*p = pending{read: r.Limit.Full(now), cas: pick.cas, corrupt: pick.corrupt,
				key: pick.key, owner: r.Owner, hasOwner: true, takeover: true}
			if pick.corrupt {
				out.Corrupt++
			}
			return nil
		}
		if seeds == u.maxAttempts() {
			return ErrContention
		}
		u.buf = AppendSlotValue(u.buf[:0], r.Limit.Full(now), r.Owner)
		n, err := create(u.Store, pick.key, u.buf)
		out.CASRetries += n
		if err != nil {
			return err
		}
	}
}

// use fills p from a slot that is read as it is; owner is the slot's owner
// as a string (r.Owner when it is r's own slot, which costs no copy).
func use(p *pending, s *slotRead, owner string) {
	*p = pending{read: s.state, cas: s.cas, key: s.key, owner: owner, hasOwner: s.hasOwner}
}

// incomparable is a zero-width field that makes a struct not comparable
// (as net/http's): the compiler then generates no equality function for
// it, which the wasm module would carry (a few hundred bytes each, with its
// function table entries) though nothing compares the struct. Put it first:
// last, a zero-width field adds padding.
type incomparable [0]func()
