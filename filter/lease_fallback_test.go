package filter_test

import (
	"encoding/binary"
	"math"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
)

// leaseFleet is a fleet of filter processes (one worker each) on a fake
// clock, sharing one global token bucket behind a fake lease service that
// fails the calls fail says.
type leaseFleet struct {
	t      *testing.T
	now    float64
	global bucket.Limit
	gs     bucket.State
	hosts  []*filtertest.Host
	procs  []*filter.Plugin
	// answered is each process's count of calls answered or failed;
	// failed is how many failed.
	answered []int
	failed   int
	fail     func(proc, call int) bool
	grantID  uint64
	// admitted holds the time of every admission, whatever admitted it.
	admitted []float64
}

func newLeaseFleet(t *testing.T, cfg string, n int, global bucket.Limit, fail func(proc, call int) bool) *leaseFleet {
	f := &leaseFleet{t: t, now: epoch, global: global, gs: global.Full(epoch), answered: make([]int, n), fail: fail}
	for range n {
		h := filtertest.New()
		p := filter.NewPlugin(h)
		p.Clock = func() float64 { return f.now }
		if !p.OnConfigure([]byte(cfg)) {
			t.Fatalf("configure: %q", h.Logs(filter.LogError))
		}
		f.hosts, f.procs = append(f.hosts, h), append(f.procs, p)
	}
	return f
}

// answer encodes a RateLimitResponse with one status: code,
// limit_remaining, duration_until_reset to the nanosecond, and a grant
// (requests, id) when id != 0.
func fleetAnswer(code uint64, left float64, reset float64, requests, id uint64) filtertest.CallResponse {
	sec, frac := math.Modf(reset)
	st := pb(nil).uint(1, code).uint(3, uint64(math.Max(0, math.Floor(left))))
	if reset > 0 {
		st = st.bytes(4, pb(nil).uint(1, uint64(sec)).uint(2, uint64(frac*1e9)))
	}
	if id != 0 {
		st = st.bytes(5, pb(nil).uint(1, requests).bytes(3, []byte(strconv.FormatUint(id, 10))))
	}
	m := pb(nil).uint(1, code).bytes(2, st)
	framed := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(m)))
	return grpcOK(append(framed, m...))
}

// serve answers (or fails) every call process i made that is not answered
// yet, as the service would, from the global bucket. A lease grant carries
// nothing over (requests = the new tokens: always safe, docs/lease.md); a
// release's tokens are dropped (capacity, never over).
func (f *leaseFleet) serve(i int) {
	h, p := f.hosts[i], f.procs[i]
	for ; f.answered[i] < len(h.Calls); f.answered[i]++ {
		c := h.Calls[f.answered[i]]
		n := len(h.Continued)
		if f.fail(i, f.answered[i]) {
			f.failed++
			h.Deliver(p, c.Token, filtertest.CallResponse{})
			f.count(i, n)
			continue
		}
		d := decodeCall(f.t, c)
		if len(d) != 1 {
			f.t.Fatalf("process %d: a call with %d descriptors", i, len(d))
		}
		e := d[0].entries
		var resp filtertest.CallResponse
		switch {
		case e["tokengate_release"] == "1":
			resp = fleetAnswer(1, f.global.Refill(f.gs, f.now).Tokens, 0, 0, 0)
		case e["tokengate_holder"] == "":
			// An exact take: all or nothing.
			var res bucket.Result
			f.gs, res = f.global.Take(f.gs, f.now, float64(d[0].hits))
			code := uint64(1)
			if !res.Allowed {
				code = 2
			}
			resp = fleetAnswer(code, res.Tokens, res.RetryAfter, 0, 0)
		default:
			want, err := strconv.ParseUint(e["tokengate_want"], 10, 64)
			if err != nil {
				f.t.Fatalf("want %q", e["tokengate_want"])
			}
			have := math.Floor(f.global.Refill(f.gs, f.now).Tokens)
			g := math.Min(float64(want), have)
			code, reset := uint64(1), 0.0
			if g > 0 {
				var res bucket.Result
				f.gs, res = f.global.Take(f.gs, f.now, g)
				if !res.Allowed {
					f.t.Fatalf("took %v of %v", g, have)
				}
			} else if want > 0 {
				code = 2
				_, res := f.global.Take(f.gs, f.now, 1)
				reset = res.RetryAfter
			}
			f.grantID++
			resp = fleetAnswer(code, f.global.Refill(f.gs, f.now).Tokens, reset, uint64(g), f.grantID)
		}
		h.Deliver(p, c.Token, resp)
		f.count(i, n)
	}
}

// count records the admissions process i made since its Continued list
// was n long.
func (f *leaseFleet) count(i, n int) {
	for range len(f.hosts[i].Continued) - n {
		f.admitted = append(f.admitted, f.now)
	}
}

// request sends one request to process i.
func (f *leaseFleet) request(i int, req filtertest.Request) {
	h := f.hosts[i]
	n := len(h.Continued)
	_, res := h.Start(f.procs[i], req)
	if res.RequestAction == filter.Continue {
		f.admitted = append(f.admitted, f.now)
	}
	f.count(i, n)
}

// tick ticks process i and serves its calls.
func (f *leaseFleet) tick(i int) {
	h := f.hosts[i]
	n := len(h.Continued)
	h.Tick(f.procs[i])
	f.count(i, n)
	f.serve(i)
}

// worstWindow returns the largest excess of admissions over burst + rate
// × T in any window [t0, t1] of the run (admissions at the same instant
// all counted).
func (f *leaseFleet) worstWindow() (excess float64, t0, t1 float64) {
	return f.worstWindowBefore(math.Inf(1))
}

// worstWindowBefore is worstWindow over the admissions before end.
func (f *leaseFleet) worstWindowBefore(end float64) (excess float64, t0, t1 float64) {
	a := f.admitted
	for len(a) > 0 && a[len(a)-1] >= end {
		a = a[:len(a)-1]
	}
	excess = math.Inf(-1)
	for i := range a {
		for j := i; j < len(a); j++ {
			k := j
			for k+1 < len(a) && a[k+1] == a[j] {
				k++
			}
			if x := float64(k-i+1) - (f.global.Burst + f.global.Rate*(a[j]-a[i])); x > excess {
				excess, t0, t1 = x, a[i]-epoch, a[j]-epoch
			}
		}
	}
	return excess, t0, t1
}

// TestLeaseTransientFailures: lease calls that fail now and then (issue
// 23: a busy service's 0.2 to 0.5 % of UNAVAILABLE answers) do not send
// the requests that waited for them to on_error's fallback. With
// "on_error": "local" each process's own bucket admitted them, and a hot
// client got 15 where the fleet's limit allowed 12.1; now they wait for the
// next call, and across the fleet every window of the run stays within
// burst + rate × T. Only calls failing for lease_fallback_ms in a row fall
// back.
func TestLeaseTransientFailures(t *testing.T) {
	cfg := `{"rules":[
	{"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,
	 "limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100,"on_error":"local"}}}`
	global := bucket.Limit{Rate: 10, Burst: 20}
	req := filtertest.Get("/", "192.0.2.1:5000")
	const procs = 3

	// run offers each process a request every 4 ms for secs seconds,
	// ticking every process every millisecond (the poll while requests
	// wait; the timer's period is not modelled: a tick the host would not
	// make changes nothing the refill decisions depend on).
	run := func(f *leaseFleet, secs int) {
		for ms := range secs * 1000 {
			for i := range procs {
				if (ms+i)%4 == 0 {
					f.request(i, req)
				}
				f.tick(i)
			}
			f.now += 0.001
		}
	}

	t.Run("calls failing now and then, two in a row at most: within the fleet's bound", func(t *testing.T) {
		// Calls 1 and 2 of every 5 of each process fail.
		f := newLeaseFleet(t, cfg, procs, global, func(_, call int) bool { return call%5 == 1 || call%5 == 2 })
		run(f, 5)
		excess, t0, t1 := f.worstWindow()
		bound := global.Burst + global.Rate*5
		t.Logf("%d admitted in 5 s (bound %.0f), %d calls failed; worst window [%.3f, %.3f] s: %+.2f tokens over its bound",
			len(f.admitted), bound, f.failed, t0, t1, excess)
		if f.failed < 10 {
			t.Fatalf("%d calls failed: the test must fail calls that requests wait for", f.failed)
		}
		if excess > 1e-9 {
			t.Errorf("window [%.3f, %.3f] s admitted %.2f more than burst + rate × T: a transient failure fell back", t0, t1, excess)
		}
		// Not refusing everything: the failures cost at most a few
		// periods' refill.
		if float64(len(f.admitted)) < bound-global.Rate*1 {
			t.Errorf("%d admitted of a bound of %.0f: the waiting requests were not served by the calls after the failures", len(f.admitted), bound)
		}
	})

	t.Run("calls failing for longer than lease_fallback_ms: on_error from then on, and the service back", func(t *testing.T) {
		// Every call fails from 1 s to 3 s (lease_fallback_ms: 500 by
		// default, five refill periods).
		const down, up, fallback = 1.0, 3.0, 0.5
		var f *leaseFleet
		f = newLeaseFleet(t, cfg, procs, global, func(_, _ int) bool {
			return f.now >= epoch+down && f.now < epoch+up
		})
		run(f, 5)
		// Before the fallback time nothing beyond the fleet's bound.
		if excess, t0, t1 := f.worstWindowBefore(epoch + down + fallback); excess > 1e-9 {
			t.Errorf("window [%.3f, %.3f] s admitted %.2f over burst + rate × T before the calls had failed for lease_fallback_ms", t0, t1, excess)
		}
		var during, after int
		for _, at := range f.admitted {
			switch {
			case at >= epoch+down+fallback && at < epoch+up:
				during++
			case at >= epoch+up+1: // a second to settle: the local buckets' admissions are not the service's
				after++
			}
		}
		// From then on each process's own bucket decides (on_error
		// local): at most its burst + rate × T each, besides what it
		// still held of the service's grants (lease_max, 8, each).
		limit := procs * (global.Burst + global.Rate*(up-down-fallback) + 8)
		t.Logf("%d admitted, %d while the service was failing past the fallback time (bound %.0f), %d in the last second", len(f.admitted), during, limit, after)
		if during == 0 || float64(during) > limit {
			t.Errorf("%d admitted by the local fallback; want some, at most N × (burst + rate × T + lease_max) = %.0f", during, limit)
		}
		// The service back: calls go out again and lease (the window
		// check from then on).
		if after == 0 || float64(after) > global.Burst+global.Rate {
			t.Errorf("%d admitted in the last second, want some and at most %.0f", after, global.Burst+global.Rate)
		}
	})
}
