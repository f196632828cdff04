package sharedstate

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
	n := 0 // encoded length
	for i := 0; i < len(v) && n <= MaxValueLen; i++ {
		if safeByte(v[i]) {
			n++
		} else {
			n += 3
		}
	}
	switch {
	case n == len(v) && n <= MaxValueLen:
		return append(dst, v...)
	case n <= MaxValueLen:
		const upperHex = "0123456789ABCDEF"
		for i := 0; i < len(v); i++ {
			if c := v[i]; safeByte(c) {
				dst = append(dst, c)
			} else {
				dst = append(dst, '%', upperHex[c>>4], upperHex[c&0xf])
			}
		}
		return dst
	}
	sum := sha256String(v) // see sha256.go
	// Hex by hand: encoding/hex would link fmt into the guest.
	const lowerHex = "0123456789abcdef"
	dst = append(dst, '#')
	for _, c := range sum[:16] {
		dst = append(dst, lowerHex[c>>4], lowerHex[c&0xf])
	}
	return dst
}

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
