package sharedstate

import (
	"bytes"
	"errors"
	"math"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/tokengate/tokengate/bucket"
)

// forEachSemantics runs fn against a fresh MemStore of each host's semantics,
// so that every behaviour is checked on Envoy and on Kong.
func forEachSemantics(t *testing.T, fn func(t *testing.T, m *MemStore)) {
	t.Helper()
	for _, sem := range []Semantics{Envoy, Kong} {
		t.Run(sem.String(), func(t *testing.T) { fn(t, NewMemStore(sem)) })
	}
}

// stored returns the value stored under key, or "<missing>".
func stored(t *testing.T, s Store, key string) string {
	t.Helper()
	v, _, err := s.Get(key)
	if errors.Is(err, ErrNotFound) {
		return "<missing>"
	}
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return string(v)
}

// put writes value under key whatever is there, on either semantics.
func put(t *testing.T, s Store, key, value string) {
	t.Helper()
	_, cas, err := s.Get(key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if err := s.Set(key, []byte(value), cas); err != nil {
		t.Fatalf("put %q: %v", key, err)
	}
}

// enc is the stored form of tokens at last.
func enc(tokens, last float64) string {
	return string(AppendState(nil, bucket.State{Tokens: tokens, Last: last}))
}

// hookStore wraps a Store with hooks run after Get and before Set.
type hookStore struct {
	Store
	afterGet  func(key string, err error)
	beforeSet func(key string, value []byte, cas uint32) error
}

func (h *hookStore) Get(key string) ([]byte, uint32, error) {
	v, cas, err := h.Store.Get(key)
	if h.afterGet != nil {
		h.afterGet(key, err)
	}
	return v, cas, err
}

func (h *hookStore) Set(key string, value []byte, cas uint32) error {
	if h.beforeSet != nil {
		if err := h.beforeSet(key, value, cas); err != nil {
			return err
		}
	}
	return h.Store.Set(key, value, cas)
}

// take is TakeAll with a fresh results slice.
func take(u *Updater, now float64, reqs ...Request) Outcome {
	return u.TakeAll(reqs, now, make([]bucket.Result, len(reqs)))
}

func TestTakeAllSeedsFull(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		out := take(u, t0+0.0000004, Request{Key: "tb:r:a", Limit: bucket.Limit{Rate: 1, Burst: 5}, Cost: 1})
		if out.Err != nil || !out.Allowed || out.Rejected != -1 || out.Attempts != 1 || out.Corrupt != 0 {
			t.Fatalf("got %+v, want allowed after 1 attempt", out)
		}
		if want := (bucket.Result{Allowed: true, Tokens: 4}); noFull(out.Results[0]) != want {
			t.Errorf("got result %+v, want %+v", out.Results[0], want)
		}
		// Kong refuses the SeedCAS create, then takes cas 0: one mismatch.
		if want := map[Semantics]int{Envoy: 0, Kong: 1}[m.Semantics()]; out.CASRetries != want {
			t.Errorf("got %d CAS retries, want %d", out.CASRetries, want)
		}
		if got, want := stored(t, m, "tb:r:a"), "4.000000:1736940000.000000"; got != want {
			t.Errorf("got stored %q, want %q", got, want)
		}
	})
}

// TestTakeAllSteps walks one bucket through a burst and its refill; a
// rejection writes nothing.
func TestTakeAllSteps(t *testing.T) {
	steps := []struct {
		now    float64
		cost   float64
		result bucket.Result
		stored string
	}{
		{t0, 1, bucket.Result{Allowed: true, Tokens: 2}, enc(2, t0)},
		{t0, 1, bucket.Result{Allowed: true, Tokens: 1}, enc(1, t0)},
		{t0, 1, bucket.Result{Allowed: true, Tokens: 0}, enc(0, t0)},
		{t0, 1, bucket.Result{Tokens: 0, RetryAfter: 0.5}, enc(0, t0)},
		{t0 + 0.25, 1, bucket.Result{Tokens: 0.5, RetryAfter: 0.25}, enc(0, t0)},
		{t0 + 0.5, 1, bucket.Result{Allowed: true, Tokens: 0}, enc(0, t0+0.5)},
		{t0 + 0.5, 4, bucket.Result{Tokens: 0, RetryAfter: math.Inf(1)}, enc(0, t0+0.5)},
		{t0 + 100, 0.5, bucket.Result{Allowed: true, Tokens: 2.5}, enc(2.5, t0+100)},
		{t0 + 99.5, 2.5, bucket.Result{Allowed: true, Tokens: 0}, enc(0, t0+100)}, // skew: last kept
	}
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		lim := bucket.Limit{Rate: 2, Burst: 3}
		for i, st := range steps {
			out := take(u, st.now, Request{Key: "k", Limit: lim, Cost: st.cost})
			if out.Err != nil {
				t.Fatalf("step %d: got error %v", i, out.Err)
			}
			if out.Allowed != st.result.Allowed || noFull(out.Results[0]) != st.result {
				t.Errorf("step %d: got %v %+v, want %+v", i, out.Allowed, out.Results[0], st.result)
			}
			if wantRej := map[bool]int{true: -1, false: 0}[st.result.Allowed]; out.Rejected != wantRej {
				t.Errorf("step %d: got rejected %d, want %d", i, out.Rejected, wantRej)
			}
			if got := stored(t, m, "k"); got != st.stored {
				t.Errorf("step %d: got stored %q, want %q", i, got, st.stored)
			}
		}
	})
}

func TestTakeAllAllOrNothing(t *testing.T) {
	wide := bucket.Limit{Rate: 1, Burst: 10}
	narrow := bucket.Limit{Rate: 1, Burst: 1}
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		reqs := []Request{{Key: "tb:wide:a", Limit: wide, Cost: 1}, {Key: "tb:narrow:a", Limit: narrow, Cost: 1}}
		if out := take(u, t0, reqs...); !out.Allowed {
			t.Fatalf("first: got %+v, want allowed", out)
		}
		before := m.Snapshot("")
		out := take(u, t0+0.5, reqs...)
		if out.Allowed || out.Rejected != 1 || out.Err != nil {
			t.Fatalf("second: got %+v, want rejected by request 1", out)
		}
		// The wide bucket had enough but nothing was taken: its result
		// shows the refilled, untouched count.
		if want := (bucket.Result{Allowed: true, Tokens: 9.5}); noFull(out.Results[0]) != want {
			t.Errorf("got result 0 %+v, want %+v", out.Results[0], want)
		}
		if want := (bucket.Result{Tokens: 0.5, RetryAfter: 0.5}); noFull(out.Results[1]) != want {
			t.Errorf("got result 1 %+v, want %+v", out.Results[1], want)
		}
		after := m.Snapshot("")
		if len(after) != len(before) {
			t.Fatalf("got %d keys, want %d", len(after), len(before))
		}
		for i := range before {
			if after[i] != before[i] {
				t.Errorf("got %+v, want it unchanged: %+v", after[i], before[i])
			}
		}
		// The first request rejecting also leaves the second untouched.
		out = take(u, t0+0.5, Request{Key: "tb:narrow:a", Limit: narrow, Cost: 1}, Request{Key: "tb:wide:a", Limit: wide, Cost: 1})
		if out.Allowed || out.Rejected != 0 || stored(t, m, "tb:wide:a") != enc(9, t0) {
			t.Errorf("got %+v and wide %q, want rejected by request 0 and wide unchanged", out, stored(t, m, "tb:wide:a"))
		}
	})
}

func TestTakeAllCASRetry(t *testing.T) {
	lim := bucket.Limit{Rate: 2, Burst: 10}
	for _, mismatches := range []int{1, 2, 3} {
		t.Run("first sets mismatch "+string(rune('0'+mismatches)), func(t *testing.T) {
			forEachSemantics(t, func(t *testing.T, m *MemStore) {
				put(t, m, "a", enc(6, t0))
				put(t, m, "b", enc(6, t0))
				n := 0
				h := &hookStore{Store: m, beforeSet: func(key string, _ []byte, _ uint32) error {
					if key == "b" && n < mismatches {
						n++
						return ErrCASMismatch
					}
					return nil
				}}
				u := &Updater{Store: h}
				out := take(u, t0+0.5, Request{Key: "a", Limit: lim, Cost: 1}, Request{Key: "b", Limit: lim, Cost: 2})
				if !out.Allowed || out.Err != nil || out.Attempts != mismatches+1 || out.CASRetries != mismatches {
					t.Fatalf("got %+v, want allowed after %d attempts with %d CAS retries", out, mismatches+1, mismatches)
				}
				// "a" was written, refunded and written again each time:
				// taken exactly once.
				if got, want := stored(t, m, "a"), enc(6, t0+0.5); got != want {
					t.Errorf("got a %q, want %q", got, want)
				}
				if got, want := stored(t, m, "b"), enc(5, t0+0.5); got != want {
					t.Errorf("got b %q, want %q", got, want)
				}
			})
		})
	}
	t.Run("competitor writes between get and set", func(t *testing.T) {
		forEachSemantics(t, func(t *testing.T, m *MemStore) {
			lim := bucket.Limit{Rate: 1, Burst: 3}
			put(t, m, "k", enc(3, t0))
			competitor := &Updater{Store: m}
			raced := false
			h := &hookStore{Store: m, afterGet: func(string, error) {
				if !raced {
					raced = true
					if out := take(competitor, t0, Request{Key: "k", Limit: lim, Cost: 2}); !out.Allowed {
						t.Errorf("competitor: got %+v, want allowed", out)
					}
				}
			}}
			u := &Updater{Store: h}
			out := take(u, t0, Request{Key: "k", Limit: lim, Cost: 1})
			if !out.Allowed || out.Attempts != 2 || out.CASRetries != 1 || out.Results[0].Tokens != 0 {
				t.Fatalf("got %+v, want allowed on attempt 2 with 0 tokens left", out)
			}
			if out := take(u, t0, Request{Key: "k", Limit: lim, Cost: 1}); out.Allowed {
				t.Errorf("got %+v, want rejected: competitor and we took the whole burst", out)
			}
		})
	})
}

func TestTakeAllContention(t *testing.T) {
	lim := bucket.Limit{Rate: 2, Burst: 10}
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		put(t, m, "a", enc(5, t0))
		put(t, m, "b", enc(5, t0))
		h := &hookStore{Store: m, beforeSet: func(key string, _ []byte, _ uint32) error {
			if key == "b" {
				return ErrCASMismatch
			}
			return nil
		}}
		u := &Updater{Store: h, MaxAttempts: 4}
		out := take(u, t0+0.25, Request{Key: "a", Limit: lim, Cost: 1}, Request{Key: "b", Limit: lim, Cost: 1})
		if !errors.Is(out.Err, ErrContention) || out.Allowed || out.Attempts != 4 || out.CASRetries != 4 {
			t.Fatalf("got %+v, want ErrContention after 4 attempts and 4 CAS retries", out)
		}
		// "a" was taken from and refunded four times: it holds what a
		// refill alone gives.
		if got, want := stored(t, m, "a"), enc(5.5, t0+0.25); got != want {
			t.Errorf("got a %q, want %q", got, want)
		}
		if got, want := stored(t, m, "b"), enc(5, t0); got != want {
			t.Errorf("got b %q, want %q", got, want)
		}
	})
}

func TestTakeAllFaults(t *testing.T) {
	boom := errors.New("boom")
	lim := bucket.Limit{Rate: 2, Burst: 10}
	reqs := []Request{{Key: "a", Limit: lim, Cost: 1}, {Key: "b", Limit: lim, Cost: 1}}
	tests := []struct {
		name        string
		getErr      func(key string) error
		setErr      func(key string, value []byte, cas uint32) error
		expectedErr error
		expectedA   string // stored after
		expectedB   string
	}{
		{
			name:        "get error writes nothing",
			getErr:      func(key string) error { return map[bool]error{true: boom}[key == "b"] },
			expectedErr: boom,
			expectedA:   enc(5, t0), expectedB: enc(5, t0),
		},
		{
			name:        "set error on second bucket refunds the first",
			setErr:      func(key string, _ []byte, _ uint32) error { return map[bool]error{true: boom}[key == "b"] },
			expectedErr: boom,
			expectedA:   enc(5.5, t0+0.25), expectedB: enc(5, t0),
		},
		{
			name:        "set error on first bucket",
			setErr:      func(key string, _ []byte, _ uint32) error { return map[bool]error{true: boom}[key == "a"] },
			expectedErr: boom,
			expectedA:   enc(5, t0), expectedB: enc(5, t0),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachSemantics(t, func(t *testing.T, m *MemStore) {
				put(t, m, "a", enc(5, t0))
				put(t, m, "b", enc(5, t0))
				u := &Updater{Store: &FaultStore{Store: m, GetErr: tt.getErr, SetErr: tt.setErr}}
				out := take(u, t0+0.25, reqs...)
				if !errors.Is(out.Err, tt.expectedErr) || out.Allowed || out.Rejected != -1 {
					t.Fatalf("got %+v, want error %v", out, tt.expectedErr)
				}
				if got := stored(t, m, "a"); got != tt.expectedA {
					t.Errorf("got a %q, want %q", got, tt.expectedA)
				}
				if got := stored(t, m, "b"); got != tt.expectedB {
					t.Errorf("got b %q, want %q", got, tt.expectedB)
				}
			})
		})
	}
	t.Run("set error while seeding", func(t *testing.T) {
		forEachSemantics(t, func(t *testing.T, m *MemStore) {
			u := &Updater{Store: &FaultStore{Store: m, SetErr: func(string, []byte, uint32) error { return boom }}}
			if out := take(u, t0, reqs[0]); !errors.Is(out.Err, boom) || m.Len() != 0 {
				t.Errorf("got %+v and %d keys, want error %v and nothing written", out, m.Len(), boom)
			}
		})
	})
	t.Run("failed refund never over-admits", func(t *testing.T) {
		forEachSemantics(t, func(t *testing.T, m *MemStore) {
			put(t, m, "a", enc(5, t0))
			put(t, m, "b", enc(5, t0))
			gets := 0
			u := &Updater{Store: &FaultStore{
				Store: m,
				GetErr: func(key string) error {
					if gets++; gets > 2 { // the refund's read of "a"
						return boom
					}
					return nil
				},
				SetErr: func(key string, _ []byte, _ uint32) error { return map[bool]error{true: ErrCASMismatch}[key == "b"] },
			}}
			out := take(u, t0, reqs...)
			if !errors.Is(out.Err, boom) || out.Allowed {
				t.Fatalf("got %+v, want error %v", out, boom)
			}
			if got, want := stored(t, m, "a"), enc(4, t0); got != want {
				t.Errorf("got a %q, want %q (the token stays taken)", got, want)
			}
		})
	})
}

func TestTakeAllCorrupt(t *testing.T) {
	lim := bucket.Limit{Rate: 1, Burst: 5}
	tests := []struct {
		name    string
		input   string
		corrupt int
	}{
		{"empty", "", 1},
		{"garbage", "abc", 1},
		{"NaN tokens", "NaN:1", 1},
		{"minus sign alone", "-:1", 1},
		{"far future", "1:9999999999999", 1},
		{"just beyond MaxFuture", enc(1, t0+86400.5), 1},
		{"within MaxFuture is clock skew", enc(1, t0+60), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			forEachSemantics(t, func(t *testing.T, m *MemStore) {
				t.Run("allowed", func(t *testing.T) {
					put(t, m, "k", tt.input)
					out := take(&Updater{Store: m}, t0, Request{Key: "k", Limit: lim, Cost: 1})
					want := map[int]float64{1: 4, 0: 0}[tt.corrupt] // full, or the stored 1 token
					if !out.Allowed || out.Corrupt != tt.corrupt || out.Results[0].Tokens != want {
						t.Fatalf("got %+v, want allowed with %v tokens and %d corrupt", out, want, tt.corrupt)
					}
					if got := stored(t, m, "k"); got != enc(want, t0) {
						t.Errorf("got stored %q, want %q", got, enc(want, t0))
					}
				})
				if tt.corrupt == 0 {
					return
				}
				t.Run("rejected still repairs", func(t *testing.T) {
					put(t, m, "k", tt.input)
					out := take(&Updater{Store: m}, t0, Request{Key: "k", Limit: lim, Cost: 6})
					if out.Allowed || out.Rejected != 0 || out.Corrupt != 1 {
						t.Fatalf("got %+v, want rejected with 1 corrupt", out)
					}
					if got := stored(t, m, "k"); got != enc(5, t0) {
						t.Errorf("got stored %q, want %q", got, enc(5, t0))
					}
				})
			})
		})
	}
}

// TestTakeAllSeedingRace lets a competitor create and drain a key while we
// are between seeing it missing and seeding it, at each NOT_FOUND we see.
func TestTakeAllSeedingRace(t *testing.T) {
	lim := bucket.Limit{Rate: 1, Burst: 2}
	for _, at := range []int{1, 2} {
		t.Run("after not-found "+string(rune('0'+at)), func(t *testing.T) {
			forEachSemantics(t, func(t *testing.T, m *MemStore) {
				competitor := &Updater{Store: m}
				admitted, notFound := 0, 0
				h := &hookStore{Store: m, afterGet: func(_ string, err error) {
					if errors.Is(err, ErrNotFound) {
						if notFound++; notFound == at {
							for range 3 {
								if take(competitor, t0, Request{Key: "k", Limit: lim, Cost: 1}).Allowed {
									admitted++
								}
							}
						}
					}
				}}
				out := take(&Updater{Store: h}, t0, Request{Key: "k", Limit: lim, Cost: 1})
				if out.Err != nil {
					t.Fatalf("got error %v", out.Err)
				}
				if out.Allowed {
					admitted++
				}
				if admitted > 2 {
					t.Errorf("got %d admitted, want at most the burst of 2", admitted)
				}
				if got := stored(t, m, "k"); got != enc(2-float64(admitted), t0) {
					t.Errorf("got stored %q after %d admitted", got, admitted)
				}
			})
		})
	}
}

// TestSeedWithCASZeroClobbersOnEnvoy pins why SeedCAS exists: on Envoy a
// cas-0 seed overwrites a bucket another worker has just consumed from.
func TestSeedWithCASZeroClobbersOnEnvoy(t *testing.T) {
	m := NewMemStore(Envoy)
	put(t, m, "k", enc(0, t0)) // another worker's consumption
	if err := m.Set("k", []byte(enc(5, t0)), 0); err != nil || stored(t, m, "k") != enc(5, t0) {
		t.Fatalf("got %v, want cas 0 to overwrite on Envoy", err)
	}
	put(t, m, "k", enc(0, t0))
	if err := m.Set("k", []byte(enc(5, t0)), SeedCAS); !errors.Is(err, ErrCASMismatch) {
		t.Errorf("got %v, want SeedCAS to be refused on an existing key", err)
	}
}

func TestTakeAllInputs(t *testing.T) {
	lim := bucket.Limit{Rate: 1, Burst: 5}
	tests := []struct {
		name        string
		now         float64
		reqs        []Request
		res         []bucket.Result
		expectedErr error
		allowed     bool
	}{
		{name: "NaN now", now: math.NaN(), reqs: []Request{{Key: "k", Limit: lim, Cost: 1}}, expectedErr: errBadNow},
		{name: "infinite now", now: math.Inf(1), reqs: []Request{{Key: "k", Limit: lim, Cost: 1}}, expectedErr: errBadNow},
		{name: "zero now", now: 0, reqs: []Request{{Key: "k", Limit: lim, Cost: 1}}, expectedErr: errBadNow},
		{name: "sub-microsecond now", now: 1e-7, reqs: []Request{{Key: "k", Limit: lim, Cost: 1}}, expectedErr: errBadNow},
		{name: "duplicate key", now: t0, reqs: []Request{{Key: "k", Limit: lim, Cost: 1}, {Key: "j", Limit: lim}, {Key: "k", Limit: lim, Cost: 1}}, expectedErr: errDuplicateKey},
		{name: "no requests", now: t0, allowed: true},
		{name: "short results slice", now: t0, reqs: []Request{{Key: "k", Limit: lim, Cost: 1}, {Key: "j", Limit: lim}}, res: make([]bucket.Result, 1), allowed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := NewMemStore(Envoy)
			out := (&Updater{Store: m}).TakeAll(tt.reqs, tt.now, tt.res)
			if !errors.Is(out.Err, tt.expectedErr) || out.Allowed != tt.allowed || len(out.Results) != len(tt.reqs) {
				t.Fatalf("got %+v, want error %v and allowed %v", out, tt.expectedErr, tt.allowed)
			}
			if tt.expectedErr != nil && m.Len() != 0 {
				t.Errorf("got %d keys written, want 0", m.Len())
			}
		})
	}
}

// noCopyStore is a single-goroutine Store whose Get does not allocate, to
// measure TakeAll's own allocations.
type noCopyStore struct {
	data map[string]*entry
	cas  uint32
}

func (s *noCopyStore) Get(key string) ([]byte, uint32, error) {
	e, ok := s.data[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return e.value, e.cas, nil
}

func (s *noCopyStore) Set(key string, value []byte, cas uint32) error {
	e, ok := s.data[key]
	if !ok {
		e = &entry{}
		s.data[key] = e
	} else if cas != 0 && cas != e.cas {
		return ErrCASMismatch
	}
	s.cas++
	e.value, e.cas = append(e.value[:0], value...), s.cas
	return nil
}

func TestTakeAllAllocs(t *testing.T) {
	s := &noCopyStore{data: make(map[string]*entry)}
	u := &Updater{Store: s}
	lim := bucket.Limit{Rate: 1e6, Burst: 1e6}
	reqs := []Request{{Key: "tb:a:x", Limit: lim, Cost: 1}, {Key: "tb:b:y", Limit: lim, Cost: 1}, {Key: "tb:c:z", Limit: lim, Cost: 1}}
	res := make([]bucket.Result, len(reqs))
	now := t0
	u.TakeAll(reqs, now, res) // seed the keys and size the buffers
	n := testing.AllocsPerRun(1000, func() {
		now += 1e-3
		if out := u.TakeAll(reqs, now, res); !out.Allowed {
			t.Fatalf("got %+v, want allowed", out)
		}
	})
	if n != 0 {
		t.Errorf("got %v allocations per TakeAll, want 0", n)
	}
}

// BenchmarkTakeAll measures one-bucket updates against MemStore(Envoy),
// whose Get copies the value (one allocation, the store's cost): serially,
// and from 8 goroutines on one hot key and spread over 10,000 keys.
func BenchmarkTakeAll(b *testing.B) {
	lim := bucket.Limit{Rate: 1e9, Burst: 1e9} // always allowed: every call writes
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = string(AppendKey(nil, false, "bench", []string{strconv.Itoa(i)}))
	}
	b.Run("serial", func(b *testing.B) {
		u := &Updater{Store: NewMemStore(Envoy)}
		reqs := []Request{{Key: keys[0], Limit: lim, Cost: 1}}
		res := make([]bucket.Result, 1)
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now += 1e-6
			u.TakeAll(reqs, now, res)
		}
	})
	b.Run("serial-3-buckets", func(b *testing.B) {
		u := &Updater{Store: NewMemStore(Envoy)}
		reqs := []Request{{Key: keys[0], Limit: lim, Cost: 1}, {Key: keys[1], Limit: lim, Cost: 1}, {Key: keys[2], Limit: lim, Cost: 1}}
		res := make([]bucket.Result, 3)
		now := t0
		b.ReportAllocs()
		for b.Loop() {
			now += 1e-6
			u.TakeAll(reqs, now, res)
		}
	})
	parallel := func(b *testing.B, nkeys int, backoff bool) {
		m := NewMemStore(Envoy)
		var clock, ids, retries, failed atomic.Int64
		b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			u := &Updater{Store: m}
			i := int(ids.Add(1)) * 7919
			if backoff {
				u.Backoff = SpinBackoff(uint64(i))
			}
			reqs := []Request{{Limit: lim, Cost: 1}}
			res := make([]bucket.Result, 1)
			for pb.Next() {
				reqs[0].Key = keys[i%nkeys]
				i++
				out := u.TakeAll(reqs, t0+float64(clock.Add(1))/1e6, res)
				retries.Add(int64(out.CASRetries))
				if out.Err != nil {
					failed.Add(1)
				}
			}
		})
		b.ReportMetric(float64(retries.Load())/float64(b.N), "casretries/op")
		b.ReportMetric(float64(failed.Load())/float64(b.N), "failopen/op")
	}
	b.Run("parallel-8-one-key", func(b *testing.B) { parallel(b, 1, false) })
	b.Run("parallel-8-one-key-spin-backoff", func(b *testing.B) { parallel(b, 1, true) })
	b.Run("parallel-8-10000-keys", func(b *testing.B) { parallel(b, len(keys), false) })
}

// TestEmptyBucketStuckAfterClockStepBack pins a bug: after the clock stepped
// back by more than bucket.MaxClockSkew, an empty bucket was re-anchored
// only in memory; rejections wrote nothing, so it stayed empty until the
// clock caught up with the stored last_refill.
func TestEmptyBucketStuckAfterClockStepBack(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		r := Request{Key: "tb:r:", Limit: bucket.Limit{Rate: 1, Burst: 1}, Cost: 1}
		put(t, m, r.Key, enc(0, t0+43200)) // written before the clock went back 12 h
		if out := take(u, t0, r); out.Allowed {
			t.Fatal("empty bucket allowed")
		}
		if got, want := stored(t, m, r.Key), enc(0, t0); got != want {
			t.Fatalf("after the rejection: stored %q, want it re-anchored at now: %q", got, want)
		}
		if out := take(u, t0+1, r); !out.Allowed {
			t.Fatalf("one second later at 1 token/s: got %+v, want allowed", out)
		}
	})
}

// TestRefundAfterTakeAll: Refund gives back what an allowed TakeAll took,
// from the keys it stored (the second slot for an identity that landed
// there), and refuses requests TakeAll never stored.
func TestRefundAfterTakeAll(t *testing.T) {
	forEachSemantics(t, func(t *testing.T, m *MemStore) {
		u := &Updater{Store: m}
		lim := bucket.Limit{Rate: 1, Burst: 5}
		// Another identity holds slot a, live; "me" lands in slot b.
		if err := m.Set("tb:s:a", AppendSlotValue(nil, bucket.State{Tokens: 1, Last: t0}, "other"), 0); err != nil {
			t.Fatal(err)
		}
		reqs := []Request{
			{Key: "tb:r:x", Limit: lim, Cost: 2},
			{Key: "tb:s:a", Alt: "tb:s:b", Slotted: true, Owner: "me", Limit: lim, Cost: 3},
		}
		if out := u.TakeAll(reqs, t0, nil); !out.Allowed || reqs[0].Stored != "tb:r:x" || reqs[1].Stored != "tb:s:b" {
			t.Fatalf("TakeAll: %+v, stored %q %q", out, reqs[0].Stored, reqs[1].Stored)
		}
		if _, err := u.Refund(reqs, t0); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]string{
			"tb:r:x": "5.000000:1736940000.000000",
			"tb:s:b": "5.000000:1736940000.000000:me",
			"tb:s:a": "1.000000:1736940000.000000:other",
		} {
			if got := stored(t, m, key); got != want {
				t.Errorf("%s: got %q, want %q", key, got, want)
			}
		}
		if _, err := u.Refund([]Request{{Key: "tb:r:y", Limit: lim, Cost: 1}}, t0); err == nil {
			t.Error("Refund of an unstored request succeeded")
		}
	})
}

// noFull drops Result.FullIn, which bucket's tests check, from a comparison.
func noFull(r bucket.Result) bucket.Result {
	r.FullIn = 0
	return r
}

// TestTakeAllCollisionAllocs: identities whose two candidate slots hold
// live buckets of others evict one of them; that must not allocate. (It
// once shared the slot and copied its owner on every request; since issue
// 22 a collision evicts, and three identities in two slots take turns.)
func TestTakeAllCollisionAllocs(t *testing.T) {
	s := &noCopyStore{data: make(map[string]*entry)}
	u := &Updater{Store: s}
	lim := bucket.Limit{Rate: 1, Burst: 1e6}
	ids := []Request{slotReq("10.0.0.1", 2), slotReq("10.0.0.2", 2), slotReq("10.0.0.3", 2)}
	for i := range ids {
		ids[i].Limit = lim
	}
	now := t0
	for _, r := range []Request{ids[0], ids[0], ids[1]} { // both slots live, neither full
		if out := u.TakeAll([]Request{r}, now, nil); !out.Allowed {
			t.Fatalf("seeding %s: got %+v", r.Owner, out)
		}
	}
	res := make([]bucket.Result, 1)
	// outsider returns the identity that owns neither slot.
	tails := [][]byte{[]byte(":10.0.0.1"), []byte(":10.0.0.2"), []byte(":10.0.0.3")}
	outsider := func() int {
		for i := range ids {
			va, _, _ := s.Get(ids[i].Key)
			vb, _, _ := s.Get(ids[i].Alt)
			if !bytes.HasSuffix(va, tails[i]) && !bytes.HasSuffix(vb, tails[i]) {
				return i
			}
		}
		t.Fatal("every identity owns a slot")
		return 0
	}
	n := testing.AllocsPerRun(1000, func() {
		now += 1e-4 // refills far less than a token: never full
		reqs := ids[outsider():][:1]
		if out := u.TakeAll(reqs, now, res); !out.Allowed || !reqs[0].Collided {
			t.Fatalf("%s: got %+v (collided %v), want allowed after evicting", reqs[0].Owner, out, reqs[0].Collided)
		}
	})
	if n != 0 {
		t.Errorf("got %v allocations per colliding TakeAll, want 0", n)
	}
}
