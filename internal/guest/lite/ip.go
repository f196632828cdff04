package lite

// CanonicalIP parses s exactly as net/netip.ParseAddr does and returns what
// ip.Unmap().WithZone("").String() would: dotted decimal for IPv4 and
// IPv4-mapped IPv6, RFC 5952 text (lower-case hex, the longest run of two
// or more zero groups as "::") for other IPv6 addresses, no zone.
//
// It exists to keep net/netip, and through it unique, weak and
// internal/sync, out of the wasm guest (about 60 KB of the module);
// ip_test.go checks it against net/netip. A valid IPv4 address is returned
// as the input string itself, without an allocation.
func CanonicalIP(s string) (string, bool) {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '.':
			var f [4]byte
			if !parseIPv4Fields(s, f[:]) {
				return "", false
			}
			return s, true // strictly valid dotted decimal prints as itself
		case ':':
			ip, ok := parseIPv6(s)
			if !ok {
				return "", false
			}
			var buf [48]byte
			return string(appendIP16(buf[:0], &ip)), true
		case '%':
			return "", false
		}
	}
	return "", false
}

// IPv4Host returns the address part of "a.b.c.d" or "a.b.c.d:port" when it
// is a dotted-quad IPv4 address exactly as net/netip prints it (fields 0 to
// 255 without leading zeros) and the port is digits, so that a caller can
// skip CanonicalIP's parse and reprint. ok is false for anything else. It
// does not allocate.
func IPv4Host(addr string) (string, bool) {
	// One pass, few branches a byte: the client address is parsed on every
	// request. start is where the current field begins, val its value.
	val, dots, start := uint(0), 0, 0
	for i := 0; i < len(addr); i++ {
		c := addr[i]
		if d := c - '0'; d <= 9 {
			if val == 0 && i != start {
				return "", false // a leading zero
			}
			if val = val*10 + uint(d); val > 255 {
				return "", false
			}
			continue
		}
		if i == start {
			return "", false // an empty field
		}
		if c == '.' && dots < 3 {
			dots++
			val, start = 0, i+1
			continue
		}
		if c != ':' || dots < 3 || i == len(addr)-1 {
			return "", false
		}
		for j := i + 1; j < len(addr); j++ {
			if addr[j]-'0' > 9 {
				return "", false
			}
		}
		return addr[:i], true
	}
	if dots < 3 || start == len(addr) {
		return "", false
	}
	return addr, true
}

// parseIPv4Fields parses "a.b.c.d" (fields 0 to 255, one to three digits,
// no leading zeros) into fields.
func parseIPv4Fields(s string, fields []byte) bool {
	val, pos, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case '0' <= c && c <= '9':
			if digits == 1 && val == 0 {
				return false
			}
			val = val*10 + int(c-'0')
			digits++
			if val > 255 {
				return false
			}
		case c == '.':
			if i == 0 || i == len(s)-1 || s[i-1] == '.' || pos == 3 {
				return false
			}
			fields[pos] = byte(val)
			pos++
			val, digits = 0, 0
		default:
			return false
		}
	}
	if pos < 3 {
		return false
	}
	fields[3] = byte(val)
	return true
}

// parseIPv6 parses an IPv6 address, with an optional non-empty zone after
// '%' (ignored) and an optional embedded IPv4 address in the last 32 bits.
func parseIPv6(in string) ([16]byte, bool) {
	var ip [16]byte
	s := in
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			if i == len(s)-1 {
				return ip, false // an empty zone
			}
			s = s[:i]
			break
		}
	}
	end := len(s) // of the address, in in
	ellipsis := -1
	if len(s) >= 2 && s[0] == ':' && s[1] == ':' {
		ellipsis = 0
		s = s[2:]
		if len(s) == 0 {
			return ip, true // "::"
		}
	}
	i := 0
	for i < 16 {
		off, acc := 0, uint32(0)
		for ; off < len(s); off++ {
			c := s[off]
			switch {
			case '0' <= c && c <= '9':
				acc = acc<<4 + uint32(c-'0')
			case 'a' <= c && c <= 'f':
				acc = acc<<4 + uint32(c-'a'+10)
			case 'A' <= c && c <= 'F':
				acc = acc<<4 + uint32(c-'A'+10)
			default:
				goto group
			}
			if off > 3 || acc > 0xffff {
				return ip, false
			}
		}
	group:
		if off == 0 {
			return ip, false
		}
		if off < len(s) && s[off] == '.' {
			if (ellipsis < 0 && i != 12) || i+4 > 16 {
				return ip, false
			}
			if !parseIPv4Fields(in[end-len(s):end], ip[i:i+4]) {
				return ip, false
			}
			s = ""
			i += 4
			break
		}
		ip[i], ip[i+1] = byte(acc>>8), byte(acc)
		i += 2
		s = s[off:]
		if len(s) == 0 {
			break
		}
		if s[0] != ':' || len(s) == 1 {
			return ip, false
		}
		s = s[1:]
		if s[0] == ':' {
			if ellipsis >= 0 {
				return ip, false
			}
			ellipsis = i
			s = s[1:]
			if len(s) == 0 {
				break
			}
		}
	}
	if len(s) != 0 {
		return ip, false
	}
	if i < 16 {
		if ellipsis < 0 {
			return ip, false
		}
		n := 16 - i
		for j := i - 1; j >= ellipsis; j-- {
			ip[j+n] = ip[j]
		}
		clear(ip[ellipsis : ellipsis+n])
	} else if ellipsis >= 0 {
		return ip, false // "::" must stand for at least one group
	}
	return ip, true
}

// appendIP16 appends ip as Unmap().String() prints it.
func appendIP16(dst []byte, ip *[16]byte) []byte {
	mapped := ip[10] == 0xff && ip[11] == 0xff
	for _, b := range ip[:10] {
		mapped = mapped && b == 0
	}
	if mapped {
		for i, b := range ip[12:] {
			if i > 0 {
				dst = append(dst, '.')
			}
			if b >= 100 {
				dst = append(dst, '0'+b/100)
			}
			if b >= 10 {
				dst = append(dst, '0'+b/10%10)
			}
			dst = append(dst, '0'+b%10)
		}
		return dst
	}
	group := func(i int) uint16 { return uint16(ip[2*i])<<8 | uint16(ip[2*i+1]) }
	zeroStart, zeroEnd := 255, 255
	for i := 0; i < 8; i++ {
		j := i
		for j < 8 && group(j) == 0 {
			j++
		}
		if l := j - i; l >= 2 && l > zeroEnd-zeroStart {
			zeroStart, zeroEnd = i, j
		}
	}
	const hex = "0123456789abcdef"
	for i := 0; i < 8; i++ {
		if i == zeroStart {
			dst = append(dst, ':', ':')
			i = zeroEnd
			if i >= 8 {
				break
			}
		} else if i > 0 {
			dst = append(dst, ':')
		}
		g := group(i)
		started := false
		for shift := 12; shift >= 0; shift -= 4 {
			d := g >> uint(shift) & 0xf
			if d != 0 || started || shift == 0 {
				dst = append(dst, hex[d])
				started = true
			}
		}
	}
	return dst
}

// IPv6Prefix returns the network of the IPv6 address s (as CanonicalIP
// accepts it) at prefix length bits, 0 to 128, as "2001:db8:1:2::/64":
// the address with every bit after the first bits cleared, in
// CanonicalIP's form, then "/" and bits. ok is false when s is not an IPv6
// address, has a zone, or is an IPv4-mapped one (which CanonicalIP prints
// as IPv4).
func IPv6Prefix(s string, bits int) (string, bool) {
	if bits < 0 || bits > 128 {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == '%' {
			return "", false // a zone
		}
	}
	ip, ok := parseIPv6(s)
	if !ok {
		return "", false
	}
	if isMapped(&ip) {
		return "", false
	}
	for i := range ip {
		switch keep := bits - 8*i; {
		case keep <= 0:
			ip[i] = 0
		case keep < 8:
			ip[i] &= 0xff << (8 - keep)
		}
	}
	var buf [52]byte
	b := appendIP16(buf[:0], &ip)
	b = append(b, '/')
	if bits >= 100 {
		b = append(b, '1')
	}
	if bits >= 10 {
		b = append(b, byte('0'+bits/10%10))
	}
	b = append(b, byte('0'+bits%10))
	return string(b), true
}

// isMapped reports whether ip is an IPv4-mapped IPv6 address.
func isMapped(ip *[16]byte) bool {
	for _, b := range ip[:10] {
		if b != 0 {
			return false
		}
	}
	return ip[10] == 0xff && ip[11] == 0xff
}
