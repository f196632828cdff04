// Package sharedstatetest holds test doubles for code that uses
// sharedstate: a Store that records its keys so tests can list them, a
// FaultStore, and Lookup, which finds an identity's bucket. Nothing here is
// linked into the module.
package sharedstatetest

import (
	"sort"
	"strings"
	"sync"

	"github.com/tokengate/tokengate/sharedstate"
)

// Store is a sharedstate.MemStore that remembers the keys written to it, so
// tests can list what the filter stored. Create it with New.
type Store struct {
	*sharedstate.MemStore

	mu   sync.Mutex
	keys map[string]struct{}
}

// New returns an empty Store with the given host semantics.
func New(sem sharedstate.Semantics) *Store {
	return &Store{MemStore: sharedstate.NewMemStore(sem), keys: map[string]struct{}{}}
}

// Set implements sharedstate.Store.
func (s *Store) Set(key string, value []byte, cas uint32) error {
	err := s.MemStore.Set(key, value, cas)
	if err == nil {
		s.mu.Lock()
		if _, ok := s.keys[key]; !ok {
			s.keys[strings.Clone(key)] = struct{}{}
		}
		s.mu.Unlock()
	}
	return err
}

// Entry is one key of a Snapshot.
type Entry struct {
	Key   string
	Value string
	CAS   uint32
}

// Snapshot returns every entry whose key has the given prefix, sorted by key.
func (s *Store) Snapshot(prefix string) []Entry {
	s.mu.Lock()
	keys := make([]string, 0, len(s.keys))
	for k := range s.keys {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	sort.Strings(keys)
	out := make([]Entry, 0, len(keys))
	for _, k := range keys {
		if v, cas, err := s.MemStore.Get(k); err == nil {
			out = append(out, Entry{Key: k, Value: string(v), CAS: cas})
		}
	}
	return out
}

// Len returns the number of keys.
func (s *Store) Len() int { return len(s.Snapshot("")) }

// Bytes returns the total size of all keys and values, a lower bound on the
// memory the store holds.
func (s *Store) Bytes() int {
	n := 0
	for _, e := range s.Snapshot("") {
		n += len(e.Key) + len(e.Value)
	}
	return n
}

// FaultStore wraps a Store and injects failures, for tests. A nil hook
// passes the call through. Hooks may be called concurrently.
type FaultStore struct {
	sharedstate.Store
	// GetErr, when it returns non-nil, makes Get fail with that error.
	GetErr func(key string) error
	// SetErr, when it returns non-nil, makes Set fail with that error
	// without writing.
	SetErr func(key string, value []byte, cas uint32) error
}

// Get implements sharedstate.Store.
func (f *FaultStore) Get(key string) ([]byte, uint32, error) {
	if f.GetErr != nil {
		if err := f.GetErr(key); err != nil {
			return nil, 0, err
		}
	}
	return f.Store.Get(key)
}

// Set implements sharedstate.Store.
func (f *FaultStore) Set(key string, value []byte, cas uint32) error {
	if f.SetErr != nil {
		if err := f.SetErr(key, value, cas); err != nil {
			return err
		}
	}
	return f.Store.Set(key, value, cas)
}

// Lookup finds the bucket of the identity owner in a rule with n slots (or,
// with n = 0, under its unbounded key) and returns its key and value; for
// tests and debugging.
func Lookup(st sharedstate.Store, shadow bool, rule, owner string, n uint32) (key string, value []byte, err error) {
	if n == 0 {
		key = string(sharedstate.AppendKey(nil, shadow, rule, nil)) + owner
		value, _, err = st.Get(key)
		return key, value, err
	}
	seed, err := sharedstate.LoadSeed(st, 0)
	if err != nil {
		return "", nil, err
	}
	a, b := sharedstate.SlotPair(seed, owner, n)
	for _, slot := range []uint32{a, b} {
		key = string(sharedstate.AppendSlotKey(nil, shadow, rule, slot))
		v, _, err := st.Get(key)
		if err == nil && strings.HasSuffix(string(v), ":"+owner) {
			if _, o, ok, perr := sharedstate.ParseSlotValue(v); perr == nil && ok && o == owner {
				return key, append([]byte(nil), v...), nil
			}
		}
	}
	return "", nil, sharedstate.ErrNotFound
}
