package sharedstate

import (
	"errors"
	"strconv"

	"github.com/tokengate/tokengate/bucket"
)

// Bounded key space
//
// Envoy's shared data never shrinks: the ABI has no delete, and a key lives
// until the last VM of its vm_id goes away. One key per client IP or API key
// would let anyone who sprays identities grow the proxy's memory without
// bound. So a rule with a key bound n stores its buckets in n slots,
//
//	tb:{rule}:${slot}  →  "{tokens}:{last_refill}:{owner}"
//
// where owner is the identity's composite key (see AppendComposite), so the
// value stays readable. Each identity has two candidate slots, chosen by a
// hash keyed with a secret seed (SlotPair), which clients cannot predict and
// so cannot aim at another client's slots. A request for identity X:
//
//  1. uses the candidate X owns, if any (the first candidate is read first;
//     the second only if the first is not X's);
//  2. otherwise takes over a candidate that is missing, corrupt, or whose
//     bucket would be full by now: a full bucket carries no information, so
//     X starts from a full bucket exactly as a new identity would;
//  3. otherwise both candidates hold live buckets of other identities (a
//     live collision): X shares the one with more tokens, charged as its
//     owner's bucket, and the collision is counted. Sharing can only make
//     limits stricter, never looser.
//
// A slot value without an owner (the unbounded format) is treated as another
// identity's. Taking over goes through the same compare-and-swap as every
// write, so two workers racing for a slot cannot both win.

// AppendSlotKey appends "tb:{rule}:${slot}" (with the "shadow:" prefix when
// shadow) to dst. '$' never starts a composite key's value (AppendKey
// percent-encodes it), so slot keys cannot be mistaken for unbounded keys.
func AppendSlotKey(dst []byte, shadow bool, rule string, slot uint32) []byte {
	if shadow {
		dst = append(dst, shadowKeyPrefix...)
	} else {
		dst = append(dst, keyPrefix...)
	}
	dst = append(dst, rule...)
	dst = append(dst, ':', '$')
	return strconv.AppendUint(dst, uint64(slot), 10)
}

// AppendComposite appends the composite key of values (the part of
// AppendKey's key after "tb:{rule}:") to dst.
func AppendComposite(dst []byte, values []string) []byte {
	for i, v := range values {
		if i > 0 {
			dst = append(dst, '|')
		}
		dst = appendValue(dst, v)
	}
	return dst
}

// SlotPair returns the two candidate slots, in [0, n), of the identity whose
// composite key is owner, under a secret seed shared by every worker. For
// n > 1 the two differ. n must be > 0.
func SlotPair(seed uint64, owner string, n uint32) (uint32, uint32) {
	return slotPair(seed, owner, n)
}

// SlotPairBytes is SlotPair for an owner held in a byte slice, such as one
// AppendComposite just wrote.
func SlotPairBytes(seed uint64, owner []byte, n uint32) (uint32, uint32) {
	return slotPair(seed, owner, n)
}

func slotPair[T string | []byte](seed uint64, owner T, n uint32) (uint32, uint32) {
	h := seed ^ 0x9e3779b97f4a7c15
	for i := 0; i < len(owner); i++ {
		h ^= uint64(owner[i])
		h *= 0x100000001b3
	}
	a := uint32(mix64(h) % uint64(n))
	if n == 1 {
		return a, a
	}
	// The second slot is one of the other n-1, so it never equals a.
	b := uint32(mix64(h^0xd6e8feb86659fd93) % uint64(n-1))
	if b >= a {
		b++
	}
	return a, b
}

// mix64 is the splitmix64 finalizer: every input bit affects every output
// bit.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
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
	state, o, hasOwner := splitSlotValue(b)
	s, err = ParseState(state)
	return s, string(o), hasOwner, err
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

// LoadOrCreate returns the value stored under key, first creating it with
// value if it is missing. Creation never overwrites a value another worker
// wrote (see Updater's seeding), so every worker ends up with the same
// value. Use it for plugin-wide constants such as the slot seed.
func LoadOrCreate(st Store, key string, value []byte) ([]byte, error) {
	for tries := 0; tries < 4; tries++ {
		v, _, err := st.Get(key)
		if err == nil {
			return append([]byte(nil), v...), nil // v may be the host's scratch memory
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		if _, err := create(st, key, value); err != nil {
			return nil, err
		}
	}
	return nil, ErrContention
}

// create writes value under a key that was missing, unless another worker
// created it first, and returns the CAS mismatches it saw; a nil error means
// the key exists (or vanished again) and must be read. See Updater's
// seeding for why the first try uses SeedCAS.
func create(st Store, key string, value []byte) (mismatches int, err error) {
	err = st.Set(key, value, SeedCAS)
	if !errors.Is(err, ErrCASMismatch) {
		return 0, err // nil: created
	}
	if _, _, err = st.Get(key); !errors.Is(err, ErrNotFound) {
		return 1, err // nil: another worker created it
	}
	// Still missing: a host where a non-zero cas never creates a key, and
	// cas 0 means "create if absent".
	if err = st.Set(key, value, 0); errors.Is(err, ErrCASMismatch) {
		return 2, nil // another worker created it
	}
	return 1, err
}

// SeedKey is the shared-data key holding the secret slot seed, 16 hex
// digits, created by the first worker that starts.
const SeedKey = "tokengate:seed"

// LoadSeed returns the plugin-wide slot seed, creating it from random if it
// is missing, so that every worker maps an identity to the same slots.
func LoadSeed(st Store, random uint64) (uint64, error) {
	v, err := LoadOrCreate(st, SeedKey, strconv.AppendUint(nil, random, 16))
	if err != nil {
		return 0, err
	}
	seed, err := strconv.ParseUint(string(v), 16, 64)
	if err != nil {
		return 0, errors.New("sharedstate: the seed under " + SeedKey + " is not hex: " + strconv.Quote(string(v)))
	}
	return seed, nil
}

// SeedKeeper keeps one worker's copy of the slot seed in step with the one
// in shared data. Every worker must use the same seed, or an identity's
// buckets differ from worker to worker. Reading the seed once is not enough:
// a read can fail while other workers' succeed, and on Kong the zone can
// evict the seed key, after which a worker configured later would create a
// new one. So the seed is read again every Interval seconds; a stored seed
// that differs from ours is adopted, and a vanished one is re-created with
// the seed we already use, never a new random one.
//
// The zero value is ready to use. Like Updater, a SeedKeeper is used by one
// goroutine at a time.
type SeedKeeper struct {
	// Interval is the time between reads, in seconds; 1 when not > 0.
	Interval float64

	seed  uint64
	known bool
	next  float64 // the time of the next read
}

// Seed returns the seed to use at now (seconds). random is called for a
// seed only if none exists anywhere yet. When the store fails, Seed returns
// the seed it had (0 if it never had one) with the error.
//
// # Notes
//
// A worker that has never read the seed reads it on every call until a read
// succeeds. After the seed key vanishes (eviction on Kong), a worker
// configured before any other worker re-creates it makes a new seed; the
// others adopt it at their next read, so for up to Interval an identity can
// have one bucket per seed in use.
func (k *SeedKeeper) Seed(st Store, now float64, random func() uint64) (uint64, error) {
	interval := k.Interval
	if !(interval > 0) {
		interval = 1
	}
	// Between reads use the seed we know; a clock stepped back is a reason
	// to read now rather than never. Until a read has succeeded, read every
	// time: a worker must not keep a seed the others do not use.
	if k.known && now < k.next && now >= k.next-interval {
		return k.seed, nil
	}
	k.next = now + interval
	candidate := k.seed
	if !k.known {
		candidate = random()
	}
	seed, err := LoadSeed(st, candidate)
	if err != nil {
		return k.seed, err
	}
	k.seed, k.known = seed, true
	return seed, nil
}
