// Package sharedstate keeps token-bucket state in a proxy-wasm host's shared
// data: the Store interface over proxy_get_shared_data/proxy_set_shared_data,
// the "tokens:last_refill" codec, composite keys, and the bounded
// get → compute → compare-and-swap loop that updates one or several buckets.
// See Updater for that algorithm: how missing keys are seeded safely on both
// Envoy and Kong, how corrupt values are repaired, and what happens when the
// store fails or the loop's bound is reached.
//
// Nothing in this package reads the clock; time is always an argument.
package sharedstate

import (
	"errors"
	"strings"
	"sync"
)

// Errors a Store returns. Any other error means the store failed and the
// caller fails open.
var (
	// ErrNotFound reports that the key does not exist (Status NOT_FOUND).
	ErrNotFound = errors.New("shared data: not found")
	// ErrCASMismatch reports that the compare-and-swap value was stale
	// (Status CAS_MISMATCH).
	ErrCASMismatch = errors.New("shared data: cas mismatch")
)

// Store is a host's shared-data key-value store.
//
// Get returns the value and its compare-and-swap (CAS) token, or ErrNotFound.
// The value may live in memory the host binding reuses (filter/abi returns
// it from an arena valid until the proxy-wasm callback returns): callers
// parse it at once and copy what they keep, as Updater does.
// Set writes value if cas is accepted by the host, or returns ErrCASMismatch.
// What cas 0 and a missing key mean differs between hosts; see Semantics.
//
// Neither may keep key or value after returning: the filter passes keys
// that are views of a buffer it reuses for the next request, and hosts copy
// both, as Envoy does.
type Store interface {
	Get(key string) (value []byte, cas uint32, err error)
	Set(key string, value []byte, cas uint32) error
}

// Semantics selects how a MemStore treats cas values, mirroring a real host.
type Semantics int

const (
	// Envoy is proxy-wasm-cpp-host: one global CAS counter (never 0);
	// Set with cas 0 writes unconditionally; a non-zero cas must equal the
	// key's current cas; a missing key is created whatever the cas.
	Envoy Semantics = iota
	// Kong is ngx_wasm_module's shm_kv: cas 0 means "the key must be absent"
	// and a non-zero cas must equal the key's current cas; so Set on a missing
	// key with a non-zero cas is a CAS mismatch. The cas is a counter per
	// key: 1 after the first write, +1 per write, and back to 1 when a
	// deleted or evicted key is written again.
	Kong
)

// String returns "envoy" or "kong".
func (s Semantics) String() string {
	if s == Kong {
		return "kong"
	}
	return "envoy"
}

type entry struct {
	value []byte
	cas   uint32
}

// MemStore is an in-memory Store with a real host's CAS semantics. It is safe
// for concurrent use, like the host store shared by Envoy's worker threads.
// The zero value is not usable; call NewMemStore.
type MemStore struct {
	sem Semantics

	mu      sync.Mutex
	nextCAS uint32
	data    map[string]*entry
}

// NewMemStore returns an empty store with the given semantics.
func NewMemStore(sem Semantics) *MemStore {
	return &MemStore{sem: sem, nextCAS: 1, data: make(map[string]*entry)}
}

// Semantics returns the CAS semantics the store was created with.
func (m *MemStore) Semantics() Semantics { return m.sem }

// Get implements Store. It returns a copy of the value, as Envoy does.
func (m *MemStore) Get(key string) ([]byte, uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.data[key]
	if !ok {
		return nil, 0, ErrNotFound
	}
	return append([]byte(nil), e.value...), e.cas, nil
}

// Set implements Store.
func (m *MemStore) Set(key string, value []byte, cas uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.data[key]
	var cur uint32
	if ok {
		cur = e.cas
	}
	switch m.sem {
	case Kong:
		if (!ok && cas != 0) || (ok && cas != cur) {
			return ErrCASMismatch
		}
	default:
		if ok && cas != 0 && cas != cur {
			return ErrCASMismatch
		}
	}
	next := cur + 1 // Kong: per key, from 1
	if m.sem != Kong {
		next = m.takeCAS()
	}
	if !ok {
		// Assigning to an existing key would store key again, and the
		// caller may reuse key's bytes: only a new key is stored, copied.
		e = &entry{}
		m.data[strings.Clone(key)] = e
	}
	e.value = append(e.value[:0], value...)
	e.cas = next
	return nil
}

// takeCAS returns the next value of the global CAS counter, skipping 0 as
// proxy-wasm-cpp-host does. m.mu must be held.
func (m *MemStore) takeCAS() uint32 {
	c := m.nextCAS
	m.nextCAS++
	if m.nextCAS == 0 {
		m.nextCAS = 1
	}
	return c
}
