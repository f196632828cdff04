package abi

import "github.com/tokengate/tokengate/filter"

// streamTable maps HTTP context ids to their streams. It is an open-
// addressing hash table with linear probing, because a Go map insert and
// delete per request cost over a microsecond in the wasm guest (no AES hash,
// and the swiss-table code is call-heavy), several times this table's cost.
// Ids are handed out by the host in sequence, so id & mask spreads them.
type streamTable struct {
	ids []uint32 // 0: empty slot (the host never uses context id 0)
	ss  []*filter.Stream
	n   int
}

func (t *streamTable) get(id uint32) (*filter.Stream, bool) {
	if id == 0 || t.n == 0 {
		return nil, false
	}
	mask := uint32(len(t.ids) - 1)
	for i := id & mask; ; i = (i + 1) & mask {
		switch t.ids[i] {
		case id:
			return t.ss[i], true
		case 0:
			return nil, false
		}
	}
}

func (t *streamTable) put(id uint32, s *filter.Stream) {
	if id == 0 {
		return
	}
	if 4*(t.n+1) > 3*len(t.ids) { // keep the load under 3/4
		t.grow()
	}
	mask := uint32(len(t.ids) - 1)
	for i := id & mask; ; i = (i + 1) & mask {
		switch t.ids[i] {
		case id:
			t.ss[i] = s
			return
		case 0:
			t.ids[i], t.ss[i] = id, s
			t.n++
			return
		}
	}
}

// remove deletes id and returns its stream, shifting later entries of the
// probe chain back so that lookups never need tombstones.
func (t *streamTable) remove(id uint32) (*filter.Stream, bool) {
	if id == 0 || t.n == 0 {
		return nil, false
	}
	mask := uint32(len(t.ids) - 1)
	i := id & mask
	for t.ids[i] != id {
		if t.ids[i] == 0 {
			return nil, false
		}
		i = (i + 1) & mask
	}
	s := t.ss[i]
	t.ids[i], t.ss[i] = 0, nil
	t.n--
	for j := (i + 1) & mask; t.ids[j] != 0; j = (j + 1) & mask {
		home := t.ids[j] & mask
		// Move j into the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			t.ids[i], t.ss[i] = t.ids[j], t.ss[j]
			t.ids[j], t.ss[j] = 0, nil
			i = j
		}
	}
	return s, true
}

func (t *streamTable) grow() {
	old, olds := t.ids, t.ss
	size := 2 * len(old)
	if size < 64 {
		size = 64
	}
	t.ids, t.ss, t.n = make([]uint32, size), make([]*filter.Stream, size), 0
	for i, id := range old {
		if id != 0 {
			t.put(id, olds[i])
		}
	}
}
