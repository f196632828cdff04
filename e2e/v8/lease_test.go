package v8

import (
	"encoding/binary"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// rlsDescriptor is one descriptor of a RateLimitRequest the module sent.
type rlsDescriptor struct {
	entries map[string]string
	hits    uint64 // the descriptor's hits_addend; 0 when unset
}

// decodeRLS decodes a call's body, one gRPC frame holding a
// RateLimitRequest, with Envoy's own generated protos (not the module's
// encoder): the domain and the descriptors.
func decodeRLS(t *testing.T, body []byte) (string, []rlsDescriptor) {
	t.Helper()
	if len(body) < 5 || body[0] != 0 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		t.Fatalf("call body %x is not one uncompressed gRPC frame", body)
	}
	var req rlsv3.RateLimitRequest
	if err := proto.Unmarshal(body[5:], &req); err != nil {
		t.Fatalf("RateLimitRequest: %v", err)
	}
	var ds []rlsDescriptor
	for _, d := range req.GetDescriptors() {
		e := map[string]string{}
		for _, x := range d.GetEntries() {
			e[x.GetKey()] = x.GetValue()
		}
		ds = append(ds, rlsDescriptor{entries: e, hits: d.GetHitsAddend().GetValue()})
	}
	return req.GetDomain(), ds
}

// oneDescriptor decodes a call that must carry exactly one descriptor in
// the tokengate domain.
func oneDescriptor(t *testing.T, body []byte) rlsDescriptor {
	t.Helper()
	domain, ds := decodeRLS(t, body)
	if domain != "tokengate" || len(ds) != 1 {
		t.Fatalf("request: domain %q, %d descriptors; want tokengate and one", domain, len(ds))
	}
	return ds[0]
}

// near reports whether a record's time field is want, to the microsecond
// its six decimals keep (the clock reaches the guest as float seconds).
func near(t *testing.T, field string, want float64) bool {
	t.Helper()
	v, err := strconv.ParseFloat(field, 64)
	return err == nil && math.Abs(v-want) <= 2e-6
}

func tickRLS(v any) step { return step{"op": "tick", "rls": v} }

// wantEntries checks a descriptor's entries exactly.
func wantEntries(t *testing.T, what string, d rlsDescriptor, want map[string]string) {
	t.Helper()
	if len(d.entries) != len(want) {
		t.Errorf("%s: entries %v, want %v", what, d.entries, want)
		return
	}
	for k, v := range want {
		if got, ok := d.entries[k]; !ok || got != v {
			t.Errorf("%s: entries %v, want %v", what, d.entries, want)
			return
		}
	}
}

// leaseRecord returns the allowance record of key in a shared step's
// entries, split into its fifteen fields (docs/lease.md).
func leaseRecord(t *testing.T, r result, key string) []string {
	t.Helper()
	for _, e := range r.Entries {
		if e.Key == key {
			f := strings.Split(e.Value, ":")
			if len(f) != 15 {
				t.Fatalf("%s = %q, want fifteen fields", key, e.Value)
			}
			return f
		}
	}
	t.Fatalf("no %s in the shared data: %+v", key, r.Entries)
	return nil
}

// released returns the one request a tick finished.
func released(t *testing.T, what string, r result) result {
	t.Helper()
	if len(r.Released) != 1 {
		t.Fatalf("%s: the tick finished %d requests, want one", what, len(r.Released))
	}
	return r.Released[0]
}

// TestLeaseUnderV8 runs a lease-mode rule (docs/lease.md) on two V8
// workers: the cold request held until proxy_on_tick's exact take of its
// cost, answered to the root context; the next one, demand within the
// refill period, held for the lease request the tick sends; admissions from
// the allowance with no call on either worker; a spent allowance's request
// held for the next call, one per period per process whichever workers
// tick; and the service failing: the request that waits for the next call
// gets on_error (lease_fallback_ms 0: at the first failure; by default it
// would wait through five periods of failures, filter's
// TestLeaseTransientFailures).
func TestLeaseUnderV8(t *testing.T) {
	const cfg = `{"rules":[
	  {"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,
	   "limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}],
	  "settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100,"on_error":"deny","lease_fallback_ms":0}}}`
	const key = "tl:lease-ip:192.0.2.1"
	a := func(w int) step { return onWorker(w, get("/", "192.0.2.1:1")) }
	steps := []step{
		a(0), // 1: cold: held
		tickRLS(map[string]any{"codes": []int{1}, "remaining": 19}), // 2: the exact take, admitted
		a(0),                // 3: demand within the period: held
		advance(50), tick(), // 5: the lease request, left unanswered
		tick(), // 6: a call is out: nothing more
		tickRLS(map[string]any{"codes": []int{1}, "grant": 9, "id": "7"}), // 7: the grant arrives
		shared(), // 8
	}
	for i := range 8 { // 9..16: the allowance, on both workers
		steps = append(steps, a(i%2))
	}
	steps = append(steps,
		a(1), // 17: spent: held for the next call
		metric("tokengate.rule.lease-ip.allowed"), metric("tokengate.rule.lease-ip.rejected"), // 18, 19
		advance(100), tickRLS(map[string]any{"codes": []int{1}, "grant": 8, "id": "8"}), // 21: one refill, both workers ticking
		shared(), // 22
	)
	for i := range 7 { // 23..29
		steps = append(steps, a(i%2))
	}
	steps = append(steps,
		advance(100), tickRLS(map[string]any{"fail": true}), // 31: the service is down
		shared(),                                            // 32
		a(0),                                                // 33: spent: held for the next call
		advance(100), tickRLS(map[string]any{"fail": true}), // 35: which fails: on_error deny
		metric("tokengate.rls_errors"), metric("tokengate.lease_calls"), // 36, 37
	)
	r := run(t, cfg, 2, []string{"rls"}, steps...)
	mustStart(t, r)

	if cold := r[1]; !cold.Held || len(cold.Calls) != 0 {
		t.Fatalf("cold request: held %v, %d calls; want it held, no call of its own", cold.Held, len(cold.Calls))
	}
	// Worker 0's tick takes the request's cost exactly: no holder, nothing
	// held afterwards.
	take := r[2]
	if len(take.Calls) != 1 || take.Calls[0].Worker != 0 {
		t.Fatalf("first tick: calls %+v, want one exact take from worker 0", take.Calls)
	}
	d := oneDescriptor(t, take.Calls[0].Body)
	wantEntries(t, "exact take", d, map[string]string{"tokengate_rule": "lease-ip", "key": "192.0.2.1", "tokengate_mode": "lease"})
	if d.hits != 1 || take.Calls[0].Cluster != "rls" || take.Calls[0].Timeout != 50 {
		t.Errorf("exact take: hits %d, cluster %q, timeout %d; want 1, rls, 50", d.hits, take.Calls[0].Cluster, take.Calls[0].Timeout)
	}
	if x := released(t, "exact take", take); x.Status != 200 || x.Continued != 1 {
		t.Errorf("cold request after its take: %d continued %d, want admitted", x.Status, x.Continued)
	}

	// The lease request: one call, from worker 0 (the only one that saw
	// the bucket), made by proxy_on_tick, while worker 0 polls at 1 ms for
	// its waiting request. Demand 1 over max(0.05 s, one tick) = 10/s, over
	// tick + twice the measured round trip (0.1 ms: a fixed clock), twice:
	// 3, at least twice the take.
	lease := r[5]
	if !r[3].Held || len(lease.Calls) != 1 || lease.Calls[0].Worker != 0 || lease.Periods[0] != 1 || lease.Periods[1] != 100 {
		t.Fatalf("second request held %v; tick: calls %+v, periods %v; want one lease request from worker 0, ticks of 1 and 100 ms",
			r[3].Held, lease.Calls, lease.Periods)
	}
	d = oneDescriptor(t, lease.Calls[0].Body)
	holder := d.entries["tokengate_holder"]
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(holder) {
		t.Errorf("holder %q, want 16 hex digits", holder)
	}
	wantEntries(t, "lease request", d, map[string]string{"tokengate_rule": "lease-ip", "key": "192.0.2.1", "tokengate_mode": "lease",
		"tokengate_holder": holder, "tokengate_grant": "0", "tokengate_unspent": "0", "tokengate_want": "3"})
	if len(r[6].Calls) != 0 || len(r[7].Calls) != 0 || len(r[6].Released) != 0 {
		t.Errorf("ticks while the lease request was out: calls %+v, %+v, released %d; want none", r[6].Calls, r[7].Calls, len(r[6].Released))
	}
	if x := released(t, "the grant", r[7]); x.Status != 200 {
		t.Errorf("second request after the grant: %d, want admitted", x.Status)
	}
	// The grant, applied by the root context: 9 tokens of grant 7 less the
	// waiting request's, expiring at the dispatch + ttl, the demand window
	// started at the dispatch (with the request it admitted).
	rec := leaseRecord(t, r[8], key)
	if got, want := strings.Join(rec[:5], ":"), "8.000000:1700000002.050000:7:1.000000:1700000000.050000"; got != want {
		t.Errorf("record after the grant: %s, want %s", got, want)
	}
	for _, e := range r[8].Entries {
		if e.Key == "tl:holder" && e.Value != holder {
			t.Errorf("tl:holder %q, the requests said %q", e.Value, holder)
		}
	}

	for i, x := range r[9:17] {
		if x.Status != 200 || x.Paused || len(x.Calls) != 0 {
			t.Errorf("request %d from the allowance (worker %d): %d paused %v, %d calls; want admitted with no call", i+1, x.Worker, x.Status, x.Paused, len(x.Calls))
		}
	}
	if spent := r[17]; !spent.Held || len(spent.Calls) != 0 {
		t.Errorf("spent allowance: held %v, %d calls; want it held for the next call", spent.Held, len(spent.Calls))
	}
	if r[18].Value != "10" || r[19].Value != "0" {
		t.Errorf("allowed %s, rejected %s; want 10 and 0", r[18].Value, r[19].Value)
	}

	// Both workers tick; one refills (the claim), asking for lease_max:
	// demand 10 in 0.1 s is 20 over the horizon, capped at 8. Worker 1's
	// waiting request is admitted from it at its own tick.
	if len(r[21].Calls) != 1 {
		t.Fatalf("second refill: %d calls from both workers' ticks, want one", len(r[21].Calls))
	}
	d = oneDescriptor(t, r[21].Calls[0].Body)
	wantEntries(t, "renewal", d, map[string]string{"tokengate_rule": "lease-ip", "key": "192.0.2.1", "tokengate_mode": "lease",
		"tokengate_holder": holder, "tokengate_grant": "7", "tokengate_unspent": "0", "tokengate_want": "8"})
	if x := released(t, "the renewal", r[21]); x.Status != 200 || x.Worker != 1 {
		t.Errorf("worker 1's waiting request: %d on worker %d, want admitted on worker 1", x.Status, x.Worker)
	}
	rec = leaseRecord(t, r[22], key)
	if got, want := strings.Join(rec[:5], ":"), "7.000000:1700000002.150000:8:1.000000:1700000000.150000"; got != want {
		t.Errorf("record after the second grant: %s, want %s", got, want)
	}
	for i, x := range r[23:30] {
		if x.Status != 200 || x.Paused {
			t.Errorf("request %d of the second allowance: %d paused %v", i+1, x.Status, x.Paused)
		}
	}

	// The service fails the third refill (sent at +0.25 s): down is set,
	// the claim cleared, the next call due a period after the failed one.
	if len(r[31].Calls) != 1 {
		t.Fatalf("third refill: %d calls, want one", len(r[31].Calls))
	}
	d = oneDescriptor(t, r[31].Calls[0].Body)
	if d.entries["tokengate_grant"] != "8" || d.entries["tokengate_want"] != "8" || d.entries["tokengate_unspent"] != "0" {
		t.Errorf("third refill %v, want grant 8, unspent 0, want 8", d.entries)
	}
	rec = leaseRecord(t, r[32], key)
	if rec[0] != "0.000000" || rec[2] != "8" || rec[5] != "0.000000" || !near(t, rec[8], 1700000000.25) || !near(t, rec[9], 1700000000.35) {
		t.Errorf("record after the failed refill %v: want no tokens, grant 8 kept, no claim, down at +0.25 s, the next call from +0.35 s", rec)
	}
	// The next request waits for that call, which fails too: on_error deny.
	if !r[33].Held || len(r[33].Calls) != 0 {
		t.Errorf("spent while down: held %v, %d calls; want it held for the next call", r[33].Held, len(r[33].Calls))
	}
	if len(r[35].Calls) != 1 {
		t.Fatalf("fourth call: %d calls, want one", len(r[35].Calls))
	}
	if down := released(t, "the failed call", r[35]); down.Status != 503 || down.header("x-tokengate-reason") != "rls_error" {
		t.Errorf("the request that waited: %d, reason %q; want on_error deny's 503", down.Status, down.header("x-tokengate-reason"))
	}
	if r[36].Value != "3" || r[37].Value != "5" {
		t.Errorf("rls_errors %s, lease_calls %s; want 3 (the two failed calls, and on_error for the request) and 5", r[36].Value, r[37].Value)
	}
}
