package wasmhost

import (
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// SharedData is what proxy_get_shared_data and proxy_set_shared_data act on:
// one store per process (per vm_id in Envoy), shared by every worker.
// Answers are ABI statuses, so a store can fail the way a real host does.
//
// The model is written from the hosts' documented behaviour (see
// NewSharedData), not from the filter's own sharedstate package: a mistake in
// the product's idea of a host must not be able to hide in the host that
// judges it.
type SharedData interface {
	// Get returns a copy of the value and its CAS token; StatusNotFound
	// when the key is absent.
	Get(key string) (value []byte, cas uint32, st Status)
	// Set writes value under the host's CAS rule; StatusCASMismatch when
	// cas is stale.
	Set(key string, value []byte, cas uint32) Status
}

// sharedDeleter is a SharedData that can delete a key under CAS, as Kong's
// proxy_set_shared_data does when the value pointer is NULL.
type sharedDeleter interface {
	DeleteCAS(key string, cas uint32) Status
}

// Entry is one key of a SharedData snapshot.
type Entry struct {
	Key, Value string
	CAS        uint32
}

// MemData is the host's in-memory shared data, with Envoy's or Kong's CAS
// semantics. It is safe for concurrent use by the workers.
type MemData struct {
	kong bool

	mu   sync.Mutex
	data map[string]*memEntry
	// casCounter is Envoy's one global CAS counter (proxy-wasm-cpp-host
	// shared_data.cc): every write takes the next value, 0 skipped.
	casCounter uint32
	bytes      int
}

type memEntry struct {
	value []byte
	cas   uint32
}

// NewSharedData returns an empty store with Envoy's semantics, or Kong's
// when kong is set.
//
// Envoy (proxy-wasm-cpp-host): a get of a missing key answers NOT_FOUND; a
// set with cas 0 writes unconditionally; a set with a non-zero cas on an
// existing key must carry that key's current cas or answers CAS_MISMATCH; a
// missing key is created whatever the cas. The cas is one process-wide
// counter, never 0. Nothing expires and nothing is deleted.
//
// Kong (ngx_wasm_module shm_kv): cas 0 means "the key must be absent"; a
// non-zero cas must equal the key's current cas, so a set with a non-zero cas
// on a missing key is a CAS_MISMATCH. The cas counts the writes of one key:
// 1 after its first write, back to 1 when a deleted or evicted key is written
// again. A NULL value deletes the key (cas must match).
func NewSharedData(kong bool) *MemData {
	return &MemData{kong: kong, data: map[string]*memEntry{}}
}

// Kong reports whether the store has Kong's semantics.
func (m *MemData) Kong() bool { return m.kong }

// Get implements SharedData.
func (m *MemData) Get(key string) ([]byte, uint32, Status) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.data[key]
	if !ok {
		return nil, 0, StatusNotFound
	}
	return append([]byte(nil), e.value...), e.cas, StatusOK
}

// Set implements SharedData.
func (m *MemData) Set(key string, value []byte, cas uint32) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, exists := m.data[key]
	if m.kong {
		if !exists && cas != 0 || exists && cas != e.cas {
			return StatusCASMismatch
		}
	} else if exists && cas != 0 && cas != e.cas {
		return StatusCASMismatch
	}
	if !exists {
		e = &memEntry{}
		m.data[strings.Clone(key)] = e
		m.bytes += len(key)
	}
	m.bytes += len(value) - len(e.value)
	e.value = append(e.value[:0], value...)
	if m.kong {
		e.cas++
	} else {
		m.casCounter++
		if m.casCounter == 0 {
			m.casCounter = 1
		}
		e.cas = m.casCounter
	}
	return StatusOK
}

// DeleteCAS deletes key if cas is its current cas (Kong's NULL-value set).
func (m *MemData) DeleteCAS(key string, cas uint32) Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.data[key]
	if !ok || e.cas != cas {
		return StatusCASMismatch
	}
	m.remove(key, e)
	return StatusOK
}

// Evict removes key whatever its cas, as Kong's LRU eviction does.
func (m *MemData) Evict(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.data[key]; ok {
		m.remove(key, e)
	}
}

func (m *MemData) remove(key string, e *memEntry) {
	m.bytes -= len(key) + len(e.value)
	delete(m.data, key)
}

// Len returns the number of keys.
func (m *MemData) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.data)
}

// Bytes returns the bytes of every key and value held.
func (m *MemData) Bytes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

// Snapshot returns the keys that start with prefix, sorted, with copies of
// their values.
func (m *MemData) Snapshot(prefix string) []Entry {
	m.mu.Lock()
	out := make([]Entry, 0, len(m.data))
	for k, e := range m.data {
		if strings.HasPrefix(k, prefix) {
			out = append(out, Entry{Key: k, Value: string(e.value), CAS: e.cas})
		}
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// FaultData wraps a SharedData so that a test can fail its calls: a hook
// that returns a status other than StatusOK answers that status without
// calling the wrapped store. Nil hooks pass through.
type FaultData struct {
	SharedData
	GetFault func(key string) Status
	SetFault func(key string, value []byte, cas uint32) Status
}

// Get implements SharedData.
func (f *FaultData) Get(key string) ([]byte, uint32, Status) {
	if f.GetFault != nil {
		if st := f.GetFault(key); st != StatusOK {
			return nil, 0, st
		}
	}
	return f.SharedData.Get(key)
}

// Set implements SharedData.
func (f *FaultData) Set(key string, value []byte, cas uint32) Status {
	if f.SetFault != nil {
		if st := f.SetFault(key, value, cas); st != StatusOK {
			return st
		}
	}
	return f.SharedData.Set(key, value, cas)
}

// CASStorm wraps s so that every set answers CAS_MISMATCH without writing,
// as if another worker always won the race; gets pass through. sets, if not
// nil, counts the set calls.
func CASStorm(s SharedData, sets *atomic.Int64) *FaultData {
	return &FaultData{SharedData: s, SetFault: func(string, []byte, uint32) Status {
		if sets != nil {
			sets.Add(1)
		}
		return StatusCASMismatch
	}}
}

// FailingData wraps s so that gets answer getSt and sets answer setSt
// (StatusOK passes that call through).
func FailingData(s SharedData, getSt, setSt Status) *FaultData {
	f := &FaultData{SharedData: s}
	if getSt != StatusOK {
		f.GetFault = func(string) Status { return getSt }
	}
	if setSt != StatusOK {
		f.SetFault = func(string, []byte, uint32) Status { return setSt }
	}
	return f
}

// Unwrap returns the MemData under any FaultData wrappers of s.
func Unwrap(s SharedData) (*MemData, bool) {
	for {
		switch v := s.(type) {
		case *MemData:
			return v, true
		case *FaultData:
			s = v.SharedData
		default:
			return nil, false
		}
	}
}
