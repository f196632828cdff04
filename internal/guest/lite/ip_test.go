package lite

import (
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// CanonicalIP must agree with net/netip on every input, valid or not.
func TestCanonicalIPMatchesNetip(t *testing.T) {
	inputs := []string{
		"", ".", ":", "::", ":::", "::1", "1::", "1::2:3", "::ffff:1.2.3.4", "::ffff:01.2.3.4", "::1.2.3.4",
		"0.0.0.0", "255.255.255.255", "256.1.1.1", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1..2.3", "1.2.3.4.",
		"2001:db8::1", "2001:DB8:0:0:0:0:0:1", "2001:db8:0:0:1:0:0:1", "fe80::1%eth0", "fe80::1%", "%eth0",
		"1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "1:2:3:4:5:6:1.2.3.4",
		"1:2:3:4:5:1.2.3.4", "12345::1", "1:2:3:4:5:6:7:", ":1:2:3:4:5:6:7", "::ffff:a.b.c.d", "0:0:0:0:0:ffff:102:304",
		"::ffff:0:0", "64:ff9b::1.2.3.4", "1.2.3.4%eth0", "[::1]", "::1%z", "1:0:0:1:0:0:0:1", "0::0", "x",
	}
	r := rand.New(rand.NewPCG(5, 6))
	alphabet := "0123456789abcdefABCDEF:.%"
	for range 100000 {
		var b strings.Builder
		for range r.IntN(24) {
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		inputs = append(inputs, b.String())
		var a [16]byte
		for i := range a {
			if r.IntN(3) > 0 {
				a[i] = byte(r.IntN(256))
			}
		}
		inputs = append(inputs, netip.AddrFrom16(a).String(), netip.AddrFrom16(a).StringExpanded())
	}
	for _, in := range inputs {
		got, gotOK := CanonicalIP(in)
		ip, err := netip.ParseAddr(in)
		want, wantOK := "", err == nil
		if wantOK {
			want = ip.Unmap().WithZone("").String()
		}
		if got != want || gotOK != wantOK {
			t.Fatalf("CanonicalIP(%q): got %q %v, want %q %v", in, got, gotOK, want, wantOK)
		}
	}
}

// TestIPv4HostMatchesNetip: IPv4Host accepts exactly the dotted quads that
// net/netip prints as themselves, with or without a numeric port.
func TestIPv4HostMatchesNetip(t *testing.T) {
	inputs := []string{"1.2.3.4", "1.2.3.4:80", "1.2.3.4:", "1.2.3.4:x", "01.2.3.4", "256.1.1.1", "1.2.3", "1.2.3.4.5",
		"::1", "[::1]:80", "", ":80", "1.2.3.4:80:90", "0.0.0.0:0", "255.255.255.255:65535",
		"1.2.3.04", "1.2.3.0:1", "1.2.3.4567", "1.2.3.4.", ".1.2.3.4", "1..2.3", "1.2.3.4:8a", "1.2.3.256:80", "10.0.0.1:4000"}
	r := rand.New(rand.NewPCG(3, 4))
	for range 100000 {
		n := r.IntN(24)
		b := make([]byte, n)
		for i := range b {
			b[i] = "0123456789.:a"[r.IntN(13)]
		}
		inputs = append(inputs, string(b))
	}
	// Near misses of a dotted quad with a port, which random bytes
	// seldom make.
	fields := []string{"0", "1", "9", "10", "25", "99", "100", "199", "249", "250", "255", "256", "260", "300", "999",
		"01", "00", "001", "010", "1000", "2550", "", "a", "1a"}
	ports := []string{"", ":", ":0", ":80", ":65535", ":x", ":8x", "::", ":1:2", "."}
	for range 200000 {
		var b strings.Builder
		for f := range 3 + r.IntN(3) {
			if f > 0 {
				b.WriteByte('.')
			}
			b.WriteString(fields[r.IntN(len(fields))])
		}
		b.WriteString(ports[r.IntN(len(ports))])
		inputs = append(inputs, b.String())
	}
	for _, in := range inputs {
		got, ok := IPv4Host(in)
		host, port := in, ""
		if i := strings.LastIndexByte(in, ':'); i >= 0 {
			host, port = in[:i], in[i+1:]
		}
		a, err := netip.ParseAddr(host)
		portOK := port == "" && !strings.Contains(in, ":") || port != "" && strings.Trim(port, "0123456789") == ""
		want := err == nil && a.Is4() && a.String() == host && portOK
		if ok != want || ok && got != host {
			t.Fatalf("IPv4Host(%q) = %q, %v; want %v", in, got, ok, want)
		}
	}
}

// BenchmarkIPv4Host is the client address of every request under Envoy.
func BenchmarkIPv4Host(b *testing.B) {
	for b.Loop() {
		if _, ok := IPv4Host("192.168.100.200:54321"); !ok {
			b.Fatal("not accepted")
		}
	}
}

// TestIPv6PrefixMatchesNetip: IPv6Prefix prints what netip's masked prefix
// prints, and refuses IPv4 and IPv4-mapped addresses.
func TestIPv6PrefixMatchesNetip(t *testing.T) {
	inputs := []string{"2001:db8::1", "2001:db8:1:2:3:4:5:6", "::", "::1", "fe80::1", "::ffff:1.2.3.4", "1.2.3.4",
		"2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "", "x", "2001:db8::1%eth0"}
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		var b [16]byte
		for i := range b {
			b[i] = byte(r.UintN(256))
		}
		inputs = append(inputs, netip.AddrFrom16(b).String())
	}
	for i, in := range inputs {
		for _, bits := range []int{0, 1, 7, 8, 48, 56, 63, 64, 65, 96, 127, 128, i % 129} {
			got, ok := IPv6Prefix(in, bits)
			a, err := netip.ParseAddr(in)
			wantOK := err == nil && a.Is6() && !a.Is4In6() && a.Zone() == ""
			want := ""
			if wantOK {
				want = netip.PrefixFrom(a, bits).Masked().String()
			}
			if ok != wantOK || got != want {
				t.Fatalf("IPv6Prefix(%q, %d) = %q, %v; want %q, %v", in, bits, got, ok, want, wantOK)
			}
		}
	}
}
