// Package procstore is shared data in process memory: a key-value store
// with the semantics of proxy-wasm shared data as Envoy implements it (get,
// and set with compare-and-swap), shared by every worker thread of the
// process. The Envoy dynamic module keeps its buckets here (filter/dynmod);
// the filter lays out its keys as it does in a proxy-wasm host's shared data
// (sharedstate: the same bounded slots), so memory stays bounded under key
// spraying exactly as it does there.
//
// The store is split into shards, each a map behind its own mutex, so that
// workers updating different keys rarely meet; an update of one key is a
// get and a compare-and-swap, each under its shard's lock, as in Envoy.
// Nothing here allocates on a get, or on a set of an existing key whose
// value fits the capacity it already has.
package procstore

import (
	"hash/maphash"
	"strings"
	"sync"

	"github.com/tokengate/tokengate/sharedstate"
)

// shards is the number of shards; a power of two.
const shards = 64

// Store is the process's shared data. The zero value is not usable; call
// New. It is safe for concurrent use.
type Store struct {
	sh   [shards]shard
	seed maphash.Seed
}

type shard struct {
	mu sync.Mutex
	m  map[string]*entry
	_  [40]byte // keep shards on their own cache lines
}

type entry struct {
	value []byte
	cas   uint32
}

// New returns an empty store.
func New() *Store {
	s := &Store{seed: maphash.MakeSeed()}
	for i := range s.sh {
		s.sh[i].m = make(map[string]*entry)
	}
	return s
}

// shardOf returns the shard of key: its hash with the process's seed
// (hash/maphash, AES-based where the CPU has it: a fraction of a byte-wise
// hash's cost on a 40-byte key, and the store hashes every key twice a
// decision).
func (s *Store) shardOf(key string) *shard {
	return &s.sh[maphash.String(s.seed, key)&(shards-1)]
}

// GetInto appends the value of key to dst[:0] and returns it with its CAS
// token, or sharedstate.ErrNotFound. The copy is the caller's: another
// worker may change the key meanwhile.
func (s *Store) GetInto(dst []byte, key string) ([]byte, uint32, error) {
	sh := s.shardOf(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if !ok {
		sh.mu.Unlock()
		return dst[:0], 0, sharedstate.ErrNotFound
	}
	dst = append(dst[:0], e.value...)
	cas := e.cas
	sh.mu.Unlock()
	return dst, cas, nil
}

// Set writes value under key with Envoy's semantics: cas 0 writes
// unconditionally, a non-zero cas must equal the key's current one
// (sharedstate.ErrCASMismatch otherwise), and a missing key is created
// whatever the cas. A key's CAS token is never 0. Neither key nor value is
// kept: both are copied.
func (s *Store) Set(key string, value []byte, cas uint32) error {
	sh := s.shardOf(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[key]
	if !ok {
		e = &entry{}
		sh.m[strings.Clone(key)] = e
	}
	return e.set(value, cas, ok)
}

// set writes value into e with the compare-and-swap of Set; existed says
// e was in its map before this Set. Its shard's lock must be held.
func (e *entry) set(value []byte, cas uint32, existed bool) error {
	if existed && cas != 0 && cas != e.cas {
		return sharedstate.ErrCASMismatch
	}
	e.value = append(e.value[:0], value...)
	if e.cas++; e.cas == 0 {
		e.cas = 1
	}
	return nil
}

// Len returns the number of keys the store holds.
func (s *Store) Len() int {
	n := 0
	for i := range s.sh {
		sh := &s.sh[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// View is one worker's access to a Store: a sharedstate.Store whose Get
// returns the value in the view's own buffer, valid until the next Get of
// the same view. A view is used by one goroutine at a time (one worker
// thread); the Store behind it is shared.
//
// A view remembers the entry its last Get found: the Updater writes the
// key it has just read, and an entry is never removed from its shard's
// map (shared data has no delete), so that Set needs neither a hash nor a
// map look-up; it takes the shard's lock as any Set does.
type View struct {
	S   *Store
	buf []byte

	lastKey []byte // the key of the last Get that found an entry
	lastSh  *shard
	lastE   *entry // nil: none
}

var _ sharedstate.Store = (*View)(nil)

// Get implements sharedstate.Store.
func (v *View) Get(key string) ([]byte, uint32, error) {
	sh := v.S.shardOf(key)
	sh.mu.Lock()
	e, ok := sh.m[key]
	if !ok {
		sh.mu.Unlock()
		v.lastE = nil
		return nil, 0, sharedstate.ErrNotFound
	}
	v.buf = append(v.buf[:0], e.value...)
	cas := e.cas
	sh.mu.Unlock()
	v.lastKey = append(v.lastKey[:0], key...)
	v.lastSh, v.lastE = sh, e
	return v.buf, cas, nil
}

// Set implements sharedstate.Store.
func (v *View) Set(key string, value []byte, cas uint32) error {
	if e := v.lastE; e != nil && string(v.lastKey) == key {
		sh := v.lastSh
		sh.mu.Lock()
		err := e.set(value, cas, true)
		sh.mu.Unlock()
		return err
	}
	return v.S.Set(key, value, cas)
}

// BinaryValues implements sharedstate.BinaryValues: the store holds the
// buckets' binary values, not the text proxy-wasm hosts keep.
func (v *View) BinaryValues() bool { return true }
