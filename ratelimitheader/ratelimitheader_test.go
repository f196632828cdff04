package ratelimitheader

import (
	"math"
	"strconv"
	"testing"
)

// TestAppendCount: AppendCount writes what strconv.AppendInt writes, on
// both sides of every digit count and of the 32-bit fast path, after a
// prefix and into a slice with and without room.
func TestAppendCount(t *testing.T) {
	vals := []int64{0, 1, 9, 10, 99, 100, 999999, 1000000, 1 << 30, math.MaxUint32 - 1, math.MaxUint32,
		math.MaxUint32 + 1, math.MaxInt64, -1, math.MinInt64}
	for p := uint64(10); p < math.MaxUint32*10; p *= 10 {
		vals = append(vals, int64(p-1), int64(p), int64(p+1))
	}
	for _, v := range vals {
		want := strconv.AppendInt([]byte("r="), v, 10)
		if got := AppendCount([]byte("r="), v); string(got) != string(want) {
			t.Errorf("AppendCount(%d) = %q, want %q", v, got, want)
		}
		roomy := append(make([]byte, 0, 64), "r="...)
		if got := AppendCount(roomy, v); string(got) != string(want) {
			t.Errorf("AppendCount(%d) with room = %q, want %q", v, got, want)
		}
	}
}
