package sharedstate

import (
	"sort"
	"strings"
)

// Test-only parts of the package: what the tests need to look inside a
// MemStore and to inject faults. Other packages' tests use the
// sharedstatetest package instead.

// Delete removes key, as Kong's zone does when it evicts an entry. Envoy has
// no delete; tests use this to model eviction.
func (m *MemStore) Delete(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.data, key)
}

// Len returns the number of keys.
func (m *MemStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.data)
}

// Bytes returns the total size of all keys and values, a lower bound on the
// memory the store holds.
func (m *MemStore) Bytes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, e := range m.data {
		n += len(k) + len(e.value)
	}
	return n
}

// Entry is one key of a Snapshot.
type Entry struct {
	Key   string
	Value string
	CAS   uint32
}

// Snapshot returns every entry whose key has the given prefix, sorted by key.
func (m *MemStore) Snapshot(prefix string) []Entry {
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

// MaxKeyLen returns the longest key AppendKey can produce for rule with n
// values: the prefix, the rule, ':', and n values of at most MaxValueLen
// bytes with n-1 separators. For n >= 1 that is
// len(prefix) + len(rule) + n*(MaxValueLen+1).
func MaxKeyLen(shadow bool, rule string, n int) int {
	p := len(keyPrefix)
	if shadow {
		p = len(shadowKeyPrefix)
	}
	if n <= 0 {
		return p + len(rule) + 1
	}
	return p + len(rule) + n*(MaxValueLen+1)
}

// FaultStore wraps a Store and injects failures, for tests. A nil hook
// passes the call through. Hooks may be called concurrently.
type FaultStore struct {
	Store
	// GetErr, when it returns non-nil, makes Get fail with that error.
	GetErr func(key string) error
	// SetErr, when it returns non-nil, makes Set fail with that error
	// without writing.
	SetErr func(key string, value []byte, cas uint32) error
}

// Get implements Store.
func (f *FaultStore) Get(key string) ([]byte, uint32, error) {
	if f.GetErr != nil {
		if err := f.GetErr(key); err != nil {
			return nil, 0, err
		}
	}
	return f.Store.Get(key)
}

// Set implements Store.
func (f *FaultStore) Set(key string, value []byte, cas uint32) error {
	if f.SetErr != nil {
		if err := f.SetErr(key, value, cas); err != nil {
			return err
		}
	}
	return f.Store.Set(key, value, cas)
}
