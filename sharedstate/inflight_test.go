package sharedstate

import (
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

func TestAcquireReleaseSteps(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		mk := func() InFlight { return InFlight{Key: "cc:r:k", Max: 2, Lease: 100} }
		steps := []struct {
			op    string // "acq" or "rel N" (release the N-th acquired)
			now   float64
			want  int    // acq: rejected index (-1 admitted)
			value string // stored afterwards
		}{
			{"acq", t0, -1, "1:0:17369400"},
			{"acq", t0 + 1, -1, "2:0:17369400"},
			{"acq", t0 + 2, 0, "2:0:17369400"}, // full: not written
			{"rel 0", t0 + 3, 0, "1:0:17369400"},
			{"acq", t0 + 100, -1, "1:1:17369401"},  // next period: cur shifts to prev
			{"rel 1", t0 + 101, 0, "1:0:17369401"}, // admitted in the previous period: prev
			{"rel 1", t0 + 101, 0, "1:0:17369401"}, // twice: nothing more to release... in prev
			{"acq", t0 + 300, -1, "1:0:17369403"},  // two periods later: leaked counts dropped
			{"rel 2", t0 + 301, 0, "1:0:17369403"}, // the one of period ...401 was dropped
		}
		var held []InFlight
		for i, st := range steps {
			switch st.op {
			case "acq":
				r := []InFlight{mk()}
				rej, _, err := u.Acquire(r, st.now)
				if err != nil || rej != st.want {
					t.Fatalf("step %d: got rejected %d, %v; want %d", i, rej, err, st.want)
				}
				if rej < 0 {
					held = append(held, r[0])
				}
			default:
				n, err := strconv.Atoi(st.op[4:])
				if err != nil {
					t.Fatal(err)
				}
				if _, err := u.Release(&held[n], st.now); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			if got := stored(t, m, "cc:r:k"); got != st.value {
				t.Fatalf("step %d (%s): got stored %q, want %q", i, st.op, got, st.value)
			}
		}
	})
}

func TestAcquireAllOrNothing(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		put(t, m, "b", "1:0:17369400")
		reqs := []InFlight{{Key: "a", Max: 5, Lease: 100}, {Key: "b", Max: 1, Lease: 100}}
		rej, _, err := u.Acquire(reqs, t0)
		if err != nil || rej != 1 {
			t.Fatalf("got %d, %v; want 1", rej, err)
		}
		if got := stored(t, m, "a"); got != "0:0:17369400" {
			t.Errorf("a: got %q, want it released", got)
		}
	})
}

func TestAcquireSlots(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		// Another identity's live count in slot a: b is taken.
		put(t, m, "s1", "1:0:17369400:other")
		r := []InFlight{{Key: "s1", Alt: "s2", Owner: "me", Slotted: true, Max: 1, Lease: 100}}
		if rej, _, err := u.Acquire(r, t0); err != nil || rej != -1 || r[0].Stored != "s2" {
			t.Fatalf("got %d %v stored %q; want admitted in s2", rej, err, r[0].Stored)
		}
		if got := stored(t, m, "s2"); got != "1:0:17369400:me" {
			t.Errorf("s2: got %q", got)
		}
		// Both live with others: the identity shares the emptier one.
		put(t, m, "s2", "1:0:17369400:third")
		put(t, m, "s1", "0:1:17369400:other")
		r2 := []InFlight{{Key: "s1", Alt: "s2", Owner: "fourth", Slotted: true, Max: 2, Lease: 100}}
		if rej, _, err := u.Acquire(r2, t0); err != nil || rej != -1 {
			t.Fatalf("got %d %v", rej, err)
		}
		if got := stored(t, m, "s1"); got != "1:1:17369400:other" {
			t.Errorf("s1: got %q, want shared with its owner kept", got)
		}
		if _, err := u.Release(&r2[0], t0+1); err != nil {
			t.Fatal(err)
		}
		if got := stored(t, m, "s1"); got != "0:1:17369400:other" {
			t.Errorf("s1 after release: got %q", got)
		}
	})
}

// TestAcquireTakesOverIdleSlot pins what a concurrency slot owned by
// another identity does on a key collision: one with nothing in flight
// (nothing counted in this lease period or the previous one, or only
// counts the lease has dropped) is taken over, the newcomer written as its
// owner, so that it gets its own max_in_flight rather than a share; one
// with a request in flight, even from the previous period, is shared and
// keeps its owner, never evicted: Release does not look at the owner, so
// the evicted identity's releases would come off the newcomer's count and
// let it exceed its limit. A release by the former owner of a count the
// lease dropped leaves the newcomer's count alone.
func TestAcquireTakesOverIdleSlot(t *testing.T) {
	const gen = "17369400" // floor(t0 / 100)
	for _, tt := range []struct {
		name, s1, s2    string
		stored, s1After string
	}{
		{"idle in this period", "0:0:" + gen + ":other", "", "s1", "1:0:" + gen + ":me"},
		{"counts dropped by the lease", "3:2:17369398:other", "", "s1", "1:0:" + gen + ":me"},
		{"idle in the previous period", "0:0:17369399:other", "", "s1", "1:0:" + gen + ":me"},
		{"in flight since the previous period", "1:0:17369399:other", "1:0:" + gen + ":third", "s1", "1:1:" + gen + ":other"},
		{"both live: shared, owner kept", "0:1:" + gen + ":other", "2:0:" + gen + ":third", "s1", "1:1:" + gen + ":other"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			forEachSemantics(t, func(t *testing.T, m *MemStore) {
				u := &Updater{Store: m}
				put(t, m, "s1", tt.s1)
				if tt.s2 != "" {
					put(t, m, "s2", tt.s2)
				}
				r := []InFlight{{Key: "s1", Alt: "s2", Owner: "me", Slotted: true, Max: 5, Lease: 100}}
				if rej, _, err := u.Acquire(r, t0); err != nil || rej != -1 || r[0].Stored != tt.stored {
					t.Fatalf("got %d %v stored %q; want admitted in %s", rej, err, r[0].Stored, tt.stored)
				}
				if got := stored(t, m, "s1"); got != tt.s1After {
					t.Errorf("s1: got %q, want %q", got, tt.s1After)
				}
			})
		})
	}
	// The former owner's count was dropped by the lease (admitted two
	// periods ago); its late release must not come off the newcomer's.
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		olds := []InFlight{{Key: "s1", Alt: "s2", Owner: "other", Slotted: true, Max: 5, Lease: 100}}
		if rej, _, err := u.Acquire(olds, t0-200); err != nil || rej != -1 || olds[0].Stored != "s1" {
			t.Fatalf("former owner: %d %v stored %q", rej, err, olds[0].Stored)
		}
		r := []InFlight{{Key: "s1", Alt: "s2", Owner: "me", Slotted: true, Max: 5, Lease: 100}}
		if rej, _, err := u.Acquire(r, t0); err != nil || rej != -1 || r[0].Stored != "s1" {
			t.Fatalf("newcomer: %d %v stored %q, want s1 taken over", rej, err, r[0].Stored)
		}
		if _, err := u.Release(&olds[0], t0); err != nil {
			t.Fatal(err)
		}
		if got := stored(t, m, "s1"); got != "1:0:"+gen+":me" {
			t.Errorf("after the former owner's late release: %q, want the newcomer's 1 kept", got)
		}
	})
}

// TestAcquireHammer: P goroutines acquire and release one key through
// Envoy-like CAS; the number held at once never exceeds Max and the count
// ends at zero.
func TestAcquireHammer(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		const P, N, max = 8, 300, 3
		var held, peak atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < P; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				u := &Updater{Store: m, Backoff: SpinBackoff(uint64(g) + 1)}
				for i := 0; i < N; i++ {
					r := []InFlight{{Key: "hot", Alt: "hot2", Owner: "id", Slotted: true, Max: max, Lease: 1000}}
					rej, _, err := u.Acquire(r, t0)
					if err != nil {
						t.Error(err)
						return
					}
					if rej >= 0 {
						continue
					}
					n := held.Add(1)
					for {
						p := peak.Load()
						if n <= p || peak.CompareAndSwap(p, n) {
							break
						}
					}
					held.Add(-1)
					if _, err := u.Release(&r[0], t0); err != nil {
						t.Error(err)
						return
					}
				}
			}(g)
		}
		wg.Wait()
		if p := peak.Load(); p > max || p == 0 {
			t.Errorf("peak held %d, want 1..%d", p, max)
		}
		for _, k := range []string{"hot", "hot2"} {
			if v := stored(t, m, k); v != "<missing>" {
				if cur, prev, _, _, err := ParseInFlight([]byte(v)); err != nil || cur+prev != 0 {
					t.Errorf("%s: got %q, want nothing in flight", k, v)
				}
			}
		}
	})
}

func TestParseInflight(t *testing.T) {
	for _, tt := range []struct {
		in    string
		ok    bool
		owner string
	}{
		{"1:2:3", true, ""}, {"1:2:3:a:b", true, "a:b"}, {"1:2", false, ""}, {"-1:2:3", false, ""},
		{"1:2:3x", false, ""}, {"", false, ""}, {"99999999999999999:0:0", false, ""},
	} {
		_, _, _, o, err := ParseInFlight([]byte(tt.in))
		if (err == nil) != tt.ok || o != tt.owner {
			t.Errorf("%q: got owner %q err %v", tt.in, o, err)
		}
	}
}

func TestSettle(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		lim := bucket.Limit{Rate: 1, Burst: 10, MaxDebt: 10}
		r := Request{Key: "k", Limit: lim, Cost: 2}
		if out := take(u, t0, r); !out.Allowed {
			t.Fatal(out)
		}
		r.Stored = "k"
		steps := []struct {
			op     SettleOp
			amount float64
			want   string
		}{
			{SettleCharge, 5, enc(3, t0)},
			{SettleCharge, 8, "-5.000000:1736940000.000000"},
			{SettleCharge, 100, "-10.000000:1736940000.000000"}, // the debt stops at -MaxDebt
			{SettleRefund, 4, "-6.000000:1736940000.000000"},
			{SettleReset, 0, enc(10, t0)},
			{SettleRefund, 0, enc(10, t0)},
		}
		for i, st := range steps {
			if _, err := u.Settle(&r, st.op, st.amount, t0); err != nil {
				t.Fatal(err)
			}
			if got := stored(t, m, "k"); got != st.want {
				t.Fatalf("step %d: got %q, want %q", i, got, st.want)
			}
		}
		// In debt, nothing passes, not even a cost of 0; Retry-After is the
		// time to repay it.
		if _, err := u.Settle(&r, SettleCharge, 14, t0); err != nil {
			t.Fatal(err)
		}
		out := take(u, t0, Request{Key: "k", Limit: lim, Cost: 0})
		if out.Allowed || out.Results[0].RetryAfter != 4 {
			t.Fatalf("got %+v, want rejected with RetryAfter 4", out)
		}
		if out := take(u, t0+4, Request{Key: "k", Limit: lim, Cost: 0}); !out.Allowed {
			t.Fatalf("got %+v after repaying, want allowed", out)
		}
	})
}
