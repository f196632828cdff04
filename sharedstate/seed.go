package sharedstate

import (
	"errors"
	"strconv"
)

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
// digits (zero-padded), created by the first worker that starts.
const SeedKey = "tokengate:seed"

// LoadSeed returns the plugin-wide slot seed, creating it from random if it
// is missing, so that every worker maps an identity to the same slots.
func LoadSeed(st Store, random uint64) (uint64, error) {
	v, err := LoadOrCreate(st, SeedKey, appendSeed(nil, random))
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
	_ incomparable
	// Interval is the time between reads, in seconds; 1 when not > 0.
	Interval float64

	seed  uint64
	known bool
	next  float64 // the time of the next read
}

// Current returns the seed to use at now and true when no read is due, the
// case of nearly every call; otherwise call Seed. It is Seed's first test,
// small enough to be inlined: in the wasm guest a call is not free.
func (k *SeedKeeper) Current(now float64) (uint64, bool) {
	interval := k.Interval
	if !(interval > 0) {
		interval = 1
	}
	return k.seed, k.known && now < k.next && now >= k.next-interval
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
	// Between reads use the seed we know; a clock stepped back is a reason
	// to read now rather than never. Until a read has succeeded, read every
	// time: a worker must not keep a seed the others do not use.
	if seed, ok := k.Current(now); ok {
		return seed, nil
	}
	interval := k.Interval
	if !(interval > 0) {
		interval = 1
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

// appendSeed appends seed as 16 hex digits, zero-padded.
func appendSeed(dst []byte, seed uint64) []byte {
	const hex = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hex[seed>>uint(shift)&0xf])
	}
	return dst
}
