package sharedstate

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

// Hammer sizes: P goroutines (Envoy worker threads) × N loops each.
const (
	hammerP = 8
	hammerN = 400
)

// hammer runs fn(g, i) for i < n in each of p goroutines and waits.
func hammer(p, n int, fn func(g, i int)) {
	var wg sync.WaitGroup
	for g := range p {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				fn(g, i)
			}
		}()
	}
	wg.Wait()
}

// parsed returns the state stored under key.
func parsed(t *testing.T, s Store, key string) bucket.State {
	t.Helper()
	v, _, err := s.Get(key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	st, err := ParseState(v)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestHammerFrozenTime: with no time passing, P goroutines together admit
// exactly the burst: no lost update, no over-admission.
func TestHammerFrozenTime(t *testing.T) {
	const burst = 300
	lim := bucket.Limit{Rate: 10, Burst: burst}
	m := NewMemStore(Envoy)
	var admitted, failed, retries atomic.Int64
	updaters := make([]*Updater, hammerP)
	for g := range updaters {
		updaters[g] = &Updater{Store: m}
	}
	hammer(hammerP, hammerN, func(g, _ int) {
		out := updaters[g].TakeAll([]Request{{Key: "tb:r:hot", Limit: lim, Cost: 1}}, t0, make([]bucket.Result, 1))
		retries.Add(int64(out.CASRetries))
		switch {
		case out.Err != nil:
			failed.Add(1)
		case out.Allowed:
			admitted.Add(1)
		}
	})
	if got := admitted.Load(); got != burst {
		t.Errorf("got %d admitted, want exactly %d (%d failed open)", got, burst, failed.Load())
	}
	if got := parsed(t, m, "tb:r:hot").Tokens; got != 0 {
		t.Errorf("got %v tokens left, want 0", got)
	}
	t.Logf("%d CAS retries, %d failed open", retries.Load(), failed.Load())
}

// TestHammerAdvancingTime: each request reads a shared clock that moves one
// tick per request. The tokens admitted are bounded by what the bucket held
// and gained, and, since demand exceeds the rate, fall short of it by less
// than one cost plus the refill of the P requests in flight at the start.
func TestHammerAdvancingTime(t *testing.T) {
	const (
		burst = 100.0
		rate  = 1000.0 // tokens per second
		tick  = 10     // µs per request: 0.01 token, far below the cost
		cost  = 1.0
	)
	lim := bucket.Limit{Rate: rate, Burst: burst}
	m := NewMemStore(Envoy)
	start := int64(t0 * 1e6)
	if out := take(&Updater{Store: m}, t0, Request{Key: "k", Limit: lim}); !out.Allowed {
		t.Fatalf("seed: got %+v", out)
	}
	var clock, admitted, failed, retries atomic.Int64
	updaters := make([]*Updater, hammerP)
	for g := range updaters {
		updaters[g] = &Updater{Store: m}
	}
	hammer(hammerP, hammerN, func(g, _ int) {
		now := float64(start+clock.Add(tick)) / 1e6
		out := updaters[g].TakeAll([]Request{{Key: "k", Limit: lim, Cost: cost}}, now, make([]bucket.Result, 1))
		retries.Add(int64(out.CASRetries))
		switch {
		case out.Err != nil:
			failed.Add(1)
		case out.Allowed:
			admitted.Add(1)
		}
	})
	elapsed := float64(clock.Load()) / 1e6
	supply := burst + rate*elapsed
	got := float64(admitted.Load()) * cost
	if got > supply {
		t.Errorf("got %v tokens admitted, want at most burst + rate×elapsed = %v", got, supply)
	}
	if slack := cost + rate*hammerP*tick/1e6; got < supply-slack {
		t.Errorf("got %v tokens admitted, want at least %v - %v", got, supply, slack)
	}
	// Conservation: what was admitted plus what is left is what the bucket
	// held and gained up to its last refill.
	s := parsed(t, m, "k")
	if gained := burst + rate*(s.Last-t0); got+s.Tokens > gained+1e-6 {
		t.Errorf("got %v admitted + %v left, want at most %v", got, s.Tokens, gained)
	}
	t.Logf("admitted %v of %v supplied; %d CAS retries, %d failed open", got, supply, retries.Load(), failed.Load())
}

// TestHammerManyKeys: P goroutines sweep 1,000 keys in different orders with
// no time passing; each key admits exactly its burst.
func TestHammerManyKeys(t *testing.T) {
	const (
		keys  = 1000
		burst = 3
		loops = 2 // sweeps per goroutine: 16 requests per key
	)
	lim := bucket.Limit{Rate: 1, Burst: burst}
	names := make([]string, keys)
	for i := range names {
		names[i] = string(AppendKey(nil, false, "r", []string{"client-" + strconv.Itoa(i)}))
	}
	m := NewMemStore(Envoy)
	counts := make([]atomic.Int64, keys)
	var failed, retries atomic.Int64
	updaters := make([]*Updater, hammerP)
	for g := range updaters {
		updaters[g] = &Updater{Store: m}
	}
	hammer(hammerP, loops*keys, func(g, i int) {
		k := (i*(2*g+1) + g*97) % keys // a different permutation per goroutine
		out := updaters[g].TakeAll([]Request{{Key: names[k], Limit: lim, Cost: 1}}, t0, make([]bucket.Result, 1))
		retries.Add(int64(out.CASRetries))
		switch {
		case out.Err != nil:
			failed.Add(1)
		case out.Allowed:
			counts[k].Add(1)
		}
	})
	for k := range counts {
		if got := counts[k].Load(); got != burst {
			t.Errorf("key %d: got %d admitted, want exactly %d (%d failed open)", k, got, burst, failed.Load())
		}
	}
	if m.Len() != keys {
		t.Errorf("got %d keys, want %d", m.Len(), keys)
	}
	t.Logf("%d CAS retries, %d failed open", retries.Load(), failed.Load())
}

// TestHammerAllOrNothing: every request takes from one shared bucket and
// from its goroutine's own. The shared burst is admitted exactly, and each
// own bucket lost exactly what its goroutine was admitted: every partial
// commit lost to a CAS race was refunded. It runs on both semantics,
// starting from missing keys.
func TestHammerAllOrNothing(t *testing.T) {
	const (
		shared = 200
		own    = 1e6
	)
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		ownKeys := make([]string, hammerP)
		admitted := make([]atomic.Int64, hammerP)
		var failed, retries atomic.Int64
		updaters := make([]*Updater, hammerP)
		for g := range updaters {
			updaters[g] = &Updater{Store: m}
			ownKeys[g] = "tb:own:" + strconv.Itoa(g)
		}
		hammer(hammerP, hammerN, func(g, i int) {
			reqs := []Request{
				{Key: "tb:shared:x", Limit: bucket.Limit{Rate: 1, Burst: shared}, Cost: 1},
				{Key: ownKeys[g], Limit: bucket.Limit{Rate: 1, Burst: own}, Cost: 1},
			}
			if i%2 == 1 { // commit in both orders
				reqs[0], reqs[1] = reqs[1], reqs[0]
			}
			out := updaters[g].TakeAll(reqs, t0, make([]bucket.Result, 2))
			retries.Add(int64(out.CASRetries))
			switch {
			case out.Err != nil:
				if !errors.Is(out.Err, ErrContention) {
					t.Errorf("got error %v", out.Err)
				}
				failed.Add(1)
			case out.Allowed:
				admitted[g].Add(1)
			}
		})
		var total int64
		for g := range admitted {
			total += admitted[g].Load()
			if got, want := parsed(t, m, ownKeys[g]).Tokens, own-float64(admitted[g].Load()); got != want {
				t.Errorf("goroutine %d: got %v tokens in its own bucket, want %v", g, got, want)
			}
		}
		if total != shared {
			t.Errorf("got %d admitted, want exactly %d (%d failed open)", total, shared, failed.Load())
		}
		t.Logf("%d CAS retries, %d failed open", retries.Load(), failed.Load())
	})
}
