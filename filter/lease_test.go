package filter_test

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
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
// grant's quota (requests, id) when id != "", and duration_until_reset.
func leaseAnswer(code uint64, granted uint64, id string, resetSec uint64) filtertest.CallResponse {
	var st pb
	st = st.uint(1, code)
	if resetSec > 0 {
		st = st.bytes(4, pb(nil).uint(1, resetSec))
	}
	if id != "" {
		st = st.bytes(5, pb(nil).uint(1, granted).bytes(3, []byte(id)))
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
	snap := f.h.Store.(*sharedstatetest.Store).Snapshot("tl:lease-ip:")
	if len(snap) == 0 {
		return sharedstate.LeaseRecord{}
	}
	r, err := sharedstate.ParseLeaseRecord([]byte(snap[0].Value))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestLeaseMode walks a lease rule through its life: the cold request's
// exact call, the refill the tick sends, admissions from the allowance with
// no call, the empty allowance falling back to an exact call, a rejection
// making the bucket known empty (429s with no call until the retry time),
// expiry, release of idle tokens, and one refiller per process.
func TestLeaseMode(t *testing.T) {
	req := filtertest.Get("/", "192.0.2.1:5000")

	// warm returns a fixture whose allowance holds 8 tokens (grant 7).
	warm := func(t *testing.T) *fixture {
		t.Helper()
		f := newFixture(t, leaseCfg)
		if f.h.TickPeriod() != 100 {
			t.Fatalf("tick period %d ms, want 100", f.h.TickPeriod())
		}
		_, res := f.h.Start(f.p, req)
		if res.RequestAction != filter.Pause || len(f.h.Calls) != 1 {
			t.Fatalf("cold request: action %v, %d calls; want an exact call", res.RequestAction, len(f.h.Calls))
		}
		d := decodeCall(t, f.h.Calls[0])
		if len(d) != 1 || d[0].entries["tokengate_mode"] != "lease" || d[0].entries["tokengate_holder"] != "" ||
			d[0].entries["tokengate_rule"] != "lease-ip" || d[0].entries["key"] != "192.0.2.1" || d[0].hits != 1 {
			t.Fatalf("cold call %+v, want an exact take of 1 in lease mode", d)
		}
		f.h.Deliver(f.p, f.h.Calls[0].Token, leaseAnswer(1, 0, "", 0))
		if len(f.h.Continued) != 1 {
			t.Fatalf("continued %v", f.h.Continued)
		}
		f.now += 0.05
		f.h.Tick(f.p)
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls after a tick, want a lease request", len(f.h.Calls))
		}
		d = decodeCall(t, f.h.Calls[1])
		e := d[0].entries
		if e["tokengate_holder"] == "" || e["tokengate_grant"] != "0" || e["tokengate_unspent"] != "0" || e["tokengate_want"] == "0" || e["tokengate_release"] != "" {
			t.Fatalf("lease request %v", e)
		}
		// While the call is out, another tick sends nothing.
		f.h.Tick(f.p)
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls: a second lease request while one is out", len(f.h.Calls))
		}
		f.h.Deliver(f.p, f.h.Calls[1].Token, leaseAnswer(1, 8, "7", 0))
		if r := record(t, f); r.Tokens != 8 || r.Grant != 7 || r.Claim > f.now+0.1 || r.Expiry <= f.now {
			t.Fatalf("record after the grant %+v", r)
		}
		return f
	}

	t.Run("admitted from the allowance; spent: 429 until the refill", func(t *testing.T) {
		f := warm(t)
		for i := range 8 {
			if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Continue || res.Status() != 200 {
				t.Fatalf("request %d: %v %d, want admitted locally", i, res.RequestAction, res.Status())
			}
		}
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls: admissions from the allowance must not call", len(f.h.Calls))
		}
		// The allowance is spent but live: no call per request.
		for range 5 {
			if _, res := f.h.Start(f.p, req); res.Status() != 429 || len(f.h.Calls) != 2 {
				t.Fatalf("spent allowance: %d with %d calls, want a local 429", res.Status(), len(f.h.Calls))
			}
		}
		if got := f.counter("lease-ip", filter.CounterAllowed); got != 9 {
			t.Errorf("allowed = %d, want 9", got)
		}
		// The refiller saw the demand of all 13: it asks for more.
		f.now += 0.1
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 || decodeCall(t, f.h.Calls[2])[0].entries["tokengate_want"] != "8" {
			t.Fatalf("%d calls; want a refill of lease_max 8", len(f.h.Calls))
		}
		f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 8, "8", 0))
		if _, res := f.h.Start(f.p, req); res.Status() != 200 {
			t.Fatalf("after the refill: %d", res.Status())
		}
		// Once the allowance has expired, the bucket is cold again: an
		// exact call.
		f.now += 2.1
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || len(f.h.Calls) != 4 {
			t.Fatalf("expired allowance: %v with %d calls, want an exact call", res.RequestAction, len(f.h.Calls))
		}
	})

	t.Run("known empty: 429 without a call until the retry time", func(t *testing.T) {
		f := warm(t)
		for range 8 {
			f.h.Start(f.p, req)
		}
		f.now += 2.01 // the allowance expires: cold
		f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(2, 0, "", 3))
		if resp.Local == nil || resp.Local.Status != 429 {
			t.Fatalf("reply %+v, want 429", resp.Local)
		}
		_, res := f.h.Start(f.p, req)
		if res.Status() != 429 || len(f.h.Calls) != 3 {
			t.Fatalf("status %d with %d calls, want a local 429", res.Status(), len(f.h.Calls))
		}
		if ra, _ := findHeader(res.Response.Local.Headers, "retry-after"); ra < "3" {
			t.Errorf("retry-after %q", ra)
		}
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 {
			t.Errorf("a tick asked for a lease of a bucket known empty")
		}
		f.now += 3.01
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || len(f.h.Calls) != 4 {
			t.Fatalf("after the retry time: %v with %d calls, want an exact call", res.RequestAction, len(f.h.Calls))
		}
	})

	t.Run("expired allowance is not spent", func(t *testing.T) {
		f := warm(t)
		f.now += 2.0 // the grant was sent 2 s ago minus nothing: ttl over
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause {
			t.Fatalf("action %v, want an exact call: the allowance expired", res.RequestAction)
		}
	})

	t.Run("renewal reports the unspent tokens and the grant", func(t *testing.T) {
		f := warm(t)
		for range 6 {
			f.h.Start(f.p, req)
		}
		f.now += 0.1
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 {
			t.Fatalf("%d calls, want a renewal", len(f.h.Calls))
		}
		e := decodeCall(t, f.h.Calls[2])[0].entries
		if e["tokengate_grant"] != "7" || e["tokengate_unspent"] != "2" {
			t.Fatalf("renewal %v, want grant 7 and 2 unspent", e)
		}
		// One more request spends while the call is out; the answer's
		// grant adds to what is left.
		f.h.Start(f.p, req)
		f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 5, "9", 0))
		if r := record(t, f); r.Tokens != 6 || r.Grant != 9 {
			t.Fatalf("record %+v, want 1 left + 5 granted under grant 9", r)
		}
	})

	t.Run("idle tokens are released", func(t *testing.T) {
		f := warm(t)
		f.now += 0.1
		f.h.Tick(f.p) // the demand of the warm-up: a renewal
		if len(f.h.Calls) == 3 {
			f.h.Deliver(f.p, f.h.Calls[2].Token, leaseAnswer(1, 0, "8", 0))
		}
		n := len(f.h.Calls)
		f.now += 1.01 // no demand for half the ttl
		f.h.Tick(f.p)
		if len(f.h.Calls) != n+1 {
			t.Fatalf("%d calls, want a release", len(f.h.Calls))
		}
		e := decodeCall(t, f.h.Calls[n])[0].entries
		if e["tokengate_release"] != "1" || e["tokengate_unspent"] != "8" {
			t.Fatalf("release %v, want 8 returned", e)
		}
		if r := record(t, f); r.Tokens != 0 {
			t.Fatalf("record %+v: tokens being returned must not be spendable", r)
		}
		f.h.Deliver(f.p, f.h.Calls[n].Token, leaseAnswer(1, 0, "", 0))
		if r := record(t, f); r.Tokens != 0 || r.Claim > f.now+0.1 {
			t.Fatalf("record %+v after the release", r)
		}
	})

	t.Run("one refiller per process", func(t *testing.T) {
		f := newFixture(t, leaseCfg)
		h2 := f.h.NewWorker()
		p2 := filter.NewPlugin(h2)
		p2.Clock = func() float64 { return f.now }
		if !p2.OnConfigure([]byte(leaseCfg)) {
			t.Fatal("configure")
		}
		f.h.Start(f.p, req)
		h2.Start(p2, req)
		f.now += 0.1
		f.h.Tick(f.p)
		h2.Tick(p2)
		if n := len(f.h.Calls) + len(h2.Calls); n != 3 {
			t.Fatalf("%d calls, want 2 exact calls and 1 lease request", n)
		}
		// The worker holding the claim dies: its claim lapses and the
		// other worker takes over.
		f.now += 0.05 + 1.01
		h2.Start(p2, req) // demand: a cold request, its exact call
		h2.Tick(p2)
		if len(h2.Calls) != 3 || decodeCall(t, h2.Calls[2])[0].entries["tokengate_holder"] == "" {
			t.Fatalf("calls %d and %d: nobody refilled after the claim lapsed", len(f.h.Calls), len(h2.Calls))
		}
	})

	t.Run("one refill per tick per process, whatever the workers' phases", func(t *testing.T) {
		f := warm(t) // worker 1 refilled at epoch+0.05
		h2 := f.h.NewWorker()
		p2 := filter.NewPlugin(h2)
		p2.Clock = func() float64 { return f.now }
		if !p2.OnConfigure([]byte(leaseCfg)) {
			t.Fatal("configure")
		}
		for range 8 {
			h2.Start(p2, req) // demand from another worker: the allowance is spent
		}
		// 40 ms after the refill's dispatch, a tick (another phase) must
		// not refill again, demand or not; a tick later it does.
		f.now += 0.04
		f.h.Tick(f.p)
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls: a second refill within one tick", len(f.h.Calls))
		}
		f.now += 0.06
		f.h.Tick(f.p)
		if len(f.h.Calls) != 3 {
			t.Fatalf("%d calls: no refill a tick later", len(f.h.Calls))
		}
	})

	t.Run("the timer keeps the refill period; early ticks do not refill", func(t *testing.T) {
		f := warm(t)
		for range 8 {
			f.h.Start(f.p, req) // demand: the next refill is wanted
		}
		// Ticks every 10 ms (as delayed admission may set them): the
		// period stays 100 ms with nothing held, and the refill runs once
		// in 100 ms, not on every tick.
		for range 9 {
			f.now += 0.01
			f.h.Tick(f.p)
			if got := f.h.TickPeriod(); got != 100 {
				t.Fatalf("tick period %d ms with a lease rule and nothing held, want 100", got)
			}
		}
		if len(f.h.Calls) != 3 {
			t.Fatalf("%d calls after nine 10 ms ticks, want one refill", len(f.h.Calls))
		}
	})

	t.Run("a grant answered after the claim lapsed is dropped", func(t *testing.T) {
		f := newFixture(t, leaseCfg)
		f.h.Start(f.p, req)
		f.now += 0.1
		f.h.Tick(f.p)
		tok := f.h.Calls[1].Token
		// Another worker's claim replaced ours.
		k := "tl:lease-ip:192.0.2.1"
		v, cas, _ := f.h.Store.Get(k)
		r, _ := sharedstate.ParseLeaseRecord(v)
		r.Claimer++
		f.h.Store.Set(k, sharedstate.AppendLeaseRecord(nil, r), cas)
		f.h.Deliver(f.p, tok, leaseAnswer(1, 8, "3", 0))
		if r := record(t, f); r.Tokens != 0 || r.Grant != 0 {
			t.Fatalf("record %+v: a grant without our claim was applied", r)
		}
	})

	t.Run("service down: the call fails, the claim clears", func(t *testing.T) {
		f := warm(t)
		for range 6 {
			f.h.Start(f.p, req)
		}
		f.now += 0.1
		f.h.Tick(f.p)
		f.h.Deliver(f.p, f.h.Calls[2].Token, filtertest.CallResponse{})
		if r := record(t, f); r.Tokens != 2 || r.Claim > f.now+0.1 || r.Grant != 7 {
			t.Fatalf("record %+v, want the 2 held tokens kept and the claim cleared", r)
		}
		for range 2 {
			if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Continue {
				t.Fatal("held tokens not spent while the service is down")
			}
		}
		// Spent, with the service failing: the next request does not wait
		// for a refill but makes its exact call (and so meets on_error).
		if _, res := f.h.Start(f.p, req); res.RequestAction != filter.Pause || len(f.h.Calls) != 4 {
			t.Fatalf("spent while the service is down: %v with %d calls, want an exact call", res.RequestAction, len(f.h.Calls))
		}
	})
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
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := strings.NewReplacer("SCOPE", tc.scope, "EXTRA", tc.extra, "RLS", tc.rls).Replace(base)
			_, err := filter.ParseConfig([]byte(cfg))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	cfg, err := filter.ParseConfig([]byte(strings.NewReplacer("SCOPE", "cluster", "EXTRA", `,"mode":"lease"`, "RLS", "").Replace(base)))
	if err != nil {
		t.Fatal(err)
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
	h.Start(p, req)
	h.Deliver(p, h.Calls[0].Token, leaseAnswer(1, 0, "", 0))
	now += 0.1
	h.Tick(p)
	h.Deliver(p, h.Calls[1].Token, leaseAnswer(1, 1000000, "1", 0))
	b.ReportAllocs()
	for b.Loop() {
		now += 1e-6
		if res := h.Do(p, req); res.Status() != 200 || len(h.Calls) != 2 {
			b.Fatalf("status %d, %d calls", res.Status(), len(h.Calls))
		}
	}
}
