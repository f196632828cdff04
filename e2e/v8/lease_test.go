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
// entries, split into its nine fields (docs/lease.md).
func leaseRecord(t *testing.T, r result, key string) []string {
	t.Helper()
	for _, e := range r.Entries {
		if e.Key == key {
			f := strings.Split(e.Value, ":")
			if len(f) != 9 {
				t.Fatalf("%s = %q, want nine fields", key, e.Value)
			}
			return f
		}
	}
	t.Fatalf("no %s in the shared data: %+v", key, r.Entries)
	return nil
}

// TestLeaseUnderV8 runs a lease-mode rule (docs/lease.md) on two V8
// workers: the cold request's exact take, the refill sent from
// proxy_on_tick and answered to the root context, admissions from the
// allowance with no call on either worker, the spent allowance answering
// 429 locally, one refill per tick per process whichever workers tick,
// and a failed refill sending the next request to an exact call and so to
// on_error.
func TestLeaseUnderV8(t *testing.T) {
	const cfg = `{"rules":[
	  {"name":"lease-ip","scope":"cluster","mode":"lease","lease_max":8,"lease_ttl_ms":2000,
	   "limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}],
	  "settings":{"rls":{"cluster":"rls","timeout_ms":50,"lease_tick_ms":100,"on_error":"deny"}}}`
	const key = "tl:lease-ip:192.0.2.1"
	a := func(w int) step { return onWorker(w, get("/", "192.0.2.1:1")) }
	steps := []step{
		withRLS(a(0), map[string]any{"codes": []int{1}}), // 1: cold: an exact take
		advance(50), tick(), // 3: the refill request, left unanswered
		tick(), // 4: a call is out: nothing more
		tickRLS(map[string]any{"codes": []int{1}, "grant": 8, "id": "7"}), // 5: the grant arrives
		shared(), // 6
	}
	for i := range 8 { // 7..14: the allowance, on both workers
		steps = append(steps, a(i%2))
	}
	steps = append(steps,
		a(1), // 15: spent but live: 429 with no call
		metric("tokengate.rule.lease-ip.allowed"), metric("tokengate.rule.lease-ip.rejected"), // 16, 17
		advance(100), tickRLS(map[string]any{"codes": []int{1}, "grant": 8, "id": "8"}), // 19: one refill, both workers ticking
		shared(), // 20
	)
	for i := range 8 { // 21..28
		steps = append(steps, a(i%2))
	}
	steps = append(steps,
		advance(100), tickRLS(map[string]any{"fail": true}), // 30: the service is down
		shared(), // 31
		withRLS(a(0), map[string]any{"fail": true}),                     // 32: spent, service down: exact call, on_error deny
		metric("tokengate.rls_errors"), metric("tokengate.lease_calls"), // 33, 34
	)
	r := run(t, cfg, 2, []string{"rls"}, steps...)
	mustStart(t, r)

	cold := r[1]
	if cold.Status != 200 || !cold.Paused || cold.Continued != 1 || len(cold.Calls) != 1 {
		t.Fatalf("cold request: %d paused %v continued %d, %d calls; want an exact call that admits", cold.Status, cold.Paused, cold.Continued, len(cold.Calls))
	}
	d := oneDescriptor(t, cold.Calls[0].Body)
	wantEntries(t, "exact take", d, map[string]string{"tokengate_rule": "lease-ip", "key": "192.0.2.1", "tokengate_mode": "lease"})
	if d.hits != 1 || cold.Calls[0].Cluster != "rls" || cold.Calls[0].Timeout != 50 {
		t.Errorf("exact take: hits %d, cluster %q, timeout %d; want 1, rls, 50", d.hits, cold.Calls[0].Cluster, cold.Calls[0].Timeout)
	}

	// The refill: one call, from worker 0 (the only one that saw the
	// bucket), made by proxy_on_tick. Demand 1 over max(0.05 s, one tick)
	// = 10/s; over tick + timeout (0.15 s) that is 1.5: want 2.
	refill := r[3]
	if len(refill.Calls) != 1 || refill.Calls[0].Worker != 0 || refill.Periods[0] != 100 || refill.Periods[1] != 100 {
		t.Fatalf("first tick: calls %+v, periods %v; want one lease request from worker 0, ticks of 100 ms", refill.Calls, refill.Periods)
	}
	d = oneDescriptor(t, refill.Calls[0].Body)
	holder := d.entries["tokengate_holder"]
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(holder) {
		t.Errorf("holder %q, want 16 hex digits", holder)
	}
	wantEntries(t, "lease request", d, map[string]string{"tokengate_rule": "lease-ip", "key": "192.0.2.1", "tokengate_mode": "lease",
		"tokengate_holder": holder, "tokengate_grant": "0", "tokengate_unspent": "0", "tokengate_want": "2"})
	if len(r[4].Calls) != 0 || len(r[5].Calls) != 0 {
		t.Errorf("ticks while the refill was out: calls %+v, %+v; want none", r[4].Calls, r[5].Calls)
	}
	// The grant, applied by the root context: 8 tokens of grant 7,
	// expiring at the dispatch + ttl, the demand window reset at the
	// dispatch.
	rec := leaseRecord(t, r[6], key)
	if got, want := strings.Join(rec[:5], ":"), "8.000000:1700000002.050000:7:0.000000:1700000000.050000"; got != want {
		t.Errorf("record after the grant: %s, want %s", got, want)
	}
	for _, e := range r[6].Entries {
		if e.Key == "tl:holder" && e.Value != holder {
			t.Errorf("tl:holder %q, the requests said %q", e.Value, holder)
		}
	}

	for i, x := range r[7:15] {
		if x.Status != 200 || x.Paused || len(x.Calls) != 0 {
			t.Errorf("request %d from the allowance (worker %d): %d paused %v, %d calls; want admitted with no call", i+1, x.Worker, x.Status, x.Paused, len(x.Calls))
		}
	}
	spent := r[15]
	if spent.Status != 429 || spent.Continued != 0 || len(spent.Calls) != 0 || spent.header("x-tokengate-rule") != "lease-ip" {
		t.Errorf("spent allowance: %d continued %d, %d calls, rule %q; want a local 429", spent.Status, spent.Continued, len(spent.Calls), spent.header("x-tokengate-rule"))
	}
	if r[16].Value != "9" || r[17].Value != "1" {
		t.Errorf("allowed %s, rejected %s; want 9 and 1", r[16].Value, r[17].Value)
	}

	// Both workers tick; one refills (the claim), asking for lease_max:
	// demand 9 in 0.1 s is 13.5 over the horizon, capped at 8.
	if len(r[19].Calls) != 1 {
		t.Fatalf("second refill: %d calls from both workers' ticks, want one", len(r[19].Calls))
	}
	d = oneDescriptor(t, r[19].Calls[0].Body)
	wantEntries(t, "renewal", d, map[string]string{"tokengate_rule": "lease-ip", "key": "192.0.2.1", "tokengate_mode": "lease",
		"tokengate_holder": holder, "tokengate_grant": "7", "tokengate_unspent": "0", "tokengate_want": "8"})
	rec = leaseRecord(t, r[20], key)
	if got, want := strings.Join(rec[:5], ":"), "8.000000:1700000002.150000:8:0.000000:1700000000.150000"; got != want {
		t.Errorf("record after the second grant: %s, want %s", got, want)
	}
	for i, x := range r[21:29] {
		if x.Status != 200 || x.Paused {
			t.Errorf("request %d of the second allowance: %d paused %v", i+1, x.Status, x.Paused)
		}
	}

	// The service fails the third refill (sent at +0.25 s): down is set
	// for a ttl, the claim is held only until 0.9 ticks after the dispatch,
	// and the spent allowance's next request is decided by an exact call,
	// which fails too: on_error deny, 503.
	if len(r[30].Calls) != 1 {
		t.Fatalf("third refill: %d calls, want one", len(r[30].Calls))
	}
	d = oneDescriptor(t, r[30].Calls[0].Body)
	if d.entries["tokengate_grant"] != "8" || d.entries["tokengate_want"] != "8" || d.entries["tokengate_unspent"] != "0" {
		t.Errorf("third refill %v, want grant 8, unspent 0, want 8", d.entries)
	}
	rec = leaseRecord(t, r[31], key)
	if rec[0] != "0.000000" || rec[2] != "8" || !near(t, rec[5], 1700000000.34) || !near(t, rec[8], 1700000002.25) {
		t.Errorf("record after the failed refill %v: want no tokens, grant 8 kept, the claim until +0.34 s, down until +2.25 s", rec)
	}
	down := r[32]
	if down.Status != 503 || !down.Paused || len(down.Calls) != 1 || down.header("x-tokengate-reason") != "rls_error" {
		t.Errorf("spent while down: %d paused %v, %d calls, reason %q; want an exact call and on_error deny's 503",
			down.Status, down.Paused, len(down.Calls), down.header("x-tokengate-reason"))
	} else if d := oneDescriptor(t, down.Calls[0].Body); d.entries["tokengate_holder"] != "" || d.hits != 1 {
		t.Errorf("exact call while down: %v hits %d, want an exact take of 1", d.entries, d.hits)
	}
	if r[33].Value != "2" || r[34].Value != "3" {
		t.Errorf("rls_errors %s, lease_calls %s; want 2 (the failed refill and exact call) and 3", r[33].Value, r[34].Value)
	}
}
