package sharedstate

import "github.com/tokengate/tokengate/internal/guest/lite"

// MaxValueLen is the most bytes one descriptor value takes in a key. Longer
// values, once percent-encoded, are replaced by a hash; see AppendKey.
const MaxValueLen = 64

// Key prefixes; see AppendKey.
const (
	keyPrefix       = "tb:"
	shadowKeyPrefix = "shadow:tb:"
)

// AppendKey appends the shared-data key "tb:{rule}:{composite}" (or
// "shadow:tb:{rule}:{composite}" when shadow) to dst and returns the extended
// slice.
//
// The composite is the descriptor values joined by '|'. Each value is
// written:
//   - literally, if it is at most MaxValueLen bytes and every byte is safe:
//     an ASCII letter or digit or one of -._~:@/+=,;!*'() (':' is safe, so
//     IPv6 addresses stay readable);
//   - otherwise percent-encoded: every unsafe byte ('|', '%', '#', space,
//     control bytes, non-ASCII, ...) becomes %XX with upper-case hex, if the
//     result is at most MaxValueLen bytes;
//   - otherwise as '#' followed by the first 16 bytes of the SHA-256 of the
//     raw value, in 32 lower-case hex digits.
//
// The three forms cannot be confused: a literal value has no '%' or '#', an
// encoded one has a '%' and no '#', and only a hash starts with '#'; no form
// contains '|'. So the key is unambiguous: two different value lists give
// two different composites, except for a SHA-256 collision in 128 bits. An
// empty value is written as nothing, so ["a", ""] gives "a|" and ["a"] gives
// "a"; the only lists that share a composite are [] and [""], which cannot
// meet because a rule always has the same, non-zero number of keys.
//
// The rule name is written literally; the caller must make sure it contains
// no ':' (configuration validates rule names), or "tb:a:b:c" could be rule
// "a" or rule "a:b".
//
// The key is at most len(prefix) + len(rule) + n*(MaxValueLen+1) bytes for n >= 1 values. AppendKey
// does not allocate when dst has that much room, and every byte it writes
// for the values is printable ASCII.
//
// Example:
//
//	AppendKey(nil, false, "per-ip", []string{"2001:db8::1", "GET /a|b"})
//	// tb:per-ip:2001:db8::1|GET%20/a%7Cb
func AppendKey(dst []byte, shadow bool, rule string, values []string) []byte {
	if shadow {
		dst = append(dst, shadowKeyPrefix...)
	} else {
		dst = append(dst, keyPrefix...)
	}
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

// appendValue appends one value in the form AppendKey describes.
func appendValue(dst []byte, v string) []byte {
	// The common case first: a short value of safe bytes.
	if len(v) <= MaxValueLen {
		i := 0
		for i < len(v) && safeBytes[v[i]] {
			i++
		}
		if i == len(v) {
			return append(dst, v...)
		}
	}
	n := 0 // encoded length
	for i := 0; i < len(v) && n <= MaxValueLen; i++ {
		if safeBytes[v[i]] {
			n++
		} else {
			n += 3
		}
	}
	if n <= MaxValueLen {
		const upperHex = "0123456789ABCDEF"
		for i := 0; i < len(v); i++ {
			if c := v[i]; safeBytes[c] {
				dst = append(dst, c)
			} else {
				dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xf])
			}
		}
		return dst
	}
	sum := lite.SHA256String(v) // see internal/guest/lite
	// Hex by hand: encoding/hex would link fmt into the guest.
	const lowerHex = "0123456789abcdef"
	dst = append(dst, '#')
	for _, c := range sum[:16] {
		dst = append(dst, lowerHex[c>>4], lowerHex[c&0xf])
	}
	return dst
}

// safeBytes[c] reports whether c is written literally in a key value: a
// table, since a switch costs several branches a byte inside the wasm guest.
var safeBytes = func() (t [256]bool) {
	for c := range 256 {
		t[c] = safeByte(byte(c))
	}
	return t
}()

// safeByte reports whether c is written literally in a key value.
func safeByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '.', '_', '~', ':', '@', '/', '+', '=', ',', ';', '!', '*', '\'', '(', ')':
		return true
	}
	return false
}

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
//     live collision): X evicts the one with more tokens after refill and
//     starts there from a full bucket, and the collision is counted.
//
// So an identity X has never used always gets a bucket of its own, full,
// however many identities are sprayed and however slow the rule: nobody can
// lock newcomers out. The price is in step 3: the evicted owner, if it comes
// back, starts full too, so it is forgiven what it had spent (burst minus
// its tokens). Evicting the fuller candidate keeps that small: a client
// spending at its limit holds less than one token, so it loses its slot
// only to a newcomer whose other candidate is even emptier, which a spray
// of one request per key (each leaving burst-1 tokens) never provides when
// burst >= 2. RATIONALE.md ("Memory") bounds what an attacker who drains
// its sprayed keys gains.
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
	return appendUint32(dst, slot)
}

// appendUint32 is strconv.AppendUint for a uint32, with 32-bit divisions
// (see appendMicro).
func appendUint32(dst []byte, u uint32) []byte {
	var buf [10]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			break
		}
	}
	return append(dst, buf[i:]...)
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

// AppendOwnerSlots appends the composite key of values to dst, as
// AppendComposite does, and returns the extended slice and the candidate
// slots of that owner, as SlotPairBytes does: for a single short value of
// safe bytes, the common case of a slotted rule, in one pass over its
// bytes. n must be > 0.
func AppendOwnerSlots(dst []byte, seed uint64, values []string, n uint32) ([]byte, uint32, uint32) {
	if len(values) == 1 && len(values[0]) <= MaxValueLen {
		v := values[0]
		h := seed ^ 0x9e3779b97f4a7c15
		i := 0
		for ; i < len(v) && safeBytes[v[i]]; i++ {
			h ^= uint64(v[i])
			h *= 0x100000001b3
		}
		if i == len(v) { // written literally: the owner is v
			a, b := slotsOf(h, n)
			return append(dst, v...), a, b
		}
	}
	start := len(dst)
	dst = AppendComposite(dst, values)
	a, b := slotPair(seed, dst[start:], n)
	return dst, a, b
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
	return slotsOf(h, n)
}

// slotsOf returns the two candidate slots, in [0, n), of an owner whose
// hash is h.
func slotsOf(h uint64, n uint32) (uint32, uint32) {
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
