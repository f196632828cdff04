package wasmhost

import (
	"sync"
	"testing"
)

// TestSharedDataSemantics walks each host's documented CAS rules step by
// step (docs/proxy-wasm.md, "Shared data, host by host").
func TestSharedDataSemantics(t *testing.T) {
	type step struct {
		op       string // get, set, del, evict
		key      string
		value    string
		cas      uint32 // set and del: the cas passed
		expected Status
		// for get: the value and cas expected
		expectedValue string
		expectedCAS   uint32
	}
	tests := []struct {
		name  string
		kong  bool
		steps []step
	}{
		{
			name: "envoy",
			steps: []step{
				{op: "get", key: "a", expected: StatusNotFound},
				{op: "set", key: "a", value: "1", cas: 77, expected: StatusOK}, // missing key: created whatever the cas
				{op: "get", key: "a", expected: StatusOK, expectedValue: "1", expectedCAS: 1},
				{op: "set", key: "b", value: "x", cas: 0, expected: StatusOK}, // global counter: b gets 2
				{op: "get", key: "b", expected: StatusOK, expectedValue: "x", expectedCAS: 2},
				{op: "set", key: "a", value: "2", cas: 2, expected: StatusCASMismatch}, // b's cas is not a's
				{op: "set", key: "a", value: "2", cas: 1, expected: StatusOK},
				{op: "get", key: "a", expected: StatusOK, expectedValue: "2", expectedCAS: 3},
				{op: "set", key: "a", value: "3", cas: 1, expected: StatusCASMismatch}, // stale
				{op: "set", key: "a", value: "3", cas: 0, expected: StatusOK},          // cas 0: unconditional
				{op: "get", key: "a", expected: StatusOK, expectedValue: "3", expectedCAS: 4},
				{op: "set", key: "a", value: "", cas: 4, expected: StatusOK}, // an empty value is a value
				{op: "get", key: "a", expected: StatusOK, expectedValue: "", expectedCAS: 5},
			},
		},
		{
			name: "kong",
			kong: true,
			steps: []step{
				{op: "get", key: "a", expected: StatusNotFound},
				{op: "set", key: "a", value: "1", cas: 5, expected: StatusCASMismatch}, // missing key needs cas 0
				{op: "set", key: "a", value: "1", cas: 0, expected: StatusOK},
				{op: "get", key: "a", expected: StatusOK, expectedValue: "1", expectedCAS: 1},
				{op: "set", key: "a", value: "2", cas: 0, expected: StatusCASMismatch}, // cas 0: must be absent
				{op: "set", key: "b", value: "x", cas: 0, expected: StatusOK},
				{op: "get", key: "b", expected: StatusOK, expectedValue: "x", expectedCAS: 1}, // per key
				{op: "set", key: "a", value: "2", cas: 1, expected: StatusOK},
				{op: "get", key: "a", expected: StatusOK, expectedValue: "2", expectedCAS: 2},
				{op: "del", key: "a", cas: 1, expected: StatusCASMismatch},
				{op: "del", key: "a", cas: 2, expected: StatusOK},
				{op: "get", key: "a", expected: StatusNotFound},
				{op: "set", key: "a", value: "3", cas: 0, expected: StatusOK},
				{op: "get", key: "a", expected: StatusOK, expectedValue: "3", expectedCAS: 1}, // back to 1
				{op: "evict", key: "a"},
				{op: "get", key: "a", expected: StatusNotFound}, // a vanished bucket reads as missing
				{op: "set", key: "a", value: "4", cas: 1, expected: StatusCASMismatch},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewSharedData(tc.kong)
			for i, s := range tc.steps {
				switch s.op {
				case "get":
					v, cas, st := d.Get(s.key)
					if st != s.expected || st == StatusOK && (string(v) != s.expectedValue || cas != s.expectedCAS) {
						t.Fatalf("step %d: get(%q) = %q, cas %d, status %d; want %q, cas %d, status %d",
							i, s.key, v, cas, st, s.expectedValue, s.expectedCAS, s.expected)
					}
				case "set":
					if st := d.Set(s.key, []byte(s.value), s.cas); st != s.expected {
						t.Fatalf("step %d: set(%q, %q, %d) = %d, want %d", i, s.key, s.value, s.cas, st, s.expected)
					}
				case "del":
					if st := d.DeleteCAS(s.key, s.cas); st != s.expected {
						t.Fatalf("step %d: delete(%q, %d) = %d, want %d", i, s.key, s.cas, st, s.expected)
					}
				case "evict":
					d.Evict(s.key)
				}
			}
		})
	}
}

// TestSharedDataCopies checks that the store keeps neither the caller's key
// nor value bytes, and that Get returns a copy: Envoy copies both ways.
func TestSharedDataCopies(t *testing.T) {
	d := NewSharedData(false)
	key, val := []byte("key"), []byte("value")
	d.Set(string(key), val, 0)
	copy(val, "XXXXX")
	v, _, _ := d.Get("key")
	if string(v) != "value" {
		t.Fatalf("stored value changed with the caller's buffer: %q", v)
	}
	copy(v, "YYYYY")
	if v2, _, _ := d.Get("key"); string(v2) != "value" {
		t.Fatalf("Get returned the stored bytes, not a copy: %q", v2)
	}
	if d.Len() != 1 || d.Bytes() != len("key")+len("value") {
		t.Fatalf("Len %d Bytes %d", d.Len(), d.Bytes())
	}
}

// TestSharedDataHammer has many goroutines increment one counter through
// get → set-with-cas, as workers do: no update may be lost on either host.
func TestSharedDataHammer(t *testing.T) {
	for _, kong := range []bool{false, true} {
		d := NewSharedData(kong)
		const P, N = 8, 200
		var wg sync.WaitGroup
		for p := 0; p < P; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < N; {
					v, cas, st := d.Get("n")
					if st == StatusNotFound {
						v, cas = []byte{}, 0
					}
					next := append([]byte(nil), v...)
					next = append(next, 'x')
					if d.Set("n", next, cas) == StatusOK {
						n++
					}
				}
			}()
		}
		wg.Wait()
		// Envoy: a set with cas 0 on an existing key is unconditional, so the
		// first writers can overwrite each other; after the key exists every
		// update carries its cas. Kong refuses cas 0 on an existing key.
		v, _, _ := d.Get("n")
		if kong && len(v) != P*N {
			t.Errorf("kong: %d updates kept, want %d", len(v), P*N)
		}
		if !kong && (len(v) > P*N || len(v) < P*N-P) {
			t.Errorf("envoy: %d updates kept, want %d (less at most the first racing creates)", len(v), P*N)
		}
	}
}
