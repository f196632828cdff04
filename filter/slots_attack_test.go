package filter_test

import (
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/filter"
)

// TestSlotSharingAttack measures what an attacker who can choose keys
// (header:x-api-key) gets from spraying them at a rule with max_keys 16,
// rate 1/s and burst 6 (RATIONALE.md, "Memory", states the result):
//
//   - while 64 sprayed and drained keys hold every slot, a never-seen key
//     gets its whole burst: it evicts the fuller of its two candidates
//     (issue 22: it used to share a drained bucket and got 429s);
//   - a client spending at its limit keeps its slot through a spray of one
//     request per key: each sprayed bucket keeps 5 tokens, more than the
//     client's, so the client's slot is never the one evicted, and the
//     client stays held to its rate;
//   - once the attacker stops for burst / rate seconds (6 s) every slot is
//     full by now and a newcomer takes one over.
func TestSlotSharingAttack(t *testing.T) {
	const cfg = `{"rules":[{"name":"per-key","limit_keys":["header:x-api-key"],"max_keys":16,"algorithm_config":{"rps":1,"burst":6}}]}`
	f := newFixture(t, cfg)
	key := func(k string) bool {
		return f.get("x-api-key", k).Status() == 200
	}
	burstOf := func(k string) int {
		n := 0
		for range 10 {
			if key(k) {
				n++
			}
		}
		return n
	}
	// The spray: 64 keys, each drained (6 requests).
	for i := range 64 {
		for range 6 {
			key("attacker-" + strconv.Itoa(i))
		}
	}
	if got := f.counter("per-key", filter.CounterSlotCollisions); got == 0 {
		t.Fatal("64 keys in 16 slots never collided")
	}
	if n := burstOf("newcomer-1"); n != 6 {
		t.Errorf("a newcomer among drained slots got %d of 6, want its whole burst", n)
	}

	// A client drains its bucket, then asks once a second for 10 s while
	// the attacker sprays 64 never-seen keys a second, one request each.
	f.now += 6 // every slot full by now
	if n := burstOf("client"); n != 6 {
		t.Fatalf("client: got %d of 6 at the start", n)
	}
	admitted := 0
	for s := 1; s <= 10; s++ {
		f.now += 1
		for i := range 64 {
			key("spray-" + strconv.Itoa(s) + "-" + strconv.Itoa(i))
		}
		if key("client") {
			admitted++
		}
	}
	if admitted > 10 {
		t.Errorf("client admitted %d in 10 s at 1/s during a one-request spray: its slot was evicted", admitted)
	}

	// The attacker stops; burst / rate = 6 s later every slot is full by
	// now, so a newcomer takes one over with a fresh bucket.
	f.now += 6
	before := f.counter("per-key", filter.CounterSlotTakeovers)
	if n := burstOf("newcomer-3"); n != 6 {
		t.Errorf("6 s after the attacker stopped, a newcomer got %d of 6, want all 6", n)
	}
	if f.counter("per-key", filter.CounterSlotTakeovers) <= before {
		t.Error("the newcomer did not take a slot over")
	}
}
