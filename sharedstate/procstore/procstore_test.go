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

// TestManyKeys: keys added until every shard's table has grown several
// times are all found with their own values and CAS tokens, a missing key
// stays missing, and Len counts each key once, against a map as the model.
func TestManyKeys(t *testing.T) {
	const n = 20000
	s := procstore.New()
	v := &procstore.View{S: s}
	want := make(map[string]string, n)
	for i := range n {
		k := "tb:k:" + strconv.Itoa(i)
		want[k] = "v" + strconv.Itoa(i)
		if err := v.Set(k, []byte(want[k]), 0); err != nil {
			t.Fatal(err)
		}
		if i%3 == 0 { // a second write of an existing key adds nothing
			if err := v.Set(k, []byte(want[k]), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := s.Len(); got != n {
		t.Fatalf("Len = %d, want %d", got, n)
	}
	for k, w := range want {
		got, cas, err := v.Get(k)
		if err != nil || string(got) != w {
			t.Fatalf("%s: got %q, %v; want %q", k, got, err, w)
		}
		if err := v.Set(k, []byte(w+"!"), cas+1); !errors.Is(err, sharedstate.ErrCASMismatch) {
			t.Fatalf("%s: set with a wrong cas: %v, want ErrCASMismatch", k, err)
		}
		if err := v.Set(k, []byte(w+"!"), cas); err != nil {
			t.Fatalf("%s: set with the current cas: %v", k, err)
		}
	}
	for i := range 1000 {
		k := "tb:missing:" + strconv.Itoa(i)
		if _, _, err := v.Get(k); !errors.Is(err, sharedstate.ErrNotFound) {
			t.Fatalf("%s: err %v, want ErrNotFound", k, err)
		}
		if _, _, err := s.GetInto(nil, k); !errors.Is(err, sharedstate.ErrNotFound) {
			t.Fatalf("GetInto %s: err %v, want ErrNotFound", k, err)
		}
	}
	for k, w := range want {
		if got, _, err := s.GetInto(nil, k); err != nil || string(got) != w+"!" {
			t.Fatalf("GetInto %s: got %q, %v; want %q", k, got, err, w+"!")
		}
	}
}

// TestConcurrentGrowth: workers creating their own keys while others read
// and write theirs (every table growing meanwhile) lose no key and no
// write, under -race.
func TestConcurrentGrowth(t *testing.T) {
	const (
		workers = 4
		keys    = 3000
	)
	s := procstore.New()
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := &procstore.View{S: s}
			for i := range keys {
				k := "tb:" + strconv.Itoa(g) + ":" + strconv.Itoa(i)
				if err := v.Set(k, []byte(k), sharedstate.SeedCAS); err != nil {
					t.Error(err)
					return
				}
				// Re-read and rewrite an earlier key of this worker.
				e := "tb:" + strconv.Itoa(g) + ":" + strconv.Itoa(i/2)
				b, cas, err := v.Get(e)
				if err != nil {
					t.Error(err)
					return
				}
				if err := v.Set(e, append(b[:len(e)], '+'), cas); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got := s.Len(); got != workers*keys {
		t.Fatalf("Len = %d, want %d", got, workers*keys)
	}
	v := &procstore.View{S: s}
	for g := range workers {
		for i := range keys {
			k := "tb:" + strconv.Itoa(g) + ":" + strconv.Itoa(i)
			want := k // the first half were rewritten (twice: i/2)
			if i < keys/2 {
				want += "+"
			}
			if got, _, err := v.Get(k); err != nil || string(got) != want {
				t.Fatalf("%s: got %q, %v; want %q", k, got, err, want)
			}
		}
	}
}

// TestViewGetRemembered: a Get of the key the view's last Get found reads
// that entry as it is now (writes through other views included), and a
// Get of another key, however alike, or of a missing one, is looked up.
func TestViewGetRemembered(t *testing.T) {
	s := procstore.New()
	v, other := &procstore.View{S: s}, &procstore.View{S: s}
	_ = other.Set("tb:r:slot:10", []byte("a1"), 0)
	_ = other.Set("tb:r:slot:11", []byte("b1"), 0)
	get := func(key, want string) uint32 {
		t.Helper()
		got, cas, err := v.Get(key)
		if err != nil || string(got) != want {
			t.Fatalf("Get(%s) = %q, %v; want %q", key, got, err, want)
		}
		return cas
	}
	cas := get("tb:r:slot:10", "a1")
	if err := other.Set("tb:r:slot:10", []byte("a2"), cas); err != nil {
		t.Fatal(err)
	}
	cas2 := get("tb:r:slot:10", "a2") // remembered: sees the other view's write
	if cas2 == cas {
		t.Fatalf("cas unchanged (%d) after another view's write", cas)
	}
	get("tb:r:slot:11", "b1") // same length, one byte apart
	get("tb:r:slot:10", "a2")
	if _, _, err := v.Get("tb:r:slot:1"); err != sharedstate.ErrNotFound { // a prefix
		t.Fatalf("Get of a missing prefix: %v, want ErrNotFound", err)
	}
	if _, _, err := v.Get("tb:r:slot:100"); err != sharedstate.ErrNotFound { // an extension
		t.Fatalf("Get of a missing extension: %v, want ErrNotFound", err)
	}
	get("tb:r:slot:10", "a2")
	// Through the remembered entry, a stale cas still fails.
	if err := v.Set("tb:r:slot:10", []byte("x"), cas); err != sharedstate.ErrCASMismatch {
		t.Fatalf("stale cas: %v, want ErrCASMismatch", err)
	}
	if err := v.Set("tb:r:slot:10", []byte("a3"), cas2); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := other.Get("tb:r:slot:10"); string(got) != "a3" {
		t.Fatalf("other view reads %q, want a3", got)
	}
}

// BenchmarkViewGetSet: a get and a compare-and-swap set of one key again
// and again (the view's remembered entry), and of 1,000 keys in turn (a
// look-up each time).
func BenchmarkViewGetSet(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(strconv.Itoa(n)+"-keys", func(b *testing.B) {
			v := &procstore.View{S: procstore.New()}
			keys := make([]string, n)
			for i := range keys {
				keys[i] = "tb:per-ip:slot:" + strconv.Itoa(1000000+i*7919)
				_ = v.Set(keys[i], []byte("\xff0123456789abcdef10.0.0.1"), 0)
			}
			i := 0
			for b.Loop() {
				k := keys[i%n]
				i++
				val, cas, err := v.Get(k)
				if err != nil {
					b.Fatal(err)
				}
				if err := v.Set(k, val, cas); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
