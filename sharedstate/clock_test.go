package sharedstate_test

import (
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/sharedstate"
)

// TestRejectionAfterClockStepBackReanchors is the regression test of a
// bug, for both key formats: a bucket that lacked tokens when the clock was
// stepped back by more than bucket.MaxClockSkew stayed frozen until the
// clock caught up with its stored last_refill, because Updater.reject wrote
// only corrupt repairs and the state bucket.Limit.Refill re-anchored at now
// was never stored. Fixed in fba92a3.
func TestRejectionAfterClockStepBackReanchors(t *testing.T) {
	const t0 = 1736940000.0
	lim := bucket.Limit{Rate: 1, Burst: 5}
	for _, slotted := range []bool{false, true} {
		name := "unbounded key"
		if slotted {
			name = "slot"
		}
		t.Run(name, func(t *testing.T) {
			m := sharedstate.NewMemStore(sharedstate.Envoy)
			u := &sharedstate.Updater{Store: m}
			req := sharedstate.Request{Key: "tb:r:k", Limit: lim, Cost: 1}
			if slotted {
				req = sharedstate.Request{Key: "tb:r:$1", Alt: "tb:r:$2", Owner: "k", Slotted: true, Limit: lim, Cost: 1}
			}
			take := func(now, cost float64) sharedstate.Outcome {
				r := req
				r.Cost = cost
				return u.TakeAll([]sharedstate.Request{r}, now, nil)
			}
			if out := take(t0, 5); !out.Allowed {
				t.Fatalf("draining at t0: %+v", out)
			}
			back := t0 - 3600 // the clock is stepped back an hour
			if out := take(back, 1); out.Allowed || out.Err != nil {
				t.Fatalf("right after the step: got %+v, want rejected", out)
			}
			if out := take(back+1, 1); !out.Allowed {
				t.Errorf("one second after the step back, at 1 token/s: got %+v, want allowed (the bucket is frozen until t0)", out)
			}
		})
	}
}
