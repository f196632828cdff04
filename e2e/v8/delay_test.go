package v8

import (
	"strings"
	"testing"
)

func tick() step                 { return step{"op": "tick"} }
func cancel(worker, id int) step { return step{"op": "cancel", "worker": worker, "id": id} }
func cfgDelay(extra string) string {
	return strings.Replace(`{"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5%s}}`, "%s", extra, 1)
}

// TestDelayUnderV8 is the nginx equivalence under V8 on two workers: of 7
// requests at once against 10/s, burst 1, max_reserved 5, the first goes
// on, the seventh gets a 429, and the five held are finished by the
// workers' proxy_on_tick in admission order, each on the first tick at its
// deadline (+100 … +500 ms; the fixed clock moves 10 ms a tick), with the
// ticks off at the end.
func TestDelayUnderV8(t *testing.T) {
	steps := []step{}
	for range 7 {
		steps = append(steps, get("/", "192.0.2.1:5000"))
	}
	for range 60 {
		steps = append(steps, advance(10), tick())
	}
	res := run(t, cfgDelay(""), 2, nil, steps...)
	mustStart(t, res)
	reqs := res[1:8]
	if reqs[0].Status != 200 || reqs[0].Held || reqs[6].Status != 429 || reqs[6].header("retry-after") != "1" {
		t.Fatalf("first %+v, seventh %+v; want 200 at once and a 429 with Retry-After 1", reqs[0], reqs[6])
	}
	type key struct{ worker, id int }
	order := map[key]int{} // held request → its place, 1..5
	for k, r := range reqs[1:6] {
		if !r.Held {
			t.Fatalf("request %d: %+v, want it held", k+2, r)
		}
		order[key{r.Worker, r.ID}] = k + 1
	}
	next := 1
	ticks := res[8:]
	for i := 1; i < len(ticks); i += 2 {
		elapsedMs := (i + 1) / 2 * 10
		for _, r := range ticks[i].Released {
			k := order[key{r.Worker, r.ID}]
			if k != next {
				t.Errorf("at +%d ms released held request %d, want %d next", elapsedMs, k, next)
			}
			if elapsedMs != k*100 {
				t.Errorf("held request %d released at +%d ms, want +%d ms, its deadline", k, elapsedMs, k*100)
			}
			if r.Status != 200 {
				t.Errorf("held request %d answered %d", k, r.Status)
			}
			next++
		}
	}
	if next != 6 {
		t.Errorf("%d held requests released, want 5", next-1)
	}
	last := ticks[len(ticks)-1]
	for w, p := range last.Periods {
		if p != 0 {
			t.Errorf("worker %d: tick period %d ms with nothing waiting, want 0", w, p)
		}
	}
}

// TestDelayCancelUnderV8: a held request whose client leaves is never
// continued (its context is gone: set_effective_context fails) and with
// refund_on_cancel its token goes back.
func TestDelayCancelUnderV8(t *testing.T) {
	res := run(t, cfgDelay(`,"refund_on_cancel":true`), 1, nil,
		get("/", "192.0.2.1:5000"), get("/", "192.0.2.1:5000"), get("/", "192.0.2.1:5000"),
		cancel(0, 3), // the second request (context 3) leaves
		metric("tokengate.rule.g.delay_cancelled"),
		get("/", "192.0.2.1:5000"), // refunded: waits 200 ms, not 300
		advance(199), tick(), advance(1), tick(), advance(200), tick())
	mustStart(t, res)
	if !res[2].Held || res[2].ID != 3 || !res[3].Held {
		t.Fatalf("requests 2 and 3: %+v %+v; want both held", res[2], res[3])
	}
	if res[5].Value != "1" {
		t.Errorf("delay_cancelled = %q, want 1", res[5].Value)
	}
	if len(res[8].Released) != 0 {
		t.Errorf("at +199 ms released %+v", res[8].Released)
	}
	var ids []int
	for _, r := range res[10].Released {
		ids = append(ids, r.ID)
	}
	if len(ids) != 2 || ids[0] != 4 || ids[1] != 5 {
		t.Errorf("at +200 ms released contexts %v, want [4 5] (the third request and the refunded fourth)", ids)
	}
	if len(res[12].Released) != 0 || res[12].Periods[0] != 0 {
		t.Errorf("last tick: released %+v, period %v; want nothing and 0", res[12].Released, res[12].Periods)
	}
}
