package sharedstate

import (
	"errors"
	"testing"
)

func TestMemStoreCAS(t *testing.T) {
	tests := []struct {
		name string
		sem  Semantics
		// steps: set key with cas → expected error (nil or ErrCASMismatch), then the cas Get returns
		steps []struct {
			key     string
			cas     uint32
			wantErr error
			wantCAS uint32
		}
	}{
		{"envoy", Envoy, []struct {
			key     string
			cas     uint32
			wantErr error
			wantCAS uint32
		}{
			{"a", 7, nil, 1},            // a missing key is created whatever the cas
			{"b", 0, nil, 2},            // one global counter
			{"a", 2, ErrCASMismatch, 1}, // stale
			{"a", 1, nil, 3},            // current
			{"a", 0, nil, 4},            // cas 0 writes unconditionally
			{"b", 0xFFFFFFFF, ErrCASMismatch, 2},
		}},
		{"kong", Kong, []struct {
			key     string
			cas     uint32
			wantErr error
			wantCAS uint32
		}{
			{"a", 7, ErrCASMismatch, 0}, // a non-zero cas never creates
			{"a", 0, nil, 1},            // cas 0 creates an absent key
			{"b", 0, nil, 1},            // a counter per key
			{"a", 0, ErrCASMismatch, 1}, // cas 0 on an existing key
			{"a", 1, nil, 2},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMemStore(tc.sem)
			for i, s := range tc.steps {
				if err := m.Set(s.key, []byte("v"), s.cas); !errors.Is(err, s.wantErr) {
					t.Fatalf("step %d: Set(%q, cas %d): got %v, want %v", i, s.key, s.cas, err, s.wantErr)
				}
				_, cas, _ := m.Get(s.key)
				if cas != s.wantCAS {
					t.Fatalf("step %d: cas of %q: got %d, want %d", i, s.key, cas, s.wantCAS)
				}
			}
		})
	}
	// Kong: after an eviction the counter starts again (so a stale cas can
	// match again: ABA, as on the real zone).
	m := NewMemStore(Kong)
	m.Set("k", []byte("1"), 0)
	m.Set("k", []byte("2"), 1)
	m.Delete("k")
	if err := m.Set("k", []byte("3"), 0); err != nil {
		t.Fatal(err)
	}
	if _, cas, _ := m.Get("k"); cas != 1 {
		t.Errorf("cas after eviction: got %d, want 1", cas)
	}
}
