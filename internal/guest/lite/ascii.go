package lite

import "strings"

// ASCII case mapping for the names the guest compares: HTTP header names,
// methods, host names, content codings and types, the "Bearer" scheme,
// status classes. HTTP defines all of them as case-insensitive in ASCII
// only (RFC 9110 section 5.1, RFC 4343 for host names), so these leave
// every byte outside A-Z and a-z as it is.
//
// strings.ToLower, ToUpper and EqualFold do the same for ASCII text, but
// they also map and fold Unicode letters, which links the unicode
// package's case tables into the wasm guest; ascii_test.go checks these
// against them. On text that is not ASCII they differ, on purpose: the
// Kelvin sign is not a "k" here, nor "ſ" an "s", so "ſet" does not name a
// SET method and a host name spelled in Unicode matches itself in the same
// case only (host names arrive as A-labels, "xn--…").

// ToLowerASCII returns s with A-Z mapped to a-z; s itself, without an
// allocation, when it has no upper-case ASCII letter.
func ToLowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// ToUpperASCII returns s with a-z mapped to A-Z; s itself, without an
// allocation, when it has no lower-case ASCII letter.
func ToUpperASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'a' <= s[i] && s[i] <= 'z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'a' <= b[j] && b[j] <= 'z' {
					b[j] -= 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// EqualFoldASCII reports whether a and b are equal when A-Z and a-z are
// taken as the same letters; every other byte must be equal.
func EqualFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// ReplaceByte returns s with every byte old replaced by new, as
// strings.ReplaceAll(s, string(old), string(new)) does for ASCII old and
// new; s itself when it holds no old. (strings.Replace's general search
// is several kilobytes of the module; the guest only swaps characters.)
func ReplaceByte(s string, old, new byte) string {
	i := strings.IndexByte(s, old)
	if i < 0 {
		return s
	}
	b := []byte(s)
	for ; i < len(b); i++ {
		if b[i] == old {
			b[i] = new
		}
	}
	return string(b)
}
