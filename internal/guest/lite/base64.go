package lite

// DecodeBase64 decodes s exactly as encoding/base64's DecodeString does
// (not Strict) with the standard alphabet, or the URL-safe one when url is
// set, and '=' padding when padded is set (NoPadding otherwise). Like the
// library it skips '\r' and '\n' anywhere, accepts non-zero bits below the
// last byte, and with padding requires every final quantum to be padded
// and nothing but line breaks after the padding. ok reports whether the
// library would have returned no error.
//
// It exists to keep encoding/base64 (its four encodings, built at start,
// and their decoders) out of the wasm guest, which needs one decoder for a
// JWT's payload and one for a bytes field of the JSON rate-limit answer;
// base64_test.go checks it against the library.
func DecodeBase64(s string, url, padded bool) (out []byte, ok bool) {
	out = make([]byte, 0, len(s)/4*3+2)
	var acc uint32 // the sextets of the quantum so far
	j := 0         // how many
	for i := 0; i < len(s); i++ {
		c := s[i]
		if v := sextet(c, url); v >= 0 {
			acc = acc<<6 | uint32(v)
			if j++; j == 4 {
				out = append(out, byte(acc>>16), byte(acc>>8), byte(acc))
				acc, j = 0, 0
			}
			continue
		}
		if c == '\n' || c == '\r' {
			continue
		}
		if c != '=' || !padded || j < 2 {
			return nil, false
		}
		// Padding: "==" after two sextets, "=" after three, then only line
		// breaks.
		k := i + 1
		if j == 2 {
			k = skipLineBreaks(s, k)
			if k == len(s) || s[k] != '=' {
				return nil, false
			}
			k++
		}
		if skipLineBreaks(s, k) != len(s) {
			return nil, false
		}
		padded = false // the quantum is complete: nothing more is owed
		break
	}
	switch {
	case j == 0:
		return out, true
	case j == 1 || padded:
		return nil, false
	case j == 2:
		return append(out, byte(acc>>4)), true
	default: // 3
		return append(out, byte(acc>>10), byte(acc>>2)), true
	}
}

func skipLineBreaks(s string, i int) int {
	for i < len(s) && (s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// sextet returns the value of c in the standard or URL-safe alphabet, or -1.
func sextet(c byte, url bool) int {
	switch {
	case 'A' <= c && c <= 'Z':
		return int(c - 'A')
	case 'a' <= c && c <= 'z':
		return int(c-'a') + 26
	case '0' <= c && c <= '9':
		return int(c-'0') + 52
	case c == '+' && !url, c == '-' && url:
		return 62
	case c == '/' && !url, c == '_' && url:
		return 63
	}
	return -1
}
