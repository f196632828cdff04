package filter_test

import (
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/filter"
)

// TestSlotSharingAttack measures what an attacker who can choose keys
// (header:x-api-key) must spend to make a newcomer share its bucket, on a
// rule with max_keys 16, rate 1/s and burst 6 (docs/failures.md and
// RATIONALE.md state the result):
//
//   - while 64 sprayed keys keep every slot drained, a never-seen key
//     shares a drained bucket: it gets less than its burst;
//   - a slot stays live only while its buckets are spent at the refill
//     rate: an attacker who stops for burst/rate seconds (6 s) leaves
//     every slot full, and the newcomer gets its whole burst;
//   - keeping all 16 slots live at the limit takes rate × slots requests a
//     second (16/s), as much as 16 honest clients at their limit: at the
//     default 65,536 slots and 5/s that is 327,680 requests a second.
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
	if n := burstOf("newcomer-1"); n >= 6 {
		t.Errorf("a newcomer among drained slots got %d of 6: no sharing measured", n)
	} else {
		t.Logf("newcomer among drained slots: %d of 6", n)
	}

	// The attacker keeps spending the refill rate on each slot for 10 s:
	// one request a second to a key in each slot is enough, since every
	// slot's bucket is drained to zero and refills one token a second.
	sustained := 0
	for s := 1; s <= 10; s++ {
		f.now += 1
		for i := range 64 {
			if key("attacker-" + strconv.Itoa(i)) {
				sustained++
			}
		}
	}
	if per := float64(sustained) / 10; per > 16 {
		t.Errorf("the attacker's admitted rate %v/s exceeds rate × slots = 16/s", per)
	}
	if n := burstOf("newcomer-2"); n >= 6 {
		t.Errorf("with the slots kept live, a newcomer got %d of 6", n)
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
