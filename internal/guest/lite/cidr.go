package lite

// ParseIP parses s as CanonicalIP does and returns the address in 16 bytes:
// IPv4 (and IPv4-mapped IPv6) as ::ffff:a.b.c.d, so one comparison serves
// both families. The zone of a scoped IPv6 address is ignored.
func ParseIP(s string) ([16]byte, bool) {
	var ip [16]byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '.':
			ip[10], ip[11] = 0xff, 0xff
			return ip, parseIPv4Fields(s, ip[12:])
		case ':':
			return parseIPv6(s)
		case '%':
			return ip, false
		}
	}
	return ip, false
}

// CIDR is an address prefix over ParseIP's 16-byte form; an IPv4 prefix
// counts its bits from the 96 of the mapped form.
type CIDR struct {
	ip   [16]byte // host bits cleared
	bits int      // 0..128
}

// ParseCIDR parses "a.b.c.d/n" (n 0..32) or an IPv6 prefix "x::/n"
// (n 0..128), as net/netip.ParsePrefix accepts them, and clears the host
// bits as Prefix.Masked does. A bare address is not a prefix.
func ParseCIDR(s string) (CIDR, bool) {
	var c CIDR
	slash := -1
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			slash = i
			break
		}
	}
	if slash < 0 {
		return c, false
	}
	addr, n := s[:slash], s[slash+1:]
	for i := range addr {
		if addr[i] == '%' {
			return c, false // netip refuses zones in prefixes
		}
	}
	if len(n) == 0 || len(n) > 3 || (len(n) > 1 && n[0] == '0') {
		return c, false
	}
	bits := 0
	for i := 0; i < len(n); i++ {
		if n[i] < '0' || n[i] > '9' {
			return c, false
		}
		bits = bits*10 + int(n[i]-'0')
	}
	ip, ok := ParseIP(addr)
	if !ok {
		return c, false
	}
	v4 := false
	for i := 0; i < len(addr); i++ {
		if addr[i] == ':' {
			break
		}
		if addr[i] == '.' {
			v4 = true
			break
		}
	}
	if v4 {
		if bits > 32 {
			return c, false
		}
		bits += 96
	} else if bits > 128 {
		return c, false
	}
	c.bits = bits
	for i := range ip {
		switch keep := bits - 8*i; {
		case keep >= 8:
		case keep <= 0:
			ip[i] = 0
		default:
			ip[i] &= byte(0xff << (8 - keep))
		}
	}
	c.ip = ip
	return c, true
}

// Contains reports whether ip (ParseIP's form) lies in the prefix.
func (c CIDR) Contains(ip [16]byte) bool {
	for i := range ip {
		keep := c.bits - 8*i
		if keep <= 0 {
			return true
		}
		b := ip[i]
		if keep < 8 {
			b &= byte(0xff << (8 - keep))
		}
		if b != c.ip[i] {
			return false
		}
	}
	return true
}

// HostOfAddress returns the address part of an address that may carry a
// port: "a.b.c.d:port", "[v6]:port" and "[v6]" give the address; a bare
// IPv6 address ("2001:db8::1") or IPv4 address is returned unchanged. It
// does not validate the address; the port must be digits.
func HostOfAddress(s string) string {
	if len(s) > 0 && s[0] == '[' {
		end := -1
		for i := 1; i < len(s); i++ {
			if s[i] == ']' {
				end = i
				break
			}
		}
		if end < 0 {
			return s
		}
		rest := s[end+1:]
		if rest == "" || rest[0] == ':' && allDigits(rest[1:]) {
			return s[1:end]
		}
		return s
	}
	colon := -1
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			if colon >= 0 {
				return s // two colons: IPv6 without brackets
			}
			colon = i
		}
	}
	if colon >= 0 && allDigits(s[colon+1:]) {
		return s[:colon]
	}
	return s
}

func allDigits(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
