package filter_test

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
)

const leaseCfg = `{"rules":[
	{"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,
	 "limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`

// leaseDesc is one descriptor of a request the filter sent, decoded by the
// test's own protobuf reader.
type leaseDesc struct {
	entries map[string]string
	hits    uint64
}

func readVarint(b []byte) (uint64, int) {
	var v uint64
	for i := 0; i < len(b) && i < 10; i++ {
		v |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return v, i + 1
		}
	}
	return 0, 0
}

// walk calls f for each field of a message (varints and length-delimited
// fields only: all a RateLimitRequest has).
func walk(t *testing.T, b []byte, f func(num int, v uint64, data []byte)) {
	t.Helper()
	for len(b) > 0 {
		tag, n := readVarint(b)
		if n == 0 {
			t.Fatalf("bad tag in %x", b)
		}
		b = b[n:]
		switch tag & 7 {
		case 0:
			v, n := readVarint(b)
			b = b[n:]
			f(int(tag>>3), v, nil)
		case 2:
			l, n := readVarint(b)
			f(int(tag>>3), 0, b[n:n+int(l)])
			b = b[n+int(l):]
		default:
			t.Fatalf("wire type %d", tag&7)
		}
	}
}

func decodeCall(t *testing.T, c filtertest.Call) []leaseDesc {
	t.Helper()
	if len(c.Body) < 5 || int(binary.BigEndian.Uint32(c.Body[1:5])) != len(c.Body)-5 {
		t.Fatalf("body %x is not one gRPC frame", c.Body)
	}
	var ds []leaseDesc
	walk(t, c.Body[5:], func(num int, _ uint64, data []byte) {
		if num != 2 {
			return
		}
		d := leaseDesc{entries: map[string]string{}}
		walk(t, data, func(num int, _ uint64, data []byte) {
			switch num {
			case 1:
				var k, v string
				walk(t, data, func(num int, _ uint64, s []byte) {
					if num == 1 {
						k = string(s)
					} else {
						v = string(s)
					}
				})
				d.entries[k] = v
			case 3:
				walk(t, data, func(_ int, v uint64, _ []byte) { d.hits = v })
			}
		})
		ds = append(ds, d)
	})
	return ds
}

// leaseAnswer encodes a RateLimitResponse with one status: code, the
// grant's quota (requests: the grant's whole amount, id) when id != "",
// and duration_until_reset.
func leaseAnswer(code uint64, requests uint64, id string, resetSec uint64) filtertest.CallResponse {
	return leaseAnswerLeft(code, requests, id, resetSec, 1000)
}

// leaseAnswerLeft is leaseAnswer with limit_remaining, the free tokens the
// global bucket has left.
func leaseAnswerLeft(code uint64, requests uint64, id string, resetSec, left uint64) filtertest.CallResponse {
	var st pb
	st = st.uint(1, code).uint(3, left)
	if resetSec > 0 {
		st = st.bytes(4, pb(nil).uint(1, resetSec))
	}
	if id != "" {
		st = st.bytes(5, pb(nil).uint(1, requests).bytes(3, []byte(id)))
	}
	var m pb
	m = m.uint(1, code).bytes(2, st)
	framed := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(framed[1:], uint32(len(m)))
	return grpcOK(append(framed, m...))
}

// record returns the allowance record of 192.0.2.1's bucket.
func record(t *testing.T, f *fixture) sharedstate.LeaseRecord {
	t.Helper()
	return recordOf(t, f, "tl:lease-ip:192.0.2.1")
}

func recordOf(t *testing.T, f *fixture, key string) sharedstate.LeaseRecord {
	t.Helper()
	v, _, err := f.h.Store.Get(key)
	if err != nil {
		return sharedstate.LeaseRecord{}
	}
	r, err := sharedstate.ParseLeaseRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// leaseCall decodes call i of h, checks that it is a lease request (a
// holder) dispatched with no stream effective (a stream's calls die with
// it in Envoy), and returns its entries.
func leaseCall(t *testing.T, h *filtertest.Host, i int) map[string]string {
	t.Helper()
	if i >= len(h.Calls) {
		t.Fatalf("call %d of %d", i, len(h.Calls))
	}
	d := decodeCall(t, h.Calls[i])
	if len(d) != 1 || d[0].entries["tokengate_holder"] == "" {
		t.Fatalf("call %d: %+v, want a lease request", i, d)
	}
	if h.Calls[i].Stream != 0 {
		t.Fatalf("lease call %d made while stream %d was effective", i, h.Calls[i].Stream)
	}
	return d[0].entries
}

// exactTake decodes call i of h, checks that it is an exact take from a
// lease rule's bucket (no holder: nothing is held) dispatched with no
// stream effective, and returns its cost.
func exactTake(t *testing.T, h *filtertest.Host, i int) uint64 {
	t.Helper()
	if i >= len(h.Calls) {
		t.Fatalf("call %d of %d", i, len(h.Calls))
	}
	d := decodeCall(t, h.Calls[i])
	if len(d) != 1 || d[0].entries["tokengate_mode"] != "lease" || d[0].entries["tokengate_holder"] != "" || d[0].entries["tokengate_want"] != "" {
		t.Fatalf("call %d: %+v, want an exact take", i, d)
	}
	if h.Calls[i].Stream != 0 {
		t.Fatalf("exact take %d made while stream %d was effective", i, h.Calls[i].Stream)
	}
	return d[0].hits
}

// takeAnswer is the service's answer to an exact take: its code, the
// tokens it left (limit_remaining) and, for OVER_LIMIT, the wait.
func takeAnswer(code, left, resetSec uint64) filtertest.CallResponse {
	return grpcOK(rlsResponse(code, []rlsStatus{{code, left, resetSec}}))
}

// TestLeaseMode walks a lease rule through its life on the test host with
// a fake clock: the cold requests wait for one exact take of their total
// cost, and leasing starts when requests keep coming; admissions from the
// allowance make no call; a spent allowance triggers one immediate refill
// that the waiting requests share; known empty (429 without a call until
// the retry time); expiry; reports; a lost answer; release of idle tokens;
// one refiller per process; the service down; refunds.
func TestLeaseMode(t *testing.T) {
	req := filtertest.Get("/", "192.0.2.1:5000")

	// warm returns a fixture whose allowance holds 8 tokens (grant 7),
	// sent at epoch; its refill period ends at epoch+0.1. Its first
	// request took its token exactly, its second started the lease.
	warm := func(t *testing.T, cfg string) *fixture {
		t.Helper()
		f := newFixture(t, cfg)
		if f.h.TickPeriod() != 100 {
			t.Fatalf("tick period %d ms, want 100", f.h.TickPeriod())
		}
		_, res := f.h.Start(f.p, req)
		if res.RequestAction != filter.Pause || len(f.h.Calls) != 0 || f.h.TickPeriod() != 1 {
			t.Fatalf("cold request: action %v, %d calls, tick %d ms; want it to wait, the tick at 1 ms", res.RequestAction, len(f.h.Calls), f.h.TickPeriod())
		}
		f.h.Tick(f.p)
		if n := exactTake(t, f.h, 0); n != 1 {
			t.Fatalf("cold: an exact take of %d, want 1", n)
		}
		// While the call is out, more ticks send nothing.
		f.h.Tick(f.p)
		if len(f.h.Calls) != 1 {
			t.Fatalf("%d calls: a second call while one is out", len(f.h.Calls))
		}
		f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 19, 0))
		if r := record(t, f); len(f.h.Continued) != 1 || r.Tokens != 0 || r.Taken != 0 || r.Grant != 0 {
			t.Fatalf("continued %v, record %+v; want the request admitted and nothing held", f.h.Continued, r)
		}
		// A second request within the refill period: demand continues,
		// and its call is a lease request.
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
			t.Fatalf("second request %v, want it to wait", res.RequestAction)
		}
		f.h.Tick(f.p)
		e := leaseCall(t, f.h, 1)
		// 1 request over a refill period (10/s), for a tick plus twice the
		// measured round trip (the minimum sample, 0.1 ms), twice: 3.
		if e["tokengate_grant"] != "0" || e["tokengate_unspent"] != "0" || e["tokengate_want"] != "3" || e["tokengate_release"] != "" ||
			e["tokengate_rule"] != "lease-ip" || e["key"] != "192.0.2.1" || e["tokengate_mode"] != "lease" {
			t.Fatalf("first lease request %v", e)
		}
		f.h.Deliver(f.p, f.h.Calls[1].Token, leaseAnswer(1, 9, "7", 0))
		if len(f.h.Continued) != 2 {
			t.Fatalf("continued %v, want the waiting request", f.h.Continued)
		}
		if r := record(t, f); r.Tokens != 8 || r.Grant != 7 || r.Claim != 0 || r.Expiry != epoch+2 {
			t.Fatalf("record after the grant %+v", r)
		}
		return f
	}

	t.Run("cold: the waiting requests share one exact take of their cost; more demand starts the lease", func(t *testing.T) {
		f := newFixture(t, leaseCfg)
		for range 3 {
			if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
				t.Fatalf("cold request: %v, want it to wait", res.RequestAction)
			}
		}
		f.now += 0.001
		f.h.Tick(f.p)
		if n := exactTake(t, f.h, 0); n != 3 || len(f.h.Calls) != 1 {
			t.Fatalf("%d calls, the first an exact take of %d; want one take of 3", len(f.h.Calls), n)
		}
		// A fourth request arrives while the take is out: it waits, for
		// the next call.
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || len(f.h.Calls) != 1 {
			t.Fatalf("request while the take is out: %v with %d calls", res.RequestAction, len(f.h.Calls))
		}
		f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 17, 0))
		if len(f.h.Continued) != 3 {
			t.Fatalf("continued %v, want the three requests the take was for", f.h.Continued)
		}
		// The fourth is demand within the refill period: the answering
		// worker asks for a lease at once, for at least twice the take.
		e := leaseCall(t, f.h, 1)
		if e["tokengate_want"] != "6" || len(f.h.Calls) != 2 {
			t.Fatalf("%d calls, then %v; want a lease request for 6", len(f.h.Calls), e)
		}
		if r := record(t, f); r.Taken != 0 || r.Tokens != 0 {
			t.Fatalf("record %+v: the take's tokens are spent, nothing held yet", r)
		}
		f.h.Deliver(f.p, f.h.Calls[1].Token, leaseAnswer(1, 6, "1", 0))
		if len(f.h.Continued) != 4 {
			t.Fatalf("continued %v, want all four waiting requests", f.h.Continued)
		}
		if r := record(t, f); r.Tokens != 5 {
			t.Fatalf("record %+v, want 6 - 1 left", r)
		}
		if got := f.counter("lease-ip", filter.CounterAllowed); got != 4 {
			t.Errorf("allowed = %d, want 4", got)
		}
		// The next tick sets the refill period back.
		f.now += 0.001
		f.h.Tick(f.p)
		f.h.Tick(f.p)
		if f.h.TickPeriod() != 100 {
			t.Fatalf("tick period %d ms with nothing waiting, want 100", f.h.TickPeriod())
		}
	})

	t.Run("a take refused for more than the bucket has takes what it has", func(t *testing.T) {
		f := newFixture(t, leaseCfg)
		for range 3 {
			f.h.Start(f.p, req)
		}
		f.h.Tick(f.p)
		if n := exactTake(t, f.h, 0); n != 3 {
			t.Fatalf("an exact take of %d, want 3", n)
		}
		// Only 2 left: refused. The answering worker takes the 2 at once,
		// for the same requests.
		f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(2, 2, 1))
		if len(f.h.Calls) != 2 || f.h.Response.Local != nil || len(f.h.Continued) != 0 {
			t.Fatalf("%d calls, reply %+v, continued %v; want a second take and the requests waiting", len(f.h.Calls), f.h.Response.Local, f.h.Continued)
		}
		if n := exactTake(t, f.h, 1); n != 2 {
			t.Fatalf("second take of %d, want 2", n)
		}
		resp := f.h.Deliver(f.p, f.h.Calls[1].Token, takeAnswer(1, 0, 0))
		if len(f.h.Continued) != 2 || resp.Local == nil || resp.Local.Status != 429 {
			t.Fatalf("continued %v, reply %+v; want two admitted and the third a 429", f.h.Continued, resp.Local)
		}
		if r := record(t, f); r.Taken != 0 || r.Wait != 0 || r.Retry != epoch+0.1 {
			t.Fatalf("record %+v, want the take spent and the bucket empty until the period ends", r)
		}
		// Refused again: the bucket is empty until its reset.
		f2 := newFixture(t, leaseCfg)
		for range 3 {
			f2.h.Start(f2.p, req)
		}
		f2.h.Tick(f2.p)
		f2.h.Deliver(f2.p, f2.h.Calls[0].Token, takeAnswer(2, 2, 1))
		f2.h.Deliver(f2.p, f2.h.Calls[1].Token, takeAnswer(2, 0, 4))
		if len(f2.h.Calls) != 2 || len(f2.h.Continued) != 0 || f2.counter("lease-ip", filter.CounterRejected) != 3 {
			t.Fatalf("%d calls, continued %v, %d rejected; want all three rejected after two takes",
				len(f2.h.Calls), f2.h.Continued, f2.counter("lease-ip", filter.CounterRejected))
		}
		if r := record(t, f2); r.Retry != epoch+4 {
			t.Fatalf("record %+v, want the bucket empty for 4 s", r)
		}
	})

	t.Run("cold again once the refill period is over: each request taken exactly, nothing held", func(t *testing.T) {
		f := newFixture(t, leaseCfg)
		for i := range 4 {
			if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
				t.Fatalf("request %d: %v, want it to wait", i, res.RequestAction)
			}
			f.h.Tick(f.p)
			if n := exactTake(t, f.h, i); n != 1 || len(f.h.Calls) != i+1 {
				t.Fatalf("request %d: %d calls, an exact take of %d; want one take of 1", i, len(f.h.Calls), n)
			}
			f.h.Deliver(f.p, f.h.Calls[i].Token, takeAnswer(1, uint64(19-i), 0))
			if r := record(t, f); len(f.h.Continued) != i+1 || r.Tokens != 0 || r.Taken != 0 || r.Wait != 0 {
				t.Fatalf("request %d: continued %v, record %+v; want it admitted and nothing held", i, f.h.Continued, r)
			}
			// A tick a period later: no lease to renew, nothing to send.
			f.now += 0.101
			f.h.Tick(f.p)
			if len(f.h.Calls) != i+1 {
				t.Fatalf("request %d: a periodic call for a process that holds no lease", i)
			}
		}
	})

	t.Run("admitted from the allowance; spent: one immediate refill, shared", func(t *testing.T) {
		f := warm(t, leaseCfg)
		for i := range 8 {
			if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Continue || res.Status() != 200 {
				t.Fatalf("request %d: %v %d, want admitted locally", i, res.RequestAction, res.Status())
			}
		}
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls: admissions from the allowance must not call", len(f.h.Calls))
		}
		// Spent: the next requests wait; one refill goes out at the next
		// tick, within the refill period (the last grant was full).
		for range 3 {
			if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
				t.Fatalf("spent allowance: %v, want the request to wait", res.RequestAction)
			}
		}
		f.now += 0.01
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 {
			t.Fatalf("%d calls, want one immediate refill", len(f.h.Calls))
		}
		if e := leaseCall(t, f.h, 2); e["tokengate_want"] != "8" || e["tokengate_grant"] != "7" || e["tokengate_unspent"] != "0" {
			t.Fatalf("refill %v, want lease_max 8 reporting grant 7 spent", e)
		}
		f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 8, "8", 0))
		if len(f.h.Continued) != 5 || record(t, f).Tokens != 5 {
			t.Fatalf("continued %v, record %+v; want the three waiting requests resumed, 5 left", f.h.Continued, record(t, f))
		}
		// Once the allowance has expired, a request waits, and the
		// process is cold again: its call is an exact take.
		f.now += 2.1
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || len(f.h.Calls) != 3 {
			t.Fatalf("expired allowance: %v with %d calls, want it to wait", res.RequestAction, len(f.h.Calls))
		}
		f.h.Tick(f.p)
		if n := exactTake(t, f.h, 3); n != 1 {
			t.Fatalf("after the lease expired: an exact take of %d, want 1", n)
		}
	})

	t.Run("known empty: 429 without a call until the retry time", func(t *testing.T) {
		f := warm(t, leaseCfg)
		for range 8 {
			f.h.Start(f.p, req)
		}
		f.h.Start(f.p, req) // waits
		f.h.Tick(f.p)
		resp := f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(2, 0, "8", 3))
		if resp.Local == nil || resp.Local.Status != 429 {
			t.Fatalf("reply %+v, want 429 for the waiting request", resp.Local)
		}
		if r := record(t, f); r.Wait != 0 {
			t.Fatalf("record %+v: a rejected request still counted as waiting", r)
		}
		_, res := f.h.Start(f.p, req)
		if res.Status() != 429 || len(f.h.Calls) != 3 {
			t.Fatalf("status %d with %d calls, want a local 429", res.Status(), len(f.h.Calls))
		}
		if ra, _ := findHeader(res.Response.Local.Headers, "retry-after"); ra < "3" {
			t.Errorf("retry-after %q", ra)
		}
		f.now += 1
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 {
			t.Errorf("a tick asked for a lease of a bucket known empty")
		}
		f.now += 2.01
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
			t.Fatalf("after the retry time: %v, want the request to wait for a refill", res.RequestAction)
		}
		f.h.Tick(f.p)
		// The grant has expired meanwhile: the process is cold, and takes
		// exactly what waits.
		if n := exactTake(t, f.h, 3); n != 1 || len(f.h.Calls) != 4 {
			t.Fatalf("%d calls after the retry time, the last a take of %d; want one exact take of 1", len(f.h.Calls), n)
		}
	})

	t.Run("partial grant: the bucket is empty until the next refill period", func(t *testing.T) {
		f := warm(t, leaseCfg)
		for range 8 {
			f.h.Start(f.p, req)
		}
		f.h.Start(f.p, req) // waits
		f.now += 0.01
		f.h.Tick(f.p)
		// 2 of the 8 asked for, nothing left: one serves the waiting
		// request, one the next, then 429 locally until epoch+0.11.
		f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswerLeft(1, 2, "8", 0, 0))
		if len(f.h.Continued) != 3 {
			t.Fatalf("continued %v", f.h.Continued)
		}
		if _, res := f.h.Start(f.p, req); res.Status() != 200 {
			t.Fatalf("second token: %d", res.Status())
		}
		if _, res := f.h.Start(f.p, req); res.Status() != 429 || len(f.h.Calls) != 3 {
			t.Fatalf("after a partial grant: %d with %d calls, want a local 429", res.Status(), len(f.h.Calls))
		}
		f.now += 0.1
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
			t.Fatalf("next refill period: %v, want the request to wait", res.RequestAction)
		}
		f.h.Tick(f.p)
		if len(f.h.Calls) != 4 {
			t.Fatalf("%d calls, want the refill", len(f.h.Calls))
		}
		leaseCall(t, f.h, 3) // the grant lives: a lease request
	})

	t.Run("renewal reports the unspent tokens; the answer counts what was spent meanwhile", func(t *testing.T) {
		f := warm(t, leaseCfg)
		for range 6 {
			f.h.Start(f.p, req)
		}
		f.now += 0.1
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 {
			t.Fatalf("%d calls, want a renewal", len(f.h.Calls))
		}
		if e := leaseCall(t, f.h, 2); e["tokengate_grant"] != "7" || e["tokengate_unspent"] != "2" {
			t.Fatalf("renewal %v, want grant 7 and 2 unspent", e)
		}
		// One more request spends while the call is out. The new grant is
		// 2 carried over + 5: 7, less the one spent since the report.
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 7, "9", 0))
		if r := record(t, f); r.Tokens != 6 || r.Grant != 9 || r.Expiry != epoch+0.1+2 {
			t.Fatalf("record %+v, want 6 under grant 9", r)
		}
	})

	t.Run("a report the service no longer covers is not counted again", func(t *testing.T) {
		// The audit's lost answer: a renewal the service granted, whose
		// answer timed out; the next renewal names the old grant, which
		// the service replaced, so it carries nothing over (requests = the
		// new tokens only). The proxy must drop the reported tokens, not
		// re-date them.
		f := warm(t, leaseCfg)
		for range 6 {
			f.h.Start(f.p, req)
		}
		f.now += 0.1
		f.h.Tick(f.p)
		f.h.Deliver(f.p, f.h.Calls[2].Token, filtertest.CallResponse{}) // timed out
		if r := record(t, f); r.Tokens != 2 || r.Grant != 7 || r.Claim != 0 {
			t.Fatalf("record %+v, want the 2 held tokens kept under grant 7", r)
		}
		f.h.Start(f.p, req) // 1 left
		f.now += 0.1
		f.h.Tick(f.p)
		if e := leaseCall(t, f.h, 3); e["tokengate_grant"] != "7" || e["tokengate_unspent"] != "1" {
			t.Fatalf("renewal %v", e)
		}
		f.h.Deliver(f.p, f.h.Calls[3].Token, leaseAnswer(1, 3, "11", 0))
		if r := record(t, f); r.Tokens != 3 || r.Grant != 11 {
			t.Fatalf("record %+v, want only the 3 new tokens (the service carried none over)", r)
		}
	})

	t.Run("idle tokens are released", func(t *testing.T) {
		f := warm(t, leaseCfg)
		n := len(f.h.Calls)
		f.now += 0.2
		f.h.Tick(f.p) // enough held: the demand window starts again
		if len(f.h.Calls) != n {
			t.Fatalf("%d calls, want none: 8 held cover the demand", len(f.h.Calls))
		}
		f.now += 1.01 // no demand for half the ttl
		f.h.Tick(f.p)
		if len(f.h.Calls) != n+1 {
			t.Fatalf("%d calls, want a release", len(f.h.Calls))
		}
		e := leaseCall(t, f.h, n)
		if e["tokengate_release"] != "1" || e["tokengate_unspent"] != "8" || e["tokengate_grant"] != "7" {
			t.Fatalf("release %v, want 8 of grant 7 returned", e)
		}
		if r := record(t, f); r.Tokens != 0 {
			t.Fatalf("record %+v: tokens being returned must not be spendable", r)
		}
		f.h.Deliver(f.p, f.h.Calls[n].Token, leaseAnswer(1, 0, "", 0))
		if r := record(t, f); r.Tokens != 0 || r.Claim != 0 || r.Hold != 0 {
			t.Fatalf("record %+v after the release", r)
		}
	})

	t.Run("one refiller per process; other workers' requests share its refill", func(t *testing.T) {
		f := newFixture(t, leaseCfg)
		h2 := f.h.NewWorker()
		p2 := filter.NewPlugin(h2)
		p2.Clock = func() float64 { return f.now }
		if !p2.OnConfigure([]byte(leaseCfg)) {
			t.Fatal("configure")
		}
		f.h.Start(f.p, req)
		h2.Start(p2, req)
		f.h.Tick(f.p)
		h2.Tick(p2)
		if n := len(f.h.Calls) + len(h2.Calls); n != 1 {
			t.Fatalf("%d calls, want one call for both workers", n)
		}
		// Worker 1 took exactly what both workers' requests cost, and
		// resumes its request; worker 2's request is resumed by its next
		// tick, with no call.
		if n := exactTake(t, f.h, 0); n != 2 {
			t.Fatalf("an exact take of %d, want 2", n)
		}
		f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 18, 0))
		f.now += 0.001
		if got := h2.Tick(p2); len(got) != 1 || len(h2.Calls) != 0 {
			t.Fatalf("worker 2 resumed %v with %d calls, want its request and no call", got, len(h2.Calls))
		}
		if r := record(t, f); r.Taken != 0 {
			t.Fatalf("record %+v: the take's tokens not all spent by the requests it was for", r)
		}
		// Worker 2's next request waits; the take was granted in full, so
		// its call, a lease request for twice as much, goes out at once.
		h2.Start(p2, req)
		h2.Tick(p2)
		if len(h2.Calls) != 1 {
			t.Fatalf("worker 2: %d calls, want the lease request", len(h2.Calls))
		}
		if e := leaseCall(t, h2, 0); e["tokengate_want"] != "4" {
			t.Fatalf("lease request %v, want 4", e)
		}
		// ... worker 2 dies with it. Worker 1's requests wait until the
		// claim lapses (timeout + 1 s), then it asks.
		f.h.Start(f.p, req)
		f.h.Tick(f.p)
		if len(f.h.Calls) != 1 {
			t.Fatalf("worker 1 asked while worker 2's call was out")
		}
		f.now += 0.05 + 1.01
		f.h.Start(f.p, req)
		f.h.Tick(f.p)
		if len(f.h.Calls) != 2 {
			t.Fatalf("worker 1: %d calls, want a call once the claim lapsed", len(f.h.Calls))
		}
		// Its first request gave up (on_error) and is no longer counted:
		// the take is for the one still waiting.
		if n := exactTake(t, f.h, 1); n != 1 {
			t.Fatalf("an exact take of %d, want 1", n)
		}
	})

	// Issue 21, lease fairness: a refill that another worker applied
	// reaches this worker's waiting requests at its next tick; a request
	// arriving at this worker before that tick took the tokens first, and
	// the request that had waited longer kept waiting (until its deadline:
	// on_error) while later ones went through.
	t.Run("a request does not overtake the waiting requests of its worker", func(t *testing.T) {
		f := warm(t, leaseCfg)
		h2 := f.h.NewWorker()
		p2 := filter.NewPlugin(h2)
		p2.Clock = func() float64 { return f.now }
		if !p2.OnConfigure([]byte(leaseCfg)) {
			t.Fatal("configure")
		}
		for range 8 {
			f.h.Start(f.p, req) // the allowance spent
		}
		if _, res := h2.Start(p2, req); res.RequestAction != filter.Pause { // stream 1 of worker 2
			t.Fatalf("worker 2: %v, want its request to wait", res.RequestAction)
		}
		f.h.Start(f.p, req) // waits too
		f.now += 0.001
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 || len(h2.Calls) != 0 {
			t.Fatalf("%d and %d calls, want worker 1's refill", len(f.h.Calls), len(h2.Calls))
		}
		// 2 tokens: one for worker 1's waiting request (at once), one
		// for worker 2's.
		f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 2, "8", 0))
		if r := record(t, f); r.Tokens != 1 {
			t.Fatalf("record %+v, want 1 left after worker 1's request", r)
		}
		// A later request at worker 2, before its tick: it waits behind
		// the one that came first, which the tick serves.
		if _, res := h2.Start(p2, req); res.RequestAction != filter.Pause {
			t.Fatalf("a later request: %v, want it to wait behind the earlier one", res.RequestAction)
		}
		f.now += 0.001
		if got := h2.Tick(p2); len(got) != 1 || got[0] != 1 {
			t.Fatalf("worker 2's tick resumed %v, want its first request (1)", got)
		}
	})

	t.Run("one periodic refill per period per process, whatever the workers' phases", func(t *testing.T) {
		f := warm(t, leaseCfg) // worker 1 refilled at epoch
		h2 := f.h.NewWorker()
		p2 := filter.NewPlugin(h2)
		p2.Clock = func() float64 { return f.now }
		if !p2.OnConfigure([]byte(leaseCfg)) {
			t.Fatal("configure")
		}
		for range 6 {
			h2.Start(p2, req) // demand from another worker, 2 left
		}
		// 80 ms after the refill's dispatch, a tick (another phase) must
		// not refill again; from 90 ms on (a period less a tenth, for
		// early ticks) one does, once.
		f.now += 0.08
		h2.Tick(p2)
		f.h.Tick(f.p)
		if len(f.h.Calls)+len(h2.Calls) != 2 {
			t.Fatalf("%d calls: a second refill within one period", len(f.h.Calls)+len(h2.Calls))
		}
		f.now += 0.015
		f.h.Tick(f.p)
		h2.Tick(p2)
		if len(f.h.Calls)+len(h2.Calls) != 3 {
			t.Fatalf("%d calls: want one refill a period later", len(f.h.Calls)+len(h2.Calls))
		}
		leaseCall(t, f.h, 2)
	})

	t.Run("the timer keeps the refill period; early ticks do not refill", func(t *testing.T) {
		f := warm(t, leaseCfg)
		for range 6 {
			f.h.Start(f.p, req) // demand: the next refill is wanted
		}
		// Ticks every 10 ms (as delayed admission may set them): the
		// period stays 100 ms with nothing waiting, and the refill runs
		// once in 100 ms, not on every tick.
		f.now += 0.005
		for range 10 {
			f.now += 0.01
			f.h.Tick(f.p)
			if got := f.h.TickPeriod(); got != 100 {
				t.Fatalf("tick period %d ms with a lease rule and nothing waiting, want 100", got)
			}
		}
		if len(f.h.Calls) != 3 {
			t.Fatalf("%d calls after ten 10 ms ticks, want one refill", len(f.h.Calls))
		}
	})

	t.Run("an answer that comes after its claim was replaced is dropped", func(t *testing.T) {
		// Another worker's claim replaces ours.
		replace := func(f *fixture, key string) {
			v, cas, _ := f.h.Store.Get(key)
			r, _ := sharedstate.ParseLeaseRecord(v)
			r.Claimer++
			f.h.Store.Set(key, sharedstate.AppendLeaseRecord(nil, r), cas)
		}
		f := newFixture(t, leaseCfg)
		f.h.Start(f.p, req)
		f.h.Tick(f.p)
		exactTake(t, f.h, 0)
		replace(f, "tl:lease-ip:192.0.2.1")
		f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 19, 0))
		if r := record(t, f); r.Taken != 0 || len(f.h.Continued) != 0 {
			t.Fatalf("record %+v, continued %v: a take without our claim was applied", r, f.h.Continued)
		}
		// A lease request's grant, on a warm bucket.
		f = warm(t, leaseCfg)
		for range 9 {
			f.h.Start(f.p, req) // the 9th waits
		}
		f.h.Tick(f.p)
		leaseCall(t, f.h, 2)
		replace(f, "tl:lease-ip:192.0.2.1")
		f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 8, "3", 0))
		if r := record(t, f); r.Tokens != 0 || r.Grant != 7 || len(f.h.Continued) != 2 {
			t.Fatalf("record %+v, continued %v: a grant without our claim was applied", r, f.h.Continued)
		}
	})

	// lease_fallback_ms 0: on_error at the first failure, as before it
	// existed (the default waits through transient failures:
	// TestLeaseTransientFailures).
	denyCfg := strings.Replace(leaseCfg, `"lease_tick_ms":100`, `"lease_tick_ms":100,"on_error":"deny","lease_fallback_ms":0`, 1)

	t.Run("service down: held tokens are spent, then the requests that wait meet on_error", func(t *testing.T) {
		f := warm(t, denyCfg)
		for range 6 {
			f.h.Start(f.p, req)
		}
		f.now += 0.1
		f.h.Tick(f.p)
		f.h.Deliver(f.p, f.h.Calls[2].Token, filtertest.CallResponse{})
		for range 2 {
			if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Continue {
				t.Fatal("held tokens not spent while the service is down")
			}
		}
		// Spent: the next request waits for the next call, which goes out
		// at the end of the refill period (not at once: one call a period
		// while the service fails), and meets on_error when it fails.
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
			t.Fatalf("spent while the service is down: %v, want it to wait for the next call", res.RequestAction)
		}
		f.now += 0.05
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 {
			t.Fatalf("%d calls: a retry within the refill period of the failed call", len(f.h.Calls))
		}
		f.now += 0.051
		f.h.Tick(f.p)
		if len(f.h.Calls) != 4 {
			t.Fatalf("%d calls, want the retry a period after the failed one", len(f.h.Calls))
		}
		if resp := f.h.Deliver(f.p, f.h.Calls[3].Token, filtertest.CallResponse{}); resp.Local == nil || resp.Local.Status != 503 {
			t.Fatalf("reply %+v, want on_error's 503", resp.Local)
		}
		// The service is back: a waiting request gets the next grant.
		f.now += 0.101
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
			t.Fatalf("%v, want the request to wait", res.RequestAction)
		}
		f.h.Tick(f.p)
		f.h.Deliver(f.p, f.h.Calls[4].Token, leaseAnswer(1, 4, "12", 0))
		if n := len(f.h.Continued); n != 3 || f.h.Continued[n-1] != 12 {
			t.Fatalf("continued %v, want the waiting request resumed", f.h.Continued)
		}
		if r := record(t, f); r.Down != 0 || r.Tokens != 3 {
			t.Fatalf("record %+v, want Down cleared and 3 left", r)
		}
	})

	t.Run("no refill in time: on_error", func(t *testing.T) {
		f := newFixture(t, denyCfg)
		f.h.Start(f.p, req)
		f.h.Tick(f.p) // the call goes out and is never answered
		f.now += 0.249
		f.h.Tick(f.p)
		if f.h.Response.Local != nil {
			t.Fatalf("answered %+v before the deadline", f.h.Response.Local)
		}
		f.now += 0.002
		f.h.Tick(f.p)
		if f.h.Response.Local == nil || f.h.Response.Local.Status != 503 {
			t.Fatalf("reply %+v after 2 x lease_tick_ms + timeout_ms, want on_error's 503", f.h.Response.Local)
		}
	})

	t.Run("a waiting request whose client left is dropped", func(t *testing.T) {
		f := newFixture(t, leaseCfg)
		s, _ := f.h.Start(f.p, req)
		f.h.Tick(f.p)
		f.h.End(s, 1)
		f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 19, 0))
		if len(f.h.Continued) != 0 {
			t.Fatalf("continued %v: a stream that ended", f.h.Continued)
		}
		// Its token was taken for it, as an exact call's would be: it
		// stays with that take, which no other request spends.
		if r := record(t, f); r.Taken != 1 || r.Tokens != 0 {
			t.Fatalf("record %+v", r)
		}
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
			t.Fatalf("next request: %v, want it to wait (the left request's token is not its)", res.RequestAction)
		}
	})
}

// TestLeaseSizing: the lease request asks for enough for a refill period
// plus a round trip at twice the local rate observed since the last
// refill, the round trip measured from the answers (the timeout before any
// was), capped by lease_max.
func TestLeaseSizing(t *testing.T) {
	cfg := `{"rules":[{"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":100,"lease_ttl_ms":2000,
	 "limit_keys":["ip:address"],"algorithm_config":{"rps":1000,"burst":2000}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`
	req := filtertest.Get("/", "192.0.2.1:5000")
	f := newFixture(t, cfg)
	// Cold, the first request is taken exactly; the answer takes 2 ms (the
	// round trip is measured).
	f.h.Start(f.p, req)
	f.h.Tick(f.p)
	exactTake(t, f.h, 0)
	f.now += 0.002
	f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 1999, 0))
	// The next one is demand within the refill period: 1 request a
	// period (10/s) x (0.1 s + twice the round trip) x 2 = 3 (before any
	// round trip was measured it would be 0.1 + timeout_ms: 3 as well).
	f.h.Start(f.p, req)
	f.h.Tick(f.p)
	if e := leaseCall(t, f.h, 1); e["tokengate_want"] != "3" {
		t.Fatalf("first lease request %v, want 3", e)
	}
	// The answer takes 2 ms too and grants 50.
	f.now += 0.002
	f.h.Deliver(f.p, f.h.Calls[1].Token, leaseAnswer(1, 50, "1", 0))
	if r := record(t, f); math.Abs(r.RTT-0.002) > 1e-9 || r.Tokens != 49 || r.Used != 1 {
		t.Fatalf("record %+v, want RTT 0.002, 49 left, 1 used", r)
	}
	// 20 requests in the next 0.1 s, all admitted from the allowance; then
	// the periodic refill: 21 used in 0.1 s is 210/s, for 0.1 s plus twice
	// the round trip, twice: ceil(2 x 210 x 0.104) = 44; 29 held: 15 more.
	start := f.now
	for i := range 20 {
		f.now = start + float64(i+1)*0.005
		if _, res := f.h.Start(f.p, req); res.Status() != 200 {
			t.Fatalf("request %d: %d", i, res.Status())
		}
	}
	f.h.Tick(f.p)
	if e := leaseCall(t, f.h, 2); e["tokengate_want"] != "15" || e["tokengate_unspent"] != "29" {
		t.Fatalf("periodic refill %v, want 15 more for 29 held", e)
	}
	f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 44, "2", 0))
	// Ten times the rate: capped at lease_max 100.
	start = f.now
	for i := range 200 {
		f.now = start + float64(i+1)*0.0005
		f.h.Start(f.p, req)
	}
	f.h.Tick(f.p)
	e := leaseCall(t, f.h, len(f.h.Calls)-1)
	if w, _ := strconv.Atoi(e["tokengate_want"]); float64(w) != 100-mustFloat(t, e["tokengate_unspent"]) {
		t.Fatalf("refill %v, want up to lease_max 100", e)
	}
}

func mustFloat(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestLeaseAllOrNothing: a request one lease rule admitted and another
// rule rejects gets its lease tokens back, unless a lease request was sent
// since the debit (the report the service got did not count them: giving
// them back then could spend tokens it does not count).
func TestLeaseAllOrNothing(t *testing.T) {
	cfg := `{"rules":[
	 {"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,"limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}},
	 {"name":"lease-all","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,"algorithm_config":{"rps":10,"burst":20}},
	 {"name":"exact","scope":"cluster","limit_keys":["header:x-exact"],"algorithm_config":{"rps":10,"burst":20}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`
	req := filtertest.Get("/", "192.0.2.1:5000")
	f := newFixture(t, cfg)
	// Both lease buckets warm: the first request waits for an exact take
	// from each, the second for a lease of each.
	f.h.Start(f.p, req)
	f.h.Tick(f.p)
	if len(f.h.Calls) != 2 {
		t.Fatalf("%d calls, want a take for each lease rule", len(f.h.Calls))
	}
	for i := range 2 {
		exactTake(t, f.h, i)
		f.h.Deliver(f.p, f.h.Calls[i].Token, takeAnswer(1, 19, 0))
	}
	f.h.Start(f.p, req)
	f.h.Tick(f.p)
	if len(f.h.Calls) != 4 {
		t.Fatalf("%d calls, want a lease request for each lease rule", len(f.h.Calls))
	}
	for i := 2; i < 4; i++ {
		leaseCall(t, f.h, i)
		f.h.Deliver(f.p, f.h.Calls[i].Token, leaseAnswer(1, 5, strconv.Itoa(i+1), 0))
	}
	if len(f.h.Continued) != 2 {
		t.Fatalf("continued %v", f.h.Continued)
	}
	ipKey, allKey := "tl:lease-ip:192.0.2.1", "tl:lease-all:"
	if a, b := recordOf(t, f, ipKey).Tokens, recordOf(t, f, allKey).Tokens; a != 4 || b != 4 {
		t.Fatalf("tokens %v and %v, want 4 each", a, b)
	}
	// lease-all becomes known empty: a request lease-ip admits is
	// rejected by lease-all, and lease-ip's token comes back.
	v, cas, _ := f.h.Store.Get(allKey)
	r, _ := sharedstate.ParseLeaseRecord(v)
	r.Tokens, r.Retry = 0, f.now+5
	f.h.Store.Set(allKey, sharedstate.AppendLeaseRecord(nil, r), cas)
	if _, res := f.h.Start(f.p, req); res.Status() != 429 {
		t.Fatalf("status %d, want 429 from lease-all", res.Status())
	}
	if got := recordOf(t, f, ipKey).Tokens; got != 4 {
		t.Fatalf("lease-ip holds %v, want its token given back (4)", got)
	}
	r.Retry = 0
	r.Tokens = 4
	_, cas, _ = f.h.Store.Get(allKey)
	f.h.Store.Set(allKey, sharedstate.AppendLeaseRecord(nil, r), cas)
	// With an exact rule: both lease rules admit, the exact call goes out;
	// it rejects: both lease tokens come back.
	exact := filtertest.Get("/", "192.0.2.1:5000", "x-exact", "a")
	_, res := f.h.Start(f.p, exact)
	if res.RequestAction != filter.Pause || len(f.h.Calls) != 5 {
		t.Fatalf("%v with %d calls, want the exact call", res.RequestAction, len(f.h.Calls))
	}
	if a, b := recordOf(t, f, ipKey).Tokens, recordOf(t, f, allKey).Tokens; a != 3 || b != 3 {
		t.Fatalf("tokens %v and %v while the exact call is out, want 3 each", a, b)
	}
	f.h.Deliver(f.p, f.h.Calls[4].Token, grpcOK(rlsResponse(2, []rlsStatus{{code: 2, resetSec: 1}})))
	if a, b := recordOf(t, f, ipKey).Tokens, recordOf(t, f, allKey).Tokens; a != 4 || b != 4 {
		t.Fatalf("tokens %v and %v after the exact rule rejected, want 4 each (given back)", a, b)
	}
	// Again, but a renewal of lease-ip is sent while the exact call is
	// out: its report did not count the debited token, so it stays spent.
	f.h.Start(f.p, exact)
	f.now += 0.1
	f.h.Tick(f.p) // periodic: both lease buckets renew
	if len(f.h.Calls) != 8 {
		t.Fatalf("%d calls, want the exact call and two renewals", len(f.h.Calls))
	}
	f.h.Deliver(f.p, f.h.Calls[5].Token, grpcOK(rlsResponse(2, []rlsStatus{{code: 2, resetSec: 1}})))
	if a := recordOf(t, f, ipKey).Tokens; a != 3 {
		t.Fatalf("lease-ip holds %v, want 3: a token debited before a report is not given back", a)
	}
}

// TestLeaseShadowAndMixed: a lease rule of a shadow policy never rejects
// nor waits; a lease rule without allowance in a request that makes an
// exact call anyway joins that call as an exact take.
func TestLeaseShadowAndMixed(t *testing.T) {
	cfg := `{"bundle_version":1,"policies":[{"id":"w","spec":{"mode":"shadow","rules":[
	 {"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,"limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}]}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`
	f := newFixture(t, cfg)
	if _, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000")); res.RequestAction != filter.Continue || len(f.h.Calls) != 0 {
		t.Fatalf("shadow lease rule: %v with %d calls, want the request through", res.RequestAction, len(f.h.Calls))
	}
	if got := f.counter("lease-ip", filter.CounterShadowRejected); got != 1 {
		t.Errorf("shadow_rejected = %d, want 1", got)
	}

	cfg = `{"rules":[
	 {"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,"limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}},
	 {"name":"exact","scope":"cluster","algorithm_config":{"rps":10,"burst":20}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`
	f = newFixture(t, cfg)
	if _, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000")); res.RequestAction != filter.Pause || len(f.h.Calls) != 1 {
		t.Fatalf("mixed: %v with %d calls, want one exact call", res.RequestAction, len(f.h.Calls))
	}
	d := decodeCall(t, f.h.Calls[0])
	if len(d) != 2 || d[1].entries["tokengate_mode"] != "lease" || d[1].entries["tokengate_holder"] != "" || d[1].hits != 1 {
		t.Fatalf("descriptors %+v, want the exact rule's and an exact take of the lease rule", d)
	}
}

func TestLeaseConfigErrors(t *testing.T) {
	base := `{"rules":[{"name":"r","scope":"SCOPE","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}EXTRA}],
		"settings":{"rls":{"cluster":"rls"RLS}}}`
	tests := []struct {
		name, scope, extra, rls, want string
	}{
		{"lease needs cluster", "local", `,"mode":"lease"`, "", `rules[0].mode: "lease" needs "scope": "cluster"`},
		{"unknown mode", "cluster", `,"mode":"cached"`, "", `rules[0].mode: must be "exact" or "lease", got "cached"`},
		{"lease_max without lease", "cluster", `,"lease_max":5`, "", `rules[0].lease_max: needs "mode": "lease"`},
		{"lease_max over burst", "cluster", `,"mode":"lease","lease_max":21`, "", `rule "r": lease_max (21) must not exceed the burst (20)`},
		{"lease_max zero", "cluster", `,"mode":"lease","lease_max":0`, "", `rules[0].lease_max: must be an integer from 1 to 1073741824 (tokens), got 0`},
		{"ttl too short for the tick", "cluster", `,"mode":"lease","lease_ttl_ms":200`, `,"lease_tick_ms":100`, `lease_ttl_ms (200) must exceed twice settings.rls.lease_tick_ms plus settings.rls.timeout_ms (260)`},
		{"tick out of range", "cluster", `,"mode":"lease"`, `,"lease_tick_ms":5`, `settings.rls.lease_tick_ms: must be an integer from 10 to 10000, got 5`},
		{"fallback out of range", "cluster", `,"mode":"lease"`, `,"lease_fallback_ms":60001`, `settings.rls.lease_fallback_ms: must be an integer from 0 to 60000, got 60001`},
		{"fallback negative", "cluster", `,"mode":"lease"`, `,"lease_fallback_ms":-1`, `settings.rls.lease_fallback_ms: must be an integer from 0 to 60000, got -1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := strings.NewReplacer("SCOPE", tc.scope, "EXTRA", tc.extra, "RLS", tc.rls).Replace(base)
			_, err := config.Parse([]byte(cfg))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	cfg, err := config.Parse([]byte(strings.NewReplacer("SCOPE", "cluster", "EXTRA", `,"mode":"lease"`, "RLS", "").Replace(base)))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Settings.RLS.LeaseFallbackMs; got != 500 {
		t.Errorf("lease_fallback_ms %d by default, want five refill periods, 500", got)
	}
	for rls, want := range map[string]uint32{`,"lease_tick_ms":40`: 200, `,"lease_tick_ms":40,"lease_fallback_ms":0`: 0, `,"lease_fallback_ms":2500`: 2500} {
		c, err := config.Parse([]byte(strings.NewReplacer("SCOPE", "cluster", "EXTRA", `,"mode":"lease","lease_ttl_ms":1000`, "RLS", rls).Replace(base)))
		if err != nil || c.Settings.RLS.LeaseFallbackMs != want {
			t.Errorf("%s: lease_fallback_ms %v (%v), want %d", rls, c, err, want)
		}
	}
	l := cfg.Policies[0].Rules[0].Lease
	if l == nil || l.Max != 2 || l.TTL != 2 {
		t.Fatalf("defaults %+v, want lease_max burst/10 = 2 and ttl 2 s", l)
	}
}

// BenchmarkLeaseAdmit measures a request admitted from the allowance (no
// call), beside BenchmarkStream/b-one-rule's local bucket.
func BenchmarkLeaseAdmit(b *testing.B) {
	h := filtertest.New()
	p := filter.NewPlugin(h)
	now := benchEpoch
	p.Clock = func() float64 { return now }
	cfg := `{"rules":[{"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":1000000,"lease_ttl_ms":60000,
		"limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}],
		"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`
	if !p.OnConfigure([]byte(cfg)) {
		b.Fatal("configure")
	}
	req := filtertest.Get("/", "192.0.2.1:5000")
	// The way a cold process warms up: its first request waits for an
	// exact take, the next (demand continues) for a lease.
	h.Start(p, req)
	h.Tick(p)
	h.Deliver(p, h.Calls[0].Token, takeAnswer(1, 999999, 0))
	h.Start(p, req)
	h.Tick(p)
	h.Deliver(p, h.Calls[1].Token, leaseAnswer(1, 1000000, "1", 0))
	if len(h.Continued) != 2 {
		b.Fatalf("continued %v", h.Continued)
	}
	b.ReportAllocs()
	for b.Loop() {
		now += 1e-6
		if res := h.Do(p, req); res.Status() != 200 || len(h.Calls) != 2 {
			b.Fatalf("status %d, %d calls", res.Status(), len(h.Calls))
		}
	}
}

// TestLeaseReconfigureWhileWaiting: a configuration without a service
// lets the requests waiting for a lease go on (no rule of the new
// configuration limits them); one that keeps the service keeps them
// waiting for their refill.
func TestLeaseReconfigureWhileWaiting(t *testing.T) {
	req := filtertest.Get("/", "192.0.2.1:5000")
	f := newFixture(t, leaseCfg)
	f.h.Start(f.p, req)
	f.h.Tick(f.p)
	if !f.p.OnConfigure([]byte(leaseCfg)) {
		t.Fatal("configure")
	}
	if len(f.h.Continued) != 0 {
		t.Fatalf("continued %v: the same service, the request keeps waiting", f.h.Continued)
	}
	f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 19, 0))
	if len(f.h.Continued) != 1 {
		t.Fatalf("continued %v, want the request resumed by its take", f.h.Continued)
	}
	f.h.Start(f.p, req) // waits
	if !f.p.OnConfigure([]byte(`{"rules":[{"name":"l","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":1}}]}`)) {
		t.Fatal("configure")
	}
	if len(f.h.Continued) != 2 {
		t.Fatalf("continued %v, want the waiting request resumed when the service is gone", f.h.Continued)
	}
	f.h.Tick(f.p) // nothing left to do, no panic
}

// TestLeaseLowRateFleet: a low-rate limit (10 a minute) with requests
// spread one at a time over five processes (five hosts, each its own
// shared data), against a service that keeps the global bucket. No
// process ever holds a token it does not use: every request is an exact
// take of its own cost (no lease request, no periodic call), the process
// holds nothing after it, the global bucket is spent by admitted requests
// only, and no request is refused while the bucket has a token for it.
func TestLeaseLowRateFleet(t *testing.T) {
	cfg := `{"rules":[{"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":5,"lease_ttl_ms":2000,
	 "limit_keys":["ip:address"],"algorithm_config":{"rps":0.16666666666666666,"burst":10}}],
	"settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100}}}`
	global := bucket.Limit{Rate: 10.0 / 60, Burst: 10}
	now := epoch
	gs := global.Full(now)
	type proc struct {
		h *filtertest.Host
		p *filter.Plugin
	}
	procs := make([]proc, 5)
	for i := range procs {
		h := filtertest.New()
		p := filter.NewPlugin(h)
		p.Clock = func() float64 { return now }
		if !p.OnConfigure([]byte(cfg)) {
			t.Fatal("configure")
		}
		procs[i] = proc{h, p}
	}
	req := filtertest.Get("/", "192.0.2.1:5000")
	// serve answers every call a process made that is not answered yet,
	// as the service would: an exact take from the global bucket. A lease
	// request fails the test: nothing here is demand a lease serves.
	answered := make([]int, len(procs))
	spent := 0.0
	serve := func(i int) {
		pr := procs[i]
		for ; answered[i] < len(pr.h.Calls); answered[i]++ {
			c := pr.h.Calls[answered[i]]
			d := decodeCall(t, c)
			if len(d) != 1 || d[0].entries["tokengate_holder"] != "" {
				t.Fatalf("process %d at %.1fs: %+v, want an exact take (a lease would hold tokens for nobody)", i, now-epoch, d)
			}
			var res bucket.Result
			gs, res = global.Take(gs, now, float64(d[0].hits))
			code := uint64(1)
			if res.Allowed {
				spent += float64(d[0].hits)
			} else {
				code = 2
			}
			// duration_until_reset to the nanosecond, as tokengate-rls
			// sends it.
			sec, frac := math.Modf(res.RetryAfter)
			st := pb(nil).uint(1, code).uint(3, uint64(math.Floor(res.Tokens))).bytes(4, pb(nil).uint(1, uint64(sec)).uint(2, uint64(frac*1e9)))
			m := pb(nil).uint(1, code).bytes(2, st)
			framed := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(m)))
			pr.h.Deliver(pr.p, c.Token, grpcOK(append(framed, m...)))
		}
	}
	var admitted, rejected int
	for k := range 240 { // one request every 0.5 s, for two minutes
		i := k % len(procs)
		pr := procs[i]
		before := global.Refill(gs, now).Tokens
		n := len(pr.h.Continued)
		_, res := pr.h.Start(pr.p, req)
		reply := res.Response.Local // a 429 at once: known empty
		if reply == nil {
			if res.RequestAction != filter.Pause {
				t.Fatalf("request %d at process %d: %v, want it to wait for its take", k, i, res.RequestAction)
			}
			pr.h.Tick(pr.p)
			serve(i)
			reply = pr.h.Response.Local
		}
		ok := len(pr.h.Continued) == n+1
		switch {
		case ok:
			admitted++
		case reply != nil && reply.Status == 429:
			rejected++
			if before >= 1 {
				t.Errorf("request %d at %.1fs: 429 while the global bucket held %.2f tokens", k, now-epoch, before)
			}
		default:
			t.Fatalf("request %d: neither admitted nor rejected (%+v), calls %d, record %+v", k, pr.h.Response.Local, len(pr.h.Calls), recordOf(t, &fixture{h: pr.h}, "tl:lease-ip:192.0.2.1"))
		}
		if !ok && before >= 1 || ok && before < 1 {
			t.Errorf("request %d at %.1fs: admitted %v with %.2f tokens in the global bucket", k, now-epoch, ok, before)
		}
		if r := recordOf(t, &fixture{h: pr.h}, "tl:lease-ip:192.0.2.1"); r.Spendable(now) != 0 || r.Taken != 0 || r.Wait != 0 {
			t.Fatalf("request %d: process %d holds %+v after it", k, i, r)
		}
		// Half a second in 100 ms ticks, on every process: no periodic
		// call from a process that holds nothing.
		for range 5 {
			now += 0.1
			for j := range procs {
				procs[j].h.Tick(procs[j].p)
				serve(j)
			}
		}
	}
	// The global bucket gave exactly what was admitted.
	t.Logf("%d admitted, %d rejected; the global bucket spent %.2f", admitted, rejected, spent)
	if math.Abs(spent-float64(admitted)) > 1e-6 {
		t.Errorf("the global bucket spent %.2f tokens for %d admitted requests", spent, admitted)
	}
	if rejected == 0 || admitted < 20 {
		t.Errorf("%d admitted, %d rejected: the test must run the bucket dry", admitted, rejected)
	}
}

// TestLeaseAnswerAfterReloadWithoutService: a configuration without a
// rate-limit service put in force while a lease call is out (the waiting
// request goes on as the new configuration admits) leaves that call's
// answer to arrive later; it is dropped, not read against the service
// settings that no longer exist (it panicked, recovered as a fail-open).
func TestLeaseAnswerAfterReloadWithoutService(t *testing.T) {
	f := newFixture(t, leaseCfg)
	if _, res := f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000")); res.RequestAction != filter.Pause {
		t.Fatalf("cold request %v, want it to wait", res.RequestAction)
	}
	f.h.Tick(f.p)
	if len(f.h.Calls) != 1 {
		t.Fatalf("%d calls, want the exact take", len(f.h.Calls))
	}
	if !f.p.OnConfigure([]byte(`{"name":"local","algorithm_config":{"rps":10,"burst":20}}`)) {
		t.Fatalf("reload refused: %q", f.h.Logs(filter.LogError))
	}
	f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 19, 0))
	f.now += 0.2
	f.h.Tick(f.p)
	if n, _ := f.h.Counter(filter.MetricPanics); n != 0 {
		t.Errorf("tokengate.panics = %d, want 0: %q", n, f.h.Logs(filter.LogCritical))
	}
}
