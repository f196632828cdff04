package filter_test

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
)

// Clock jumps at the filter level (issue 6, "Faults and time"): the plugin's
// clock is stepped backwards and forwards by seconds, hours and years.

const (
	hour = 3600.0
	year = 365 * 86400.0
)

// clockRule is one bucket without limit keys, so its key is "tb:clock:":
// rate 2/s, burst 10, cost from x-cost (default 1).
const clockRule = `{"name":"clock","algorithm_config":{"rps":2,"burst":10,"cost_source":"header:x-cost"}}`

// maxRetryAfter is the largest Retry-After clockRule may send: a wait of at
// most burst/rate = 5 s, plus at most 50% jitter.
const maxRetryAfter = 8 // ceil(10/2)*1.5 + 1, rounded down

// checkClockInvariants checks one answer of clockRule and the stored bucket.
func checkClockInvariants(t *testing.T, f *fixture, i int, res filtertest.Result) {
	t.Helper()
	switch res.Status() {
	case 200:
		if res.Header("ratelimit-limit") == "" {
			break // failed open: no decision, no headers
		}
		if left := remaining(res); left < 0 || left > 10 || res.Header("ratelimit-limit") != "10" {
			t.Fatalf("step %d (now %.6f): RateLimit-Remaining %d of %s, want within [0, 10]", i, f.now, left, res.Header("ratelimit-limit"))
		}
	case 429:
		if got := res.Header("x-tokengate-reason"); got != filter.ReasonExceeded {
			t.Fatalf("step %d (now %.6f): reason %q, want %s", i, f.now, got, filter.ReasonExceeded)
		}
		ra, err := strconv.Atoi(res.Header("retry-after"))
		if err != nil || ra < 1 || ra > maxRetryAfter {
			t.Fatalf("step %d (now %.6f): Retry-After %q, want an integer within [1, %d]", i, f.now, res.Header("retry-after"), maxRetryAfter)
		}
	default:
		t.Fatalf("step %d (now %.6f): status %d", i, f.now, res.Status())
	}
	if f.raw("tb:clock:") == "<missing>" {
		return
	}
	tokens, last := f.state("tb:clock:")
	if tokens < 0 || tokens > 10 || !(last > 0) || math.IsInf(last, 0) {
		t.Fatalf("step %d (now %.6f): stored %v tokens at %v, want tokens within [0, 10] and a finite last > 0", i, f.now, tokens, last)
	}
}

// TestClockJumpSteps walks a table of fixed instants.
func TestClockJumpSteps(t *testing.T) {
	tests := []struct {
		at       float64 // the clock, relative to epoch
		cost     int
		want     uint32
		left     int64 // RateLimit-Remaining of an allowed request; -1: failed open
		wantLast float64
	}{
		{0, 4, 200, 6, 0},
		// Back 5 s: tokens are kept, nothing refills, Last follows the clock.
		{-5, 1, 200, 5, -5},
		// ... and the bucket refills as time moves on from there: +1 s, +2.
		{-4, 1, 200, 6, -4},
		// Back an hour: the same.
		{-4 - hour, 1, 200, 5, -4 - hour},
		{-3.5 - hour, 1, 200, 5, -3.5 - hour},
		// Forward an hour: full.
		{-3.5, 1, 200, 9, -3.5},
		// Back half a second is clock skew between workers: Last is kept so
		// that the interval is not counted twice.
		{-4, 1, 200, 8, -3.5},
		{-3.25, 1, 200, 7, -3.25},
		// Forward two years: full.
		{2 * year, 1, 200, 9, 2 * year},
		// Back two years: the stored last_refill is more than a day ahead,
		// so the value counts as corrupt and the bucket as full.
		{0, 1, 200, 9, 0},
		{0, 9, 200, 0, 0},
		{0, 1, 429, 0, 0},
		// Forward ten years, drain, come back one year: corrupt, full again.
		{10 * year, 10, 200, 0, 10 * year},
		{9 * year, 1, 200, 9, 9 * year},
		// A clock at or before the epoch, or not a number, is unusable: the
		// request fails open and nothing is written.
		{-epoch, 1, 200, -1, 9 * year},
		{-epoch - year, 1, 200, -1, 9 * year},
		{math.NaN(), 1, 200, -1, 9 * year},
		{math.Inf(1), 1, 200, -1, 9 * year},
		// A clock far in the future (year ~33700): full, and the value is
		// still short and exact; coming back from there is corrupt again.
		{1e12, 1, 200, 9, 1e12},
		{9 * year, 1, 200, 9, 9 * year},
	}
	f := newFixture(t, clockRule)
	failOpen := int64(0)
	for i, tc := range tests {
		f.now = epoch + tc.at
		res := f.get("x-cost", strconv.Itoa(tc.cost))
		if res.Status() != tc.want {
			t.Fatalf("step %d (epoch%+g): got status %d, want %d", i, tc.at, res.Status(), tc.want)
		}
		if tc.want == 200 {
			if got := remaining(res); got != tc.left {
				t.Errorf("step %d (epoch%+g): got RateLimit-Remaining %d, want %d", i, tc.at, got, tc.left)
			}
		}
		if tc.left < 0 {
			failOpen++
		}
		if got := f.counter("clock", filter.CounterFailOpen); got != failOpen {
			t.Errorf("step %d (epoch%+g): fail_open %d, want %d", i, tc.at, got, failOpen)
		}
		if _, last := f.state("tb:clock:"); last != epoch+tc.wantLast {
			t.Errorf("step %d (epoch%+g): stored last_refill %.6f, want epoch%+g", i, tc.at, last, tc.wantLast)
		}
		checkClockInvariants(t, f, i, res)
	}
	if got := f.global(filter.MetricCorruptState); got != 3 {
		t.Errorf("corrupt_state: got %d, want 3 (the steps back by two years, one year and from 1e12)", got)
	}
	if len(f.mem().Snapshot("tb:clock:")[0].Value) > 48 {
		t.Errorf("stored value %q is longer than 48 bytes", f.mem().Snapshot("tb:clock:")[0].Value)
	}
}

// TestClockChaos steps the clock back and forth at random, by milliseconds
// to decades, with random costs, and checks the invariants on every answer;
// then lets the clock run past everything it has seen and expects a full
// bucket: nothing stays stuck.
func TestClockChaos(t *testing.T) {
	jumps := []float64{0.001, 0.1, 0.5, 1, 1.5, 5, 60, hour, 86400, 2 * 86400, year, 30 * year}
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run("seed "+strconv.FormatUint(seed, 10), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 0x70ce))
			f := newFixture(t, clockRule)
			maxNow := f.now
			for i := 0; i < 3000; i++ {
				d := jumps[rng.IntN(len(jumps))]
				if rng.IntN(2) == 0 {
					d = -d
				}
				f.now += d
				if f.now < epoch-40*year || f.now > epoch+40*year {
					f.now -= 2 * d // reflect: stay in a plausible range
				}
				maxNow = max(maxNow, f.now)
				res := f.get("x-cost", strconv.Itoa(1+rng.IntN(10)))
				checkClockInvariants(t, f, i, res)
			}
			f.now = maxNow + 5 // burst/rate after the latest instant seen
			if res := f.get(); res.Status() != 200 || remaining(res) != 9 {
				t.Errorf("after the clock passed every instant seen: got %d remaining %d, want 200 and 9", res.Status(), remaining(res))
			}
			checkNoPanics(t, f)
		})
	}
}

// TestEmptyBucketStuckAfterClockStepBack is the regression test of a bug:
// when the clock was stepped back by more than bucket.MaxClockSkew (and less
// than Updater.MaxFuture, one day) while a bucket lacked tokens, the bucket
// stayed empty until the clock caught up with the stored last_refill,
// though Retry-After told the client to come back in a second. Refill
// re-anchored Last in memory, but a rejection wrote nothing, so every
// request recomputed "0 tokens" from the old, future last_refill. Fixed in
// fba92a3: a rejection stores the re-anchored state. A client that waits
// Retry-After is admitted.
func TestEmptyBucketStuckAfterClockStepBack(t *testing.T) {
	configs := map[string]string{
		"no limit keys":  clockRule,
		"slotted per-ip": `{"name":"clock","limit_keys":["ip:address"],"algorithm_config":{"rps":2,"burst":10,"cost_source":"header:x-cost"}}`,
	}
	for _, name := range []string{"no limit keys", "slotted per-ip"} {
		for _, back := range []float64{5, hour, 12 * hour} {
			t.Run(name+"/back "+strconv.FormatFloat(back, 'f', -1, 64)+" s", func(t *testing.T) {
				f := newFixture(t, configs[name])
				if res := f.get("x-cost", "10"); res.Status() != 200 || remaining(res) != 0 {
					t.Fatalf("draining: got %d remaining %d", res.Status(), remaining(res))
				}
				f.now -= back
				res := f.get()
				if res.Status() != 429 {
					t.Fatalf("right after the step back: got %d, want 429 (the bucket is empty)", res.Status())
				}
				ra, err := strconv.Atoi(res.Header("retry-after"))
				if err != nil || ra < 1 {
					t.Fatalf("Retry-After %q", res.Header("retry-after"))
				}
				f.now += float64(ra)
				if res := f.get(); res.Status() != 200 {
					t.Errorf("after waiting Retry-After (%d s) at 2 tokens/s: got %d, want 200; the bucket is stuck until the clock is back at %.0f (%.0f s away)",
						ra, res.Status(), epoch, epoch-f.now)
				}
			})
		}
	}
}
