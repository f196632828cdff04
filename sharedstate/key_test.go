package sharedstate

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// hashed is the form AppendKey gives a value too long to keep.
func hashed(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "#" + hex.EncodeToString(sum[:16])
}

func TestAppendKey(t *testing.T) {
	safe64 := strings.Repeat("a", 64)
	tests := []struct {
		name     string
		shadow   bool
		rule     string
		input    []string
		expected string
	}{
		{"design note example", false, "per-org-rps", []string{"org-abc"}, "tb:per-org-rps:org-abc"},
		{"shadow", true, "per-org-rps", []string{"org-abc"}, "shadow:tb:per-org-rps:org-abc"},
		{"ipv4", false, "global-rps", []string{"10.0.0.1"}, "tb:global-rps:10.0.0.1"},
		{"ipv6 stays readable", false, "r", []string{"2001:db8::1"}, "tb:r:2001:db8::1"},
		{"two values", false, "r", []string{"org-abc", "/v1/chat"}, "tb:r:org-abc|/v1/chat"},
		{"every safe punctuation byte", false, "r", []string{"-._~:@/+=,;!*'()"}, "tb:r:-._~:@/+=,;!*'()"},
		{"pipe", false, "r", []string{"a|b"}, "tb:r:a%7Cb"},
		{"percent", false, "r", []string{"50%"}, "tb:r:50%25"},
		{"literal %7C", false, "r", []string{"%7C"}, "tb:r:%257C"},
		{"hash sign", false, "r", []string{"#x"}, "tb:r:%23x"},
		{"space and control", false, "r", []string{"a b\t\x00"}, "tb:r:a%20b%09%00"},
		{"non-ASCII", false, "r", []string{"é"}, "tb:r:%C3%A9"},
		{"DEL and high byte", false, "r", []string{"\x7f\xff"}, "tb:r:%7F%FF"},
		{"empty value", false, "r", []string{""}, "tb:r:"},
		{"trailing empty value", false, "r", []string{"a", ""}, "tb:r:a|"},
		{"two empty values", false, "r", []string{"", ""}, "tb:r:|"},
		{"no values", false, "r", nil, "tb:r:"},
		{"64 safe bytes literal", false, "r", []string{safe64}, "tb:r:" + safe64},
		{"65 safe bytes hashed", false, "r", []string{safe64 + "a"}, "tb:r:" + hashed(safe64+"a")},
		{"encoded to 64 bytes", false, "r", []string{safe64[:61] + "|"}, "tb:r:" + safe64[:61] + "%7C"},
		{"encoded to 65 bytes hashed", false, "r", []string{safe64[:62] + "|"}, "tb:r:" + hashed(safe64[:62]+"|")},
		{"22 pipes hashed", false, "r", []string{strings.Repeat("|", 22)}, "tb:r:" + hashed(strings.Repeat("|", 22))},
		{"21 pipes encoded", false, "r", []string{strings.Repeat("|", 21)}, "tb:r:" + strings.Repeat("%7C", 21)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(AppendKey([]byte("prefix "), tt.shadow, tt.rule, tt.input))
			if want := "prefix " + tt.expected; got != want {
				t.Errorf("got %q, want %q", got, want)
			}
			if bound := len("prefix ") + MaxKeyLen(tt.shadow, tt.rule, len(tt.input)); len(got) > bound {
				t.Errorf("got length %d, want at most %d", len(got), bound)
			}
		})
	}
}

// TestAppendKeyUnambiguous builds keys for value lists chosen to collide
// under a careless encoding and checks they are all different.
func TestAppendKeyUnambiguous(t *testing.T) {
	long := strings.Repeat("x", 100)
	lists := [][]string{
		{"a|b", "c"}, {"a", "b|c"}, {"a%7Cb", "c"}, {"a%257Cb", "c"},
		{"|", ""}, {"", "|"}, {"%7C", ""}, {"", "%7C"}, {"", ""}, {"|", "|"},
		{long, ""}, {hashed(long), ""}, {hashed(long)[1:], ""}, {"%23" + hashed(long)[1:], ""},
		{long + "y", ""}, {"#", ""}, {"%23", ""}, {"%", "%"}, {"%%", ""},
		{"a", ""}, {"", "a"}, {"a ", ""}, {"a%20", ""}, {"é", ""}, {"%C3%A9", ""},
		{strings.Repeat("|", 21), ""}, {strings.Repeat("|", 22), ""}, {strings.Repeat("%7C", 21), ""},
	}
	seen := make(map[string]int)
	for i, values := range lists {
		key := string(AppendKey(nil, false, "r", values))
		if j, ok := seen[key]; ok {
			t.Errorf("step %d: %q and %q both give %q", i, lists[j], values, key)
		}
		seen[key] = i
	}
	// Within a rule the number of values is fixed, so the one documented
	// coincidence, [] and [""], cannot happen; lists of different non-zero
	// lengths never meet because each '|' is a separator.
	if a, b := string(AppendKey(nil, false, "r", nil)), string(AppendKey(nil, false, "r", []string{""})); a != b {
		t.Errorf("got %q and %q, want the documented coincidence", a, b)
	}
}

func TestAppendKeyAllocsAndBound(t *testing.T) {
	worst := [][]string{
		{strings.Repeat("a", 64), strings.Repeat("b", 64), strings.Repeat("c", 64)},
		{strings.Repeat("a", 1000), strings.Repeat("|", 21) + "a", "x"},
		{strings.Repeat("é", 500)},
	}
	for i, values := range worst {
		bound := MaxKeyLen(true, "per-org-rps", len(values))
		dst := make([]byte, 0, bound)
		if n := testing.AllocsPerRun(100, func() { dst = AppendKey(dst[:0], true, "per-org-rps", values) }); n != 0 {
			t.Errorf("step %d: got %v allocations, want 0", i, n)
		}
		if len(dst) > bound {
			t.Errorf("step %d: got length %d, want at most %d", i, len(dst), bound)
		}
	}
	if got, want := MaxKeyLen(false, "rule", 2), len("tb:rule:")-1+2*65; got != want {
		t.Errorf("MaxKeyLen: got %d, want %d", got, want)
	}
	if got, want := MaxKeyLen(true, "rule", 0), len("shadow:tb:rule:"); got != want {
		t.Errorf("MaxKeyLen with no values: got %d, want %d", got, want)
	}
}

func FuzzAppendKey(f *testing.F) {
	f.Add("a|b", "c", "a", "b|c")
	f.Add("%7C", "", "|", "")
	f.Add(strings.Repeat("x", 65), "", hashed(strings.Repeat("x", 65)), "")
	f.Add("", "", "", "")
	f.Fuzz(func(t *testing.T, a0, a1, b0, b1 string) {
		ka := string(AppendKey(nil, false, "r", []string{a0, a1}))
		kb := string(AppendKey(nil, false, "r", []string{b0, b1}))
		if (a0 != b0 || a1 != b1) && ka == kb {
			t.Fatalf("[%q %q] and [%q %q] both give %q", a0, a1, b0, b1, ka)
		}
		k1a := string(AppendKey(nil, false, "r", []string{a0}))
		k1b := string(AppendKey(nil, false, "r", []string{b0}))
		if a0 != b0 && k1a == k1b {
			t.Fatalf("[%q] and [%q] both give %q", a0, b0, k1a)
		}
		if k1a == ka {
			t.Fatalf("[%q] and [%q %q] both give %q", a0, a0, a1, ka)
		}
		for _, k := range []string{ka, kb, k1a, k1b} {
			for i := 0; i < len(k); i++ {
				if k[i] <= ' ' || k[i] >= 0x7f {
					t.Fatalf("key %q has byte %#x at %d", k, k[i], i)
				}
			}
		}
		if len(ka) > MaxKeyLen(false, "r", 2) || len(k1a) > MaxKeyLen(false, "r", 1) {
			t.Fatalf("key %q or %q too long", ka, k1a)
		}
	})
}

func TestAppendUint32MatchesStrconv(t *testing.T) {
	us := []uint32{0, 1, 9, 10, 99, 100, 65535, 1e9 - 1, 1e9, math.MaxUint32 - 1, math.MaxUint32}
	for u := range uint32(1 << 18) { // every slot of max_keys up to 262,144
		us = append(us, u)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 100000 {
		us = append(us, r.Uint32(), r.Uint32()>>r.IntN(32))
	}
	for _, u := range us {
		if got, want := string(appendUint32([]byte("x"), u)), "x"+strconv.FormatUint(uint64(u), 10); got != want {
			t.Fatalf("appendUint32(%d): got %q, want %q", u, got, want)
		}
	}
}

// TestAppendOwnerSlotsMatches: AppendOwnerSlots writes what AppendComposite
// writes and chooses the slots SlotPairBytes chooses for it, for one value
// or several, safe, percent-encoded or hashed, after whatever dst holds.
func TestAppendOwnerSlotsMatches(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	one := []string{"", "10.0.0.1", "2001:db8::/64", "key-0123456789", "a|b", "a b", "%", "#x", "é",
		strings.Repeat("a", 64), strings.Repeat("a", 65), strings.Repeat("a", 63) + " ", strings.Repeat("|", 30)}
	const alphabet = "aZ09.-:_ |%#\x00\xff/"
	for range 3000 {
		b := make([]byte, r.IntN(80))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		one = append(one, string(b))
	}
	var lists [][]string
	for _, v := range one {
		lists = append(lists, []string{v}, []string{v, one[r.IntN(len(one))]})
	}
	for i, vals := range lists {
		n := []uint32{1, 2, 3, 1000, 65536, 1 << 24}[i%6]
		seed := r.Uint64()
		head := []byte("head|")[:r.IntN(6)]
		got, a, b := AppendOwnerSlots(append([]byte(nil), head...), seed, vals, n)
		want := AppendComposite(append([]byte(nil), head...), vals)
		wa, wb := SlotPairBytes(seed, want[len(head):], n)
		if string(got) != string(want) || a != wa || b != wb {
			t.Fatalf("AppendOwnerSlots(%q, %#x, %q, %d) = %q, %d, %d; want %q, %d, %d", head, seed, vals, n, got, a, b, want, wa, wb)
		}
	}
}

// BenchmarkSlotKeys is what the filter builds for a slotted per-IP rule:
// the owner, its two slots and their keys.
func BenchmarkSlotKeys(b *testing.B) {
	vals := []string{"10.0.0.1"}
	buf := make([]byte, 0, 128)
	b.ReportAllocs()
	for b.Loop() {
		var x, y uint32
		buf, x, y = AppendOwnerSlots(buf[:0], 42, vals, 100000)
		buf = AppendSlotKey(buf, false, "per-ip", x)
		buf = AppendSlotKey(buf, false, "per-ip", y)
	}
}
