package procstore_test

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/procstore"
)

// TestSemantics: the store answers as Envoy's shared data does, step by
// step (the same table as sharedstate.MemStore's Envoy semantics).
func TestSemantics(t *testing.T) {
	s := procstore.New()
	v := &procstore.View{S: s}
	if _, _, err := v.Get("k"); !errors.Is(err, sharedstate.ErrNotFound) {
		t.Fatalf("get missing: err %v, want ErrNotFound", err)
	}
	if err := v.Set("k", []byte("a"), 77); err != nil {
		t.Fatalf("set missing with a stale cas: %v, want created", err)
	}
	got, cas1, err := v.Get("k")
	if err != nil || string(got) != "a" || cas1 == 0 {
		t.Fatalf("get = %q, %d, %v; want a, non-zero cas, nil", got, cas1, err)
	}
	if err := v.Set("k", []byte("b"), cas1+1); !errors.Is(err, sharedstate.ErrCASMismatch) {
		t.Fatalf("set with a wrong cas: %v, want ErrCASMismatch", err)
	}
	if err := v.Set("k", []byte("bb"), cas1); err != nil {
		t.Fatalf("set with the current cas: %v", err)
	}
	got, cas2, _ := v.Get("k")
	if string(got) != "bb" || cas2 == cas1 {
		t.Fatalf("after cas set: %q cas %d (was %d); want bb and a new cas", got, cas2, cas1)
	}
	if err := v.Set("k", []byte("c"), cas1); !errors.Is(err, sharedstate.ErrCASMismatch) {
		t.Fatalf("set with the old cas: %v, want ErrCASMismatch", err)
	}
	if err := v.Set("k", []byte("d"), 0); err != nil {
		t.Fatalf("unconditional set: %v", err)
	}
	if got, _, _ := v.Get("k"); string(got) != "d" {
		t.Fatalf("after unconditional set: %q, want d", got)
	}
	// Neither the key nor the value is kept: the caller may reuse both.
	key, val := []byte("reused"), []byte("x")
	_ = v.Set(string(key), val, 0)
	key[0], val[0] = 'R', 'y'
	if got, _, err := v.Get("reused"); err != nil || string(got) != "x" {
		t.Fatalf("after the caller reused its buffers: %q, %v; want x", got, err)
	}
	if n := s.Len(); n != 2 {
		t.Fatalf("Len = %d, want 2", n)
	}
}

// TestHammerExact: 8 goroutines (worker threads), each with its own view
// and updater, take from one bucket with time frozen, and from per-worker
// buckets: exactly the burst is admitted on the shared key, and every
// per-worker key admits its own burst, under -race.
func TestHammerExact(t *testing.T) {
	const (
		workers = 8
		loops   = 500
		burst   = 1000
	)
	s := procstore.New()
	lim := bucket.Limit{Rate: 1, Burst: burst}
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u := &sharedstate.Updater{Store: &procstore.View{S: s}, MaxAttempts: 1 << 20}
			res := make([]bucket.Result, 1)
			own := "tb:own:" + strconv.Itoa(g)
			for range loops {
				out := u.TakeAll([]sharedstate.Request{{Key: "tb:hot", Limit: lim, Cost: 1}}, 1000, res)
				if out.Err != nil {
					failed.Add(1)
				} else if res[0].Allowed {
					admitted.Add(1)
				}
				u.TakeAll([]sharedstate.Request{{Key: own, Limit: lim, Cost: 1}}, 1000, res)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d updates failed", failed.Load())
	}
	if got, want := admitted.Load(), int64(burst); got != want {
		t.Fatalf("admitted %d on the shared key, want exactly the burst %d", got, want)
	}
	v := &procstore.View{S: s}
	for g := range workers {
		b, _, err := v.Get("tb:own:" + strconv.Itoa(g))
		if err != nil {
			t.Fatal(err)
		}
		st, err := sharedstate.ParseState(b)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := st.Tokens, float64(burst-loops); got != want {
			t.Fatalf("worker %d's own bucket holds %v tokens, want %v", g, got, want)
		}
	}
}

// TestNoAllocs: a get, and a set of an existing key, allocate nothing.
func TestNoAllocs(t *testing.T) {
	v := &procstore.View{S: procstore.New()}
	_ = v.Set("tb:a", []byte("12345678901234567890"), 0)
	allocs := testing.AllocsPerRun(1000, func() {
		b, cas, err := v.Get("tb:a")
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Set("tb:a", b[:10], cas); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per get+set, want 0", allocs)
	}
}

// TestViewSetAfterGet: the entry a view's Get remembers is used only for
// the same key, and its Set keeps the compare-and-swap against writes made
// through other views meanwhile.
func TestViewSetAfterGet(t *testing.T) {
	s := procstore.New()
	v, other := &procstore.View{S: s}, &procstore.View{S: s}
	_ = v.Set("tb:a", []byte("a1"), 0)
	_ = v.Set("tb:b", []byte("b1"), 0)
	_, cas, err := v.Get("tb:a")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Set("tb:b", []byte("b2"), 0); err != nil {
		t.Fatal(err)
	}
	if err := other.Set("tb:a", []byte("a2"), cas); err != nil {
		t.Fatal(err)
	}
	if err := v.Set("tb:a", []byte("a3"), cas); err != sharedstate.ErrCASMismatch {
		t.Fatalf("a stale cas through the remembered entry: got %v, want a CAS mismatch", err)
	}
	_, cas, _ = v.Get("tb:a")
	if err := v.Set("tb:a", []byte("a4"), cas); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Get("tb:missing"); err != sharedstate.ErrNotFound {
		t.Fatal(err)
	}
	if err := v.Set("tb:missing", []byte("m"), sharedstate.SeedCAS); err != nil {
		t.Fatalf("a missing key is created whatever the cas: %v", err)
	}
	for key, want := range map[string]string{"tb:a": "a4", "tb:b": "b2", "tb:missing": "m"} {
		if got, _, err := other.Get(key); err != nil || string(got) != want {
			t.Errorf("%s: got %q, %v; want %q", key, got, err, want)
		}
	}
}
