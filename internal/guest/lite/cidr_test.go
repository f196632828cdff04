package lite

import (
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
)

// ParseIP must accept what netip.ParseAddr accepts (zones aside) and give
// the same 16 bytes as Addr.As16.
func TestParseIPMatchesNetip(t *testing.T) {
	for _, in := range []string{"1.2.3.4", "::1", "::ffff:1.2.3.4", "2001:db8::1", "fe80::1%eth0", "1.2.3", "", "x", "01.2.3.4", "[::1]"} {
		got, ok := ParseIP(in)
		a, err := netip.ParseAddr(in)
		if ok != (err == nil) || ok && got != a.As16() {
			t.Errorf("ParseIP(%q) = %v %v, netip %v %v", in, got, ok, a, err)
		}
	}
}

// ParseCIDR and Contains must agree with netip.ParsePrefix, Masked and
// Contains (over the unmapped address) on random prefixes and addresses.
func TestCIDRMatchesNetip(t *testing.T) {
	inputs := []string{"10.0.0.0/8", "10.1.2.3/8", "0.0.0.0/0", "::/0", "1.2.3.4/32", "1.2.3.4/33", "2001:db8::/32",
		"2001:db8::/129", "1.2.3.4", "1.2.3.4/", "1.2.3.4/08", "1.2.3.4/-1", "fe80::%eth0/64", "::ffff:10.0.0.0/104", "/8", "a/8"}
	r := rand.New(rand.NewPCG(7, 8))
	for range 20000 {
		var a [16]byte
		for i := range a {
			a[i] = byte(r.IntN(256))
		}
		if r.IntN(2) == 0 {
			v4 := netip.AddrFrom4([4]byte{a[0], a[1], a[2], a[3]})
			inputs = append(inputs, v4.String()+"/"+strconv.Itoa(r.IntN(34)))
		} else {
			inputs = append(inputs, netip.AddrFrom16(a).String()+"/"+strconv.Itoa(r.IntN(130)))
		}
	}
	var addrs []netip.Addr
	for range 200 {
		var a [16]byte
		for i := range a {
			a[i] = byte(r.IntN(4)) // small values so prefixes match sometimes
		}
		addrs = append(addrs, netip.AddrFrom16(a), netip.AddrFrom4([4]byte{a[0], a[1], a[2], a[3]}), netip.MustParseAddr("10.1.2.3"))
	}
	for _, in := range inputs {
		c, ok := ParseCIDR(in)
		p, err := netip.ParsePrefix(in)
		if ok != (err == nil) {
			t.Fatalf("ParseCIDR(%q) ok=%v, netip err=%v", in, ok, err)
		}
		if !ok {
			continue
		}
		p = p.Masked()
		for _, a := range addrs {
			// Compare in netip's terms: an IPv4 prefix holds IPv4
			// addresses; an IPv6 prefix holds IPv6 addresses, mapped ones
			// included by their 16 bytes.
			want := p.Contains(a)
			if p.Addr().Is4() && a.Is4In6() {
				want = p.Contains(a.Unmap())
			}
			if p.Addr().Is6() && a.Is4() {
				want = p.Contains(netip.AddrFrom16(a.As16()))
			}
			if got := c.Contains(a.As16()); got != want {
				t.Fatalf("%q contains %v: got %v, want %v", in, a, got, want)
			}
		}
	}
}

func TestHostOfAddress(t *testing.T) {
	for in, want := range map[string]string{
		"4.4.4.4": "4.4.4.4", "4.4.4.4:1234": "4.4.4.4", "[2001:db8::1]:80": "2001:db8::1", "[2001:db8::1]": "2001:db8::1",
		"2001:db8::1": "2001:db8::1", "::1": "::1", "4.4.4.4:": "4.4.4.4:", "4.4.4.4:x": "4.4.4.4:x", "[::1]x": "[::1]x",
		"[::1": "[::1", "4.4.4.4:123456": "4.4.4.4:123456", "unknown": "unknown",
	} {
		if got := HostOfAddress(in); got != want {
			t.Errorf("HostOfAddress(%q) = %q, want %q", in, got, want)
		}
	}
}
