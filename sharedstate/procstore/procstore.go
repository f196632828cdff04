// Package procstore is shared data in process memory: a key-value store
// with the semantics of proxy-wasm shared data as Envoy implements it (get,
// and set with compare-and-swap), shared by every worker thread of the
// process. The Envoy dynamic module keeps its buckets here (filter/dynmod);
// the filter lays out its keys as it does in a proxy-wasm host's shared data
// (sharedstate: the same bounded slots), so memory stays bounded under key
// spraying exactly as it does there.
//
// The store is split into shards, each a hash table behind its own mutex, so that
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

// shard is one lock's part of the store: an open-addressed hash table
// (linear probing) of the keys whose hash's low bits select this shard,
// found by the hash the shard was chosen with, so that a look-up hashes
// its key once (a Go map would hash it a second time). Keys are never
// removed (shared data has no delete), so the table needs no tombstones.
type shard struct {
	mu    sync.Mutex
	slots []slot   // nil, or a power of two in length, at most half full
	n     int      // keys held
	_     [24]byte // keep shards on their own cache lines
}

// slot is one place of a shard's table: empty when e is nil.
type slot struct {
	h uint64
	e *entry
}

type entry struct {
	key   string // never changes: read without the lock by a View
	value []byte
	cas   uint32
}

// New returns an empty store.
func New() *Store {
	return &Store{seed: maphash.MakeSeed()}
}

// hash returns key's hash with the process's seed (hash/maphash,
// AES-based where the CPU has it: a fraction of a byte-wise hash's cost on
// a 40-byte key). Its low bits choose the shard, the others the slot.
func (s *Store) hash(key string) uint64 {
	return maphash.String(s.seed, key)
}

func (s *Store) shardOf(h uint64) *shard {
	return &s.sh[h&(shards-1)]
}

// find returns the entry of key, whose hash is h, or nil. The shard's lock
// must be held.
func (sh *shard) find(h uint64, key string) *entry {
	if len(sh.slots) == 0 {
		return nil
	}
	mask := uint64(len(sh.slots) - 1)
	for i := h / shards; ; i++ {
		sl := &sh.slots[i&mask]
		if sl.e == nil {
			return nil
		}
		if sl.h == h && sl.e.key == key {
			return sl.e
		}
	}
}

// add inserts e, whose key is not in the table and hashes to h. The
// shard's lock must be held.
func (sh *shard) add(h uint64, e *entry) {
	if 2*(sh.n+1) > len(sh.slots) {
		old := sh.slots
		sh.slots = make([]slot, max(16, 2*len(old)))
		for _, sl := range old {
			if sl.e != nil {
				sh.put(sl)
			}
		}
	}
	sh.put(slot{h: h, e: e})
	sh.n++
}

// put places sl in the first empty slot of its probe sequence.
func (sh *shard) put(sl slot) {
	mask := uint64(len(sh.slots) - 1)
	i := sl.h / shards
	for sh.slots[i&mask].e != nil {
		i++
	}
	sh.slots[i&mask] = sl
}

// GetInto appends the value of key to dst[:0] and returns it with its CAS
// token, or sharedstate.ErrNotFound. The copy is the caller's: another
// worker may change the key meanwhile.
func (s *Store) GetInto(dst []byte, key string) ([]byte, uint32, error) {
	h := s.hash(key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	e := sh.find(h, key)
	if e == nil {
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
	h := s.hash(key)
	sh := s.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(h, key)
	existed := e != nil
	if !existed {
		e = &entry{key: strings.Clone(key)}
		sh.add(h, e)
	}
	return e.set(value, cas, existed)
}

// set writes value into e with the compare-and-swap of Set; existed says
// e was in its table before this Set. Its shard's lock must be held.
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
		n += sh.n
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
// key it has just read, and an entry is never removed from its shard
// (shared data has no delete), so that Set, and a Get of the same key,
// need neither a hash nor a look-up, only a comparison with the entry's
// key (which never changes); they take the shard's lock as any Set does.
type View struct {
	S   *Store
	buf []byte

	lastSh *shard // the shard and entry of the last Get that found one
	lastE  *entry // nil: none
}

var _ sharedstate.Store = (*View)(nil)

// Get implements sharedstate.Store. A Get of the key the last one found
// (a global rule's one key, or the same client again) goes straight to its
// entry, without hashing the key or probing the table.
func (v *View) Get(key string) ([]byte, uint32, error) {
	sh, e := v.lastSh, v.lastE
	if e != nil && e.key == key {
		sh.mu.Lock()
	} else {
		h := v.S.hash(key)
		sh = v.S.shardOf(h)
		sh.mu.Lock()
		if e = sh.find(h, key); e == nil {
			sh.mu.Unlock()
			v.lastE = nil
			return nil, 0, sharedstate.ErrNotFound
		}
	}
	v.buf = append(v.buf[:0], e.value...)
	cas := e.cas
	sh.mu.Unlock()
	v.lastSh, v.lastE = sh, e
	return v.buf, cas, nil
}

// Set implements sharedstate.Store.
func (v *View) Set(key string, value []byte, cas uint32) error {
	if e := v.lastE; e != nil && e.key == key {
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
