package abi

import (
	"math/rand/v2"
	"testing"

	"github.com/tokengate/tokengate/filter"
)

// TestStreamTable hammers the table against a Go map with the host's access
// pattern: increasing ids, deleted in any order.
func TestStreamTable(t *testing.T) {
	var tab streamTable
	want := map[uint32]*filter.Stream{}
	r := rand.New(rand.NewPCG(9, 10))
	next := uint32(2)
	var live []uint32
	for step := range 200000 {
		if len(live) == 0 || (r.IntN(2) == 0 && len(live) < 300) {
			s := new(filter.Stream)
			tab.put(next, s)
			want[next] = s
			live = append(live, next)
			next += uint32(1 + r.IntN(3))
		} else {
			k := r.IntN(len(live))
			id := live[k]
			live[k] = live[len(live)-1]
			live = live[:len(live)-1]
			got, ok := tab.remove(id)
			if !ok || got != want[id] {
				t.Fatalf("step %d: remove(%d) = %p %v, want %p", step, id, got, ok, want[id])
			}
			delete(want, id)
			if _, ok := tab.remove(id); ok {
				t.Fatalf("step %d: %d removed twice", step, id)
			}
		}
		if step%97 == 0 {
			for id, s := range want {
				if got, ok := tab.get(id); !ok || got != s {
					t.Fatalf("step %d: get(%d) = %p %v, want %p", step, id, got, ok, s)
				}
			}
			if _, ok := tab.get(next + 1); ok {
				t.Fatalf("step %d: get of an unused id succeeded", step)
			}
			if tab.n != len(want) {
				t.Fatalf("step %d: n = %d, want %d", step, tab.n, len(want))
			}
		}
	}
}
