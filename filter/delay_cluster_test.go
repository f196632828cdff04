package filter_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// delayClusterCfg: a local rule that holds requests (10/s, burst 1,
// max_reserved 5) and a cluster rule the rate-limit service decides.
const delayClusterCfg = `{"rules":[
	{"name":"g","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":1,"max_reserved":5,"max_pending":PENDING,"refund_on_cancel":true}},
	{"name":"c","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":100,"burst":100}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"on_error":"deny"}}}`

func delayClusterFixture(t *testing.T, maxPending int) *fixture {
	t.Helper()
	return newFixture(t, strings.Replace(delayClusterCfg, "PENDING", strconv.Itoa(maxPending), 1))
}

// gStored returns the stored balance of rule g's bucket (negative while in
// debt).
func gStored(t *testing.T, f *fixture) string {
	t.Helper()
	for _, e := range f.h.Store.(*sharedstatetest.Store).Snapshot("tb:g:") {
		return strings.SplitN(e.Value, ":", 2)[0]
	}
	return "<none>"
}

var (
	clusterOK     = grpcOK(rlsResponse(1, []rlsStatus{{1, 99, 0}}))
	clusterReject = grpcOK(rlsResponse(2, []rlsStatus{{2, 0, 1}}))
)

// TestDelayWithCluster: a request its local rule would hold is asked of the
// rate-limit service first, and held only once the service admits it, until
// the deadline counted from the local admission (at once if that has
// passed); a service rejection refunds its local reservation and answers
// 429; max_pending counts it from the local admission; a stream that ends
// while the service decides is never continued.
func TestDelayWithCluster(t *testing.T) {
	req := filtertest.Get("/", "192.0.2.1:5000")

	t.Run("asked of the service, then held until its deadline", func(t *testing.T) {
		f := delayClusterFixture(t, 10)
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || len(f.h.Calls) != 1 {
			t.Fatalf("request 1: %v with %d calls, want the call", res.RequestAction, len(f.h.Calls))
		}
		f.h.Deliver(f.p, f.h.Calls[0].Token, clusterOK)
		if len(f.h.Continued) != 1 {
			t.Fatalf("request 1: continued %v, want it on at once (no debt)", f.h.Continued)
		}
		// Request 2 is admitted into the reservation (0.1 s of debt): the
		// service is asked before it is held.
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || len(f.h.Calls) != 2 || res.Local != nil {
			t.Fatalf("request 2: %v with %d calls, reply %+v; want the call", res.RequestAction, len(f.h.Calls), res.Local)
		}
		if f.p.Waiting() != 0 {
			t.Fatalf("%d held before the service answered", f.p.Waiting())
		}
		f.now += 0.02
		f.h.Deliver(f.p, f.h.Calls[1].Token, clusterOK)
		if len(f.h.Continued) != 1 || f.p.Waiting() != 1 {
			t.Fatalf("continued %v, %d held; want request 2 held after the service admitted it", f.h.Continued, f.p.Waiting())
		}
		if got := f.h.TickPeriod(); got != 80 {
			t.Errorf("tick period %d ms, want the 80 ms left of the 100 ms hold", got)
		}
		f.now = epoch + 0.1 - 1e-6
		if got := f.h.Tick(f.p); len(got) != 0 {
			t.Fatalf("released %v before the deadline", got)
		}
		f.now = epoch + 0.1
		if got := f.h.Tick(f.p); len(got) != 1 || got[0] != 2 {
			t.Fatalf("released %v at the deadline, want [2]", got)
		}
		if a, d := f.counter("c", filter.CounterAllowed), f.counter("g", filter.CounterDelayed); a != 2 || d != 1 {
			t.Errorf("c allowed %d, g delayed %d; want 2 and 1", a, d)
		}
	})

	t.Run("an answer after the deadline: on at once", func(t *testing.T) {
		f := delayClusterFixture(t, 10)
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[0].Token, clusterOK)
		f.h.Start(f.p, req) // 0.1 s of debt
		f.now += 0.15
		f.h.Deliver(f.p, f.h.Calls[1].Token, clusterOK)
		if len(f.h.Continued) != 2 || f.p.Waiting() != 0 {
			t.Fatalf("continued %v, %d held; want request 2 on at once", f.h.Continued, f.p.Waiting())
		}
	})

	t.Run("the service rejects it: 429, the local reservation refunded, its place freed", func(t *testing.T) {
		f := delayClusterFixture(t, 1)
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[0].Token, clusterOK)
		before := gStored(t, f) // 0
		f.h.Start(f.p, req)
		if got := gStored(t, f); got == before {
			t.Fatalf("stored %s: the local reservation was not taken", got)
		}
		resp := f.h.Deliver(f.p, f.h.Calls[1].Token, clusterReject)
		if resp.Local == nil || resp.Local.Status != 429 || len(f.h.Continued) != 1 || f.p.Waiting() != 0 {
			t.Fatalf("reply %+v, continued %v, %d held; want a 429", resp.Local, f.h.Continued, f.p.Waiting())
		}
		if got := gStored(t, f); got != before {
			t.Errorf("stored %s after the rejection, want %s (refunded)", got, before)
		}
		if got := f.counter("g", filter.CounterDelayed); got != 0 {
			t.Errorf("delayed = %d, want 0: it was never held", got)
		}
		// max_pending 1: its place is free again.
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[2].Token, clusterOK)
		if f.p.Waiting() != 1 {
			t.Fatalf("%d held, want the next request held (max_pending 1, nothing pending)", f.p.Waiting())
		}
	})

	t.Run("max_pending counts from the local admission", func(t *testing.T) {
		f := delayClusterFixture(t, 1)
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[0].Token, clusterOK)
		f.h.Start(f.p, req) // pending: asked of the service
		before := gStored(t, f)
		_, res := f.h.Start(f.p, req)
		if res.Status() != 429 || len(f.h.Calls) != 2 {
			t.Fatalf("third request: %d with %d calls, want a 429 over max_pending and no call", res.Status(), len(f.h.Calls))
		}
		if got := gStored(t, f); got != before {
			t.Errorf("stored %s, want %s: the refused request takes nothing", got, before)
		}
	})

	t.Run("a stream that ends while the service decides is never continued", func(t *testing.T) {
		f := delayClusterFixture(t, 1)
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[0].Token, clusterOK)
		before := gStored(t, f)
		// Ended (proxy_on_done), not yet deleted: its context exists, but
		// the answer must not continue it.
		s, _ := f.h.Start(f.p, req)
		s.OnDone()
		f.h.Deliver(f.p, f.h.Calls[1].Token, clusterOK)
		if len(f.h.Continued) != 1 || f.p.Waiting() != 0 {
			t.Fatalf("continued %v, %d held: a stream that ended", f.h.Continued, f.p.Waiting())
		}
		if got := gStored(t, f); got != before {
			t.Errorf("stored %s, want %s: refund_on_cancel", got, before)
		}
		if got := f.counter("g", filter.CounterDelayCancelled); got != 1 {
			t.Errorf("delay_cancelled = %d, want 1", got)
		}
		s.Release()
		// Gone (the context cannot be made effective) while the service
		// decides: never continued, its place freed.
		s, _ = f.h.Start(f.p, req)
		f.h.Gone = map[uint32]bool{3: true}
		f.h.Deliver(f.p, f.h.Calls[2].Token, clusterOK)
		if len(f.h.Continued) != 1 || f.p.Waiting() != 0 {
			t.Fatalf("continued %v, %d held: a stream that is gone", f.h.Continued, f.p.Waiting())
		}
		s.Release()
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[3].Token, clusterOK)
		if f.p.Waiting() != 1 {
			t.Fatalf("%d held, want the next request held: max_pending 1 was freed", f.p.Waiting())
		}
	})
}

// TestDelayWithLease: a request its local rule would hold and a lease rule
// admits from the allowance is held at once; one that waits for its lease
// call is held once the call admits it; a lease rule's 429 refunds the local
// reservation.
func TestDelayWithLease(t *testing.T) {
	cfg := `{"rules":[
	{"name":"g","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":1,"max_reserved":5}},
	{"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,"limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`
	req := filtertest.Get("/", "192.0.2.1:5000")
	f := newFixture(t, cfg)
	// Cold: request 1 (no debt) waits for the exact take.
	f.h.Start(f.p, req)
	f.h.Tick(f.p)
	exactTake(t, f.h, 0)
	f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 19, 0))
	if len(f.h.Continued) != 1 || f.p.Waiting() != 0 {
		t.Fatalf("continued %v, %d held; want request 1 on", f.h.Continued, f.p.Waiting())
	}
	// Request 2 (0.1 s of debt) waits for the lease, then is held.
	f.h.Start(f.p, req)
	f.now += 0.01
	f.h.Tick(f.p)
	leaseCall(t, f.h, 1)
	f.h.Deliver(f.p, f.h.Calls[1].Token, leaseAnswer(1, 8, "1", 0))
	if len(f.h.Continued) != 1 || f.p.Waiting() != 1 {
		t.Fatalf("continued %v, %d held; want request 2 held after its lease", f.h.Continued, f.p.Waiting())
	}
	// Request 3 (0.2 s of debt) is admitted from the allowance: held at
	// once.
	if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || f.p.Waiting() != 2 || len(f.h.Calls) != 2 {
		t.Fatalf("request 3: %v, %d held, %d calls; want it held, no call", res.RequestAction, f.p.Waiting(), len(f.h.Calls))
	}
	// The lease bucket known empty: a request that would be held gets
	// the lease rule's 429, and its reservation back.
	k := "tl:lease-ip:192.0.2.1"
	v, cas, _ := f.h.Store.Get(k)
	r, err := sharedstate.ParseLeaseRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	r.Tokens, r.Retry = 0, f.now+5
	f.h.Store.Set(k, sharedstate.AppendLeaseRecord(nil, r), cas)
	before := gStored(t, f)
	_, res := f.h.Start(f.p, req)
	if res.Status() != 429 || f.p.Waiting() != 2 || f.counter("lease-ip", filter.CounterRejected) != 1 {
		t.Fatalf("status %d (%s), %d held; want the lease rule's 429", res.Status(), res.Header("x-tokengate-rule"), f.p.Waiting())
	}
	if got := gStored(t, f); got != before {
		t.Errorf("stored %s, want %s: the local reservation refunded", got, before)
	}
	f.now = epoch + 0.1
	if got := f.h.Tick(f.p); len(got) != 1 || got[0] != 2 {
		t.Fatalf("released %v at +100 ms, want [2]", got)
	}
	f.now = epoch + 0.2
	if got := f.h.Tick(f.p); len(got) != 1 || got[0] != 3 {
		t.Fatalf("released %v at +200 ms, want [3]", got)
	}
}
