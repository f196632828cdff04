package filter_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// TestFixedWindowBoundaryEachMode walks one key through its window
// boundaries in every start mode: the stored window start is where the
// mode put it (a multiple of the window for "aligned"); a microsecond
// before the next window start a drained key is still refused, a
// microsecond after it the limit (3) arrives, not more; after idle windows
// the rollover stops at the capacity (5).
func TestFixedWindowBoundaryEachMode(t *testing.T) {
	for _, mode := range []string{"aligned", "hash", "random"} {
		t.Run(mode, func(t *testing.T) {
			f := newFixture(t, windowCfg(mode))
			f.now = epoch + 3.5
			if got := statuses(f, "k", 6); got != "222224" {
				t.Fatalf("a new key: %s, want the capacity of 5 then a 429", got)
			}
			start := storedWindowStart(t, f)
			if start > f.now || start <= f.now-10 {
				t.Fatalf("stored window start %v does not hold now %v", start, f.now)
			}
			if mode == "aligned" && start != epoch {
				t.Errorf("aligned window start %v, want %v", start, epoch)
			}
			for k := 1; k <= 3; k++ {
				next := start + float64(k)*10
				f.now = next - 1e-6
				if got := statuses(f, "k", 1); got != "4" {
					t.Fatalf("window %d: 1 µs before its start: %s, want 429", k, got)
				}
				f.now = next + 1e-6
				if got := statuses(f, "k", 4); got != "2224" {
					t.Fatalf("window %d: just after its start: %s, want the limit, 3", k, got)
				}
			}
			// Idle for 7 windows: 7 × 3 tokens, capped at the capacity.
			f.now = start + 110 + 1e-6
			if got := statuses(f, "k", 6); got != "222224" {
				t.Errorf("after idle windows: %s, want the capacity, 5, not more", got)
			}
			if got := storedWindowStart(t, f); got != start+110 {
				t.Errorf("window start after idle windows %v, want %v (same phase)", got, start+110)
			}
		})
	}
}

// storedWindowStart returns the window start stored with the key of rule
// fw (its state's second field).
func storedWindowStart(t *testing.T, f *fixture) float64 {
	t.Helper()
	entries := f.h.Store.(*sharedstatetest.Store).Snapshot("tb:fw:")
	if len(entries) != 1 {
		t.Fatalf("stored %+v, want one fw key", entries)
	}
	parts := strings.Split(entries[0].Value, ":")
	if len(parts) < 2 {
		t.Fatalf("stored %q", entries[0].Value)
	}
	v, err := strconv.ParseFloat(parts[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
