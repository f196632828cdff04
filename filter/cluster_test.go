package filter_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// The test's own RLS response encoder (not the filter's): protobuf wire
// format written out field by field.
type pb []byte

func (b pb) varint(v uint64) pb {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
func (b pb) field(num int, wt int) pb  { return b.varint(uint64(num<<3 | wt)) }
func (b pb) uint(num int, v uint64) pb { return b.field(num, 0).varint(v) }
func (b pb) bytes(num int, m []byte) pb {
	return append(b.field(num, 2).varint(uint64(len(m))), m...)
}

type rlsStatus struct {
	code      uint64
	remaining uint64
	resetSec  uint64
}

func rlsResponse(overall uint64, sts []rlsStatus, headers ...[2]string) []byte {
	var m pb
	m = m.uint(1, overall)
	for _, s := range sts {
		var st pb
		st = st.uint(1, s.code)
		st = st.bytes(2, pb(nil).uint(1, 10).uint(2, 1))
		st = st.uint(3, s.remaining)
		st = st.bytes(4, pb(nil).uint(1, s.resetSec))
		m = m.bytes(2, st)
	}
	for _, h := range headers {
		m = m.bytes(3, pb(nil).bytes(1, []byte(h[0])).bytes(2, []byte(h[1])))
	}
	framed := []byte{0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(framed[1:], uint32(len(m)))
	return append(framed, m...)
}

func grpcOK(body []byte) filtertest.CallResponse {
	return filtertest.CallResponse{
		Headers:  [][2]string{{":status", "200"}, {"content-type", "application/grpc"}},
		Body:     body,
		Trailers: [][2]string{{"grpc-status", "0"}},
	}
}

const clusterCfg = `{"rules":[
	{"name":"local-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}},
	{"name":"global-ip","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":5,"burst":10,"cost_source":"header:x-cost"}}],
	"settings":{"rls":{"cluster":"rls","domain":"edge","timeout_ms":25,"on_error":"ON_ERROR"}}}`

func clusterFixture(t *testing.T, onError string) *fixture {
	return newFixture(t, strings.Replace(clusterCfg, "ON_ERROR", onError, 1))
}

// localTokens returns the tokens stored in the local rule's bucket for
// 192.0.2.1.
func localTokens(t *testing.T, f *fixture) string {
	t.Helper()
	for _, e := range f.h.Store.(*sharedstatetest.Store).Snapshot("tb:local-ip:") {
		return strings.SplitN(e.Value, ":", 2)[0]
	}
	return "<none>"
}

// TestClusterScope walks a cluster-scope rule through the rate-limit
// service's answers: the call it makes, admission, rejection (the local
// bucket refunded), each on_error, a stream that ends first, and a request
// the local rule rejects, which never reaches the service.
func TestClusterScope(t *testing.T) {
	req := filtertest.Get("/", "192.0.2.1:5000", "x-cost", "2.5")

	t.Run("the call", func(t *testing.T) {
		f := clusterFixture(t, "allow")
		_, res := f.h.Start(f.p, req)
		if res.RequestAction != filter.Pause || len(f.h.Calls) != 1 {
			t.Fatalf("action %v, %d calls; want a paused request and one call", res.RequestAction, len(f.h.Calls))
		}
		c := f.h.Calls[0]
		want := map[string]string{":method": "POST", ":path": "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
			":authority": "rls", "content-type": "application/grpc", "te": "trailers"}
		for _, kv := range c.Headers {
			if w, ok := want[kv[0]]; ok && w != kv[1] {
				t.Errorf("header %s = %q, want %q", kv[0], kv[1], w)
			}
			delete(want, kv[0])
		}
		if c.Cluster != "rls" || c.TimeoutMs != 25 || len(want) != 0 || c.Stream != 1 {
			t.Errorf("call %+v; missing headers %v", c, want)
		}
		// Frame, domain, the two entries and hits_addend 3 (2.5 rounded up).
		if len(c.Body) < 5 || c.Body[0] != 0 || int(binary.BigEndian.Uint32(c.Body[1:5])) != len(c.Body)-5 {
			t.Fatalf("body %x is not one gRPC frame", c.Body)
		}
		for _, part := range [][]byte{[]byte("\x0a\x04edge"), []byte("tokengate_rule"), []byte("global-ip"), []byte("\x0a\x03key"), []byte("192.0.2.1"), {0x1a, 0x02, 0x08, 0x03}} {
			if !bytes.Contains(c.Body, part) {
				t.Errorf("body %q lacks %q", c.Body, part)
			}
		}
	})

	t.Run("admitted", func(t *testing.T) {
		f := clusterFixture(t, "allow")
		s, _ := f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(1, []rlsStatus{{1, 7, 1}}, [2]string{"RateLimit", `"global-ip";r=7;t=1`})))
		if resp.Local != nil || len(f.h.Continued) != 1 || f.h.Continued[0] != 1 {
			t.Fatalf("local reply %+v, continued %v; want the stream resumed", resp.Local, f.h.Continued)
		}
		f.h.Response = filtertest.Response{}
		s.OnResponseHeaders(0, false)
		var got []string
		for _, kv := range f.h.Response.Headers {
			got = append(got, kv[0]+": "+kv[1])
		}
		if j := strings.Join(got, "\n"); !strings.Contains(j, `ratelimit: "global-ip";r=7;t=1`) || !strings.Contains(j, `ratelimit-policy: "local-ip";q=3;w=3`) {
			t.Errorf("response headers:\n%s", j)
		}
		if got := f.counter("global-ip", filter.CounterAllowed); got != 1 {
			t.Errorf("global-ip allowed = %d", got)
		}
		if got := localTokens(t, f); got != "2.000000" {
			t.Errorf("local bucket %s, want 2 (one taken)", got)
		}
	})

	t.Run("rejected: 429, local refunded", func(t *testing.T) {
		f := clusterFixture(t, "allow")
		f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(2, []rlsStatus{{2, 0, 3}})))
		if resp.Local == nil || resp.Local.Status != 429 || len(f.h.Continued) != 0 {
			t.Fatalf("reply %+v, continued %v; want a 429", resp.Local, f.h.Continued)
		}
		hdr := func(n string) string { v, _ := findHeader(resp.Local.Headers, n); return v }
		if hdr("x-tokengate-rule") != "global-ip" || hdr("retry-after") < "3" || hdr("ratelimit") == "" {
			t.Errorf("headers %q", resp.Local.Headers)
		}
		if got := localTokens(t, f); got != "3.000000" {
			t.Errorf("local bucket %s, want 3: the rejected request must take nothing", got)
		}
		if got := f.counter("global-ip", filter.CounterRejected); got != 1 {
			t.Errorf("global-ip rejected = %d", got)
		}
	})

	t.Run("rejected with the service's headers: its Retry-After is not sent twice", func(t *testing.T) {
		f := clusterFixture(t, "allow")
		f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(2, []rlsStatus{{2, 0, 3}},
			[2]string{"ratelimit", `"global-ip";r=0;t=3`}, [2]string{"retry-after", "3"})))
		if resp.Local == nil || resp.Local.Status != 429 {
			t.Fatalf("reply %+v; want a 429", resp.Local)
		}
		var retries []string
		for _, kv := range resp.Local.Headers {
			if strings.EqualFold(kv[0], "retry-after") {
				retries = append(retries, kv[1])
			}
		}
		if len(retries) != 1 {
			t.Errorf("retry-after %q, want exactly one (the filter's)", retries)
		}
		if v, _ := findHeader(resp.Local.Headers, "ratelimit"); v != `"global-ip";r=0;t=3` {
			t.Errorf("ratelimit %q, want the service's", v)
		}
	})

	for _, tc := range []struct {
		onError  string
		status   uint32 // 0: resumed
		localNow string
	}{{"allow", 0, "2.000000"}, {"deny", 503, "3.000000"}, {"local", 0, "2.000000"}} {
		t.Run("service failed, on_error "+tc.onError, func(t *testing.T) {
			f := clusterFixture(t, tc.onError)
			f.h.Start(f.p, req)
			resp := f.h.Deliver(f.p, f.h.Calls[0].Token, filtertest.CallResponse{}) // timeout: no headers
			switch {
			case tc.status == 0 && (resp.Local != nil || len(f.h.Continued) != 1):
				t.Fatalf("reply %+v, continued %v; want resumed", resp.Local, f.h.Continued)
			case tc.status != 0 && (resp.Local == nil || resp.Local.Status != tc.status || len(f.h.Continued) != 0):
				t.Fatalf("reply %+v, continued %v; want %d", resp.Local, f.h.Continued, tc.status)
			}
			if got := localTokens(t, f); got != tc.localNow {
				t.Errorf("local bucket %s, want %s", got, tc.localNow)
			}
			if n, _ := f.h.Counter(filter.MetricRLSErrors); n != 1 {
				t.Errorf("rls_errors = %d", n)
			}
		})
	}

	t.Run("on_error local decides in shared data", func(t *testing.T) {
		f := clusterFixture(t, "local")
		f.h.CallError = errors.New("no such cluster")
		// Cost 4 against the cluster rule's own shared-data bucket (burst
		// 10): two pass, the third is rejected and its local token refunded.
		r := filtertest.Get("/", "192.0.2.1:1", "x-cost", "4")
		var statuses []uint32
		for range 3 {
			_, res := f.h.Start(f.p, r)
			statuses = append(statuses, res.Status())
		}
		if statuses[0] != 200 || statuses[1] != 200 || statuses[2] != 429 {
			t.Errorf("statuses %v, want 200 200 429", statuses)
		}
		if got := localTokens(t, f); got != "1.000000" {
			t.Errorf("local bucket %s, want 1: two taken, the third refunded", got)
		}
		if len(f.h.Continued) != 0 {
			t.Errorf("continued %v: a request never paused must not be resumed", f.h.Continued)
		}
	})

	t.Run("stream gone before the answer", func(t *testing.T) {
		f := clusterFixture(t, "allow")
		s, _ := f.h.Start(f.p, req)
		s.Release()
		f.h.Gone = map[uint32]bool{1: true}
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(2, []rlsStatus{{2, 0, 3}})))
		if resp.Local != nil || len(f.h.Continued) != 0 {
			t.Fatalf("a call of a finished stream was acted on: %+v %v", resp.Local, f.h.Continued)
		}
	})

	t.Run("local rule rejects first: no call", func(t *testing.T) {
		f := clusterFixture(t, "allow")
		for range 3 {
			_, _ = f.h.Start(f.p, req)
		}
		_, res := f.h.Start(f.p, req)
		if res.Status() != 429 || len(f.h.Calls) != 3 {
			t.Fatalf("status %d after %d calls; want the 4th rejected locally without a call", res.Status(), len(f.h.Calls))
		}
	})

	t.Run("host without callouts", func(t *testing.T) {
		h := filtertest.New()
		p := filter.NewPlugin(noCallouts{h})
		p.Clock = func() float64 { return epoch }
		if !p.OnConfigure([]byte(strings.Replace(clusterCfg, "ON_ERROR", "deny", 1))) {
			t.Fatal("configure failed")
		}
		res := h.Do(p, req)
		if res.Status() != 503 {
			t.Fatalf("status %d, want on_error deny's 503", res.Status())
		}
	})
}

// noCallouts hides filtertest.Host's callouts, as a host without
// proxy_http_call would.
type noCallouts struct{ *filtertest.Host }

func (noCallouts) HTTPCall() {}

func findHeader(hs [][2]string, name string) (string, bool) {
	for _, kv := range hs {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

// shadowClusterCfg has a shadow policy whose cluster rule comes first (so
// it is the first rule of the call) and, with ENFORCED set, an enforced
// policy with a cluster rule of its own.
func shadowClusterCfg(onError string, enforced bool) string {
	pols := `{"id":"trial","spec":{"mode":"shadow","rules":[{"name":"trial","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":2}}]}}`
	if enforced {
		pols += `,{"id":"main","spec":{"rules":[{"name":"main","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":5}}]}}`
	}
	return `{"bundle_version":1,"policies":[` + pols + `],"settings":{"rls":{"cluster":"rls","timeout_ms":25,"on_error":"` + onError + `"}}}`
}

// TestClusterShadowNeverRejects: a shadow cluster rule observes; whatever
// the service answers or fails to, only an enforced rule rejects, and the
// counts land on the rule they belong to.
func TestClusterShadowNeverRejects(t *testing.T) {
	req := filtertest.Get("/", "192.0.2.1:5000")
	failures := []struct {
		name    string
		failing func(f *fixture) filtertest.Result
	}{
		{"timeout", func(f *fixture) filtertest.Result {
			_, res := f.h.Start(f.p, req)
			if res.RequestAction != filter.Pause {
				t.Fatalf("action %v, want the request paused for the call", res.RequestAction)
			}
			resp := f.h.Deliver(f.p, f.h.Calls[0].Token, filtertest.CallResponse{})
			res.Response = resp
			if resp.Local == nil && len(f.h.Continued) != 1 {
				t.Fatalf("neither answered nor resumed: continued %v", f.h.Continued)
			}
			return res
		}},
		{"dispatch refused", func(f *fixture) filtertest.Result {
			f.h.CallError = errors.New("no such cluster")
			_, res := f.h.Start(f.p, req)
			return res
		}},
		{"HTTP 500", func(f *fixture) filtertest.Result {
			_, res := f.h.Start(f.p, req)
			res.Response = f.h.Deliver(f.p, f.h.Calls[0].Token, filtertest.CallResponse{Headers: [][2]string{{":status", "500"}}})
			return res
		}},
	}
	for _, fl := range failures {
		t.Run("shadow only, on_error deny, "+fl.name, func(t *testing.T) {
			f := newFixture(t, shadowClusterCfg("deny", false))
			res := fl.failing(f)
			if res.Local != nil {
				t.Fatalf("a shadow rule rejected: %d %q", res.Local.Status, res.Local.Body)
			}
			if got := f.counter("trial", filter.CounterFailOpen); got != 1 {
				t.Errorf("trial fail_open = %d, want 1", got)
			}
			if got := f.counter("trial", filter.CounterStoreDenied); got != 0 {
				t.Errorf("trial store_denied = %d, want 0", got)
			}
		})
		t.Run("shadow and enforced, on_error deny, "+fl.name, func(t *testing.T) {
			f := newFixture(t, shadowClusterCfg("deny", true))
			res := fl.failing(f)
			if res.Local == nil || res.Local.Status != 503 {
				t.Fatalf("reply %+v, want the enforced rule's 503", res.Local)
			}
			if v, _ := findHeader(res.Local.Headers, "x-tokengate-rule"); v != "main" {
				t.Errorf("503 names rule %q, want main (the enforced one)", v)
			}
			if got := f.counter("main", filter.CounterStoreDenied); got != 1 {
				t.Errorf("main store_denied = %d, want 1", got)
			}
			if got := f.counter("trial", filter.CounterStoreDenied); got != 0 {
				t.Errorf("trial store_denied = %d, want 0", got)
			}
			if got := f.counter("trial", filter.CounterFailOpen); got != 1 {
				t.Errorf("trial fail_open = %d, want 1", got)
			}
		})
	}

	t.Run("overall OVER_LIMIT without statuses, shadow only: passes", func(t *testing.T) {
		f := newFixture(t, shadowClusterCfg("deny", false))
		f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(2, nil)))
		if resp.Local != nil || len(f.h.Continued) != 1 {
			t.Fatalf("reply %+v, continued %v; want the request resumed", resp.Local, f.h.Continued)
		}
		if got := f.counter("trial", filter.CounterShadowRejected); got != 1 {
			t.Errorf("trial shadow_rejected = %d, want 1", got)
		}
		if got := f.counter("trial", filter.CounterRejected); got != 0 {
			t.Errorf("trial rejected = %d, want 0", got)
		}
	})

	t.Run("overall OVER_LIMIT without statuses, with an enforced rule: its 429", func(t *testing.T) {
		f := newFixture(t, shadowClusterCfg("deny", true))
		f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(2, nil)))
		if resp.Local == nil || resp.Local.Status != 429 {
			t.Fatalf("reply %+v, want a 429", resp.Local)
		}
		if v, _ := findHeader(resp.Local.Headers, "x-tokengate-rule"); v != "main" {
			t.Errorf("429 names rule %q, want main", v)
		}
		if got := f.counter("main", filter.CounterRejected); got != 1 {
			t.Errorf("main rejected = %d, want 1", got)
		}
		if got := f.counter("trial", filter.CounterRejected); got != 0 {
			t.Errorf("trial rejected = %d, want 0", got)
		}
	})

	t.Run("shadow status OVER_LIMIT, enforced OK: passes", func(t *testing.T) {
		f := newFixture(t, shadowClusterCfg("deny", true))
		f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, grpcOK(rlsResponse(1, []rlsStatus{{2, 0, 9}, {1, 4, 1}})))
		if resp.Local != nil || len(f.h.Continued) != 1 {
			t.Fatalf("reply %+v, continued %v; want the request resumed", resp.Local, f.h.Continued)
		}
		if a, b := f.counter("trial", filter.CounterShadowRejected), f.counter("main", filter.CounterAllowed); a != 1 || b != 1 {
			t.Errorf("trial shadow_rejected %d, main allowed %d; want 1 and 1", a, b)
		}
	})

	t.Run("on_error local, shadow only: observed in shared data, never rejects", func(t *testing.T) {
		f := newFixture(t, shadowClusterCfg("local", false))
		f.h.CallError = errors.New("no such cluster")
		for i := range 4 {
			if _, res := f.h.Start(f.p, req); res.Local != nil {
				t.Fatalf("request %d: %d from a shadow rule", i, res.Local.Status)
			}
		}
		if a, r := f.counter("trial", filter.CounterAllowed), f.counter("trial", filter.CounterShadowRejected); a != 2 || r != 2 {
			t.Errorf("trial allowed %d, shadow_rejected %d; want 2 and 2 (burst 2)", a, r)
		}
	})
}

// TestClusterCostExceedsBurst: a request that costs more than a cluster
// rule's burst gets what a local rule gives it (413, cost_exceeds_burst, no
// Retry-After) without a call to the service, and the local buckets that
// admitted it are refunded.
func TestClusterCostExceedsBurst(t *testing.T) {
	for _, tc := range []struct{ name, cfg, rule string }{
		{"exact", strings.Replace(clusterCfg, "ON_ERROR", "deny", 1), "global-ip"},
		{"lease", `{"rules":[
			{"name":"local-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":3}},
			{"name":"lease-ip","scope":"cluster","mode":"lease","limit_keys":["ip:address"],"algorithm_config":{"rps":5,"burst":10,"cost_source":"header:x-cost"}}],
			"settings":{"rls":{"cluster":"rls","timeout_ms":50,"on_error":"deny"}}}`, "lease-ip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, tc.cfg)
			local := newFixture(t, `{"rules":[{"name":"l","limit_keys":["ip:address"],"algorithm_config":{"rps":5,"burst":10,"cost_source":"header:x-cost"}}]}`)
			req := filtertest.Get("/", "192.0.2.1:5000", "x-cost", "11")
			_, res := f.h.Start(f.p, req)
			_, want := local.h.Start(local.p, req)
			if len(f.h.Calls) != 0 {
				t.Errorf("%d calls: the service was asked about a cost no bucket can hold", len(f.h.Calls))
			}
			if res.Local == nil || want.Local == nil || res.Local.Status != want.Local.Status || res.Local.Status != 413 {
				t.Fatalf("reply %+v, a local rule's %+v; want both 413", res.Local, want.Local)
			}
			for _, h := range []string{"x-tokengate-reason", "retry-after", "content-type"} {
				got, _ := findHeader(res.Local.Headers, h)
				exp, _ := findHeader(want.Local.Headers, h)
				if got != exp {
					t.Errorf("%s %q, a local rule's %q", h, got, exp)
				}
			}
			if v, _ := findHeader(res.Local.Headers, "x-tokengate-rule"); v != tc.rule {
				t.Errorf("x-tokengate-rule %q, want %s", v, tc.rule)
			}
			if got, exp := string(res.Local.Body), strings.Replace(string(want.Local.Body), `"l"`, `"`+tc.rule+`"`, 1); got != exp {
				t.Errorf("body %q, want %q (a local rule's)", got, exp)
			}
			if got := localTokens(t, f); got != "3.000000" {
				t.Errorf("local bucket %s, want 3: refunded", got)
			}
			if got := f.counter(tc.rule, filter.CounterRejected); got != 1 {
				t.Errorf("%s rejected = %d, want 1", tc.rule, got)
			}
			// A cost equal to the burst is the service's to decide. A
			// lease rule's request waits, and the worker's tick makes the
			// call for it: an exact take of its cost (no lease could hold
			// it), which admits it.
			f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:5000", "x-cost", "10"))
			if tc.name == "lease" {
				f.h.Tick(f.p)
			}
			if len(f.h.Calls) != 1 {
				t.Fatalf("%d calls for a cost equal to the burst, want 1", len(f.h.Calls))
			}
			if tc.name == "lease" {
				if n := exactTake(t, f.h, 0); n != 10 {
					t.Fatalf("an exact take of %d, want the cost 10", n)
				}
				f.h.Deliver(f.p, f.h.Calls[0].Token, takeAnswer(1, 0, 0))
				if len(f.h.Continued) != 1 {
					t.Errorf("continued %v, want the request admitted", f.h.Continued)
				}
			}
		})
	}
}

// TestClusterRetryAfterCapped: a service's duration_until_reset at the
// header cap (tokengate-rls's answer for a cost its bucket can never hold)
// plus the filter's jitter stays within the cap.
func TestClusterRetryAfterCapped(t *testing.T) {
	f := clusterFixture(t, "allow")
	for i := range 20 { // different identities, different jitters
		ip := "192.0.2." + strconv.Itoa(i+1) + ":1"
		f.h.Start(f.p, filtertest.Get("/", ip, "x-cost", "1"))
		resp := f.h.Deliver(f.p, f.h.Calls[len(f.h.Calls)-1].Token, grpcOK(rlsResponse(2, []rlsStatus{{2, 0, 1 << 30}})))
		if resp.Local == nil {
			t.Fatal("not rejected")
		}
		v, _ := findHeader(resp.Local.Headers, "retry-after")
		if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 1<<29 || n > 1<<30 {
			t.Errorf("%s: retry-after %q, want at most 2^30", ip, v)
		}
	}
}

// jsonFixture is clusterFixture with settings.rls.protocol "json".
func jsonFixture(t *testing.T, onError string) *fixture {
	return newFixture(t, strings.Replace(strings.Replace(clusterCfg, "ON_ERROR", onError, 1), `"timeout_ms":25`, `"timeout_ms":25,"protocol":"json"`, 1))
}

// jsonAnswer is an HTTP answer of a service's /json: status and a body
// written by hand, not by the filter's encoder.
func jsonAnswer(status, body string) filtertest.CallResponse {
	return filtertest.CallResponse{Headers: [][2]string{{":status", status}, {"content-type", "application/json"}}, Body: []byte(body)}
}

// TestClusterJSON: with settings.rls.protocol "json" the call is a POST of
// the RateLimitRequest in protobuf's JSON form to /json, and the answer is
// read as envoyproxy/ratelimit's /json gives it: 200 with OK, 429 with
// OVER_LIMIT, any other status an error for on_error.
func TestClusterJSON(t *testing.T) {
	req := filtertest.Get("/", "192.0.2.1:5000", "x-cost", "2.5")

	t.Run("configuration", func(t *testing.T) {
		for cfg, want := range map[string]string{
			`{"cluster":"rls","protocol":"json"}`: "",
			`{"cluster":"rls","protocol":"grpc"}`: "",
			`{"cluster":"rls","protocol":"http"}`: `settings.rls.protocol: must be "grpc" (unary gRPC on an HTTP/2 cluster) or "json" (JSON over HTTP/1.1 to /json), got "http"`,
			`{"cluster":"rls","protocol":1}`:      `settings.rls.protocol: must be "grpc"`,
		} {
			c, err := config.Parse([]byte(`{"rules":[{"name":"a","scope":"cluster","algorithm_config":{"rps":1,"burst":1}}],"settings":{"rls":` + cfg + `}}`))
			switch {
			case want == "" && err != nil:
				t.Errorf("%s: %v", cfg, err)
			case want == "" && (c.Settings.RLS.Protocol == config.RLSProtocolJSON) != strings.Contains(cfg, "json"):
				t.Errorf("%s: protocol %v", cfg, c.Settings.RLS.Protocol)
			case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
				t.Errorf("%s: error %v, want %q", cfg, err, want)
			}
		}
	})

	t.Run("the call", func(t *testing.T) {
		f := jsonFixture(t, "allow")
		f.h.Start(f.p, req)
		if len(f.h.Calls) != 1 {
			t.Fatalf("%d calls", len(f.h.Calls))
		}
		c := f.h.Calls[0]
		want := map[string]string{":method": "POST", ":path": "/json", ":authority": "rls", "content-type": "application/json"}
		for _, kv := range c.Headers {
			if w, ok := want[kv[0]]; ok && w != kv[1] {
				t.Errorf("header %s = %q, want %q", kv[0], kv[1], w)
			}
			if kv[0] == "te" {
				t.Errorf("te: %s on an HTTP/1.1 JSON call", kv[1])
			}
			delete(want, kv[0])
		}
		if len(want) != 0 || c.Cluster != "rls" || c.TimeoutMs != 25 {
			t.Errorf("call %+v; missing headers %v", c, want)
		}
		const body = `{"domain":"edge","descriptors":[{"entries":[{"key":"tokengate_rule","value":"global-ip"},{"key":"key","value":"192.0.2.1"}],"hitsAddend":"3"}]}`
		if string(c.Body) != body {
			t.Errorf("body\n%s\nwant\n%s", c.Body, body)
		}
	})

	t.Run("200 OK: resumed with the service's headers", func(t *testing.T) {
		f := jsonFixture(t, "deny")
		s, _ := f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, jsonAnswer("200", `{
		  "overallCode": "OK",
		  "statuses": [{"code": "OK", "currentLimit": {"requestsPerUnit": 10, "unit": "SECOND"}, "limitRemaining": 7, "durationUntilReset": "1s"}],
		  "responseHeadersToAdd": [{"key": "RateLimit", "value": "\"global-ip\";r=7;t=1"}]}`))
		if resp.Local != nil || len(f.h.Continued) != 1 {
			t.Fatalf("reply %+v, continued %v; want resumed", resp.Local, f.h.Continued)
		}
		f.h.Response = filtertest.Response{}
		s.OnResponseHeaders(0, false)
		var lines []string
		for _, kv := range f.h.Response.Headers {
			if kv[0] == "ratelimit" {
				lines = append(lines, kv[1])
			}
		}
		if len(lines) != 2 || lines[0] != `"global-ip";r=7;t=1` {
			t.Errorf("ratelimit lines %q, want the service's first (then the local rule's)", lines)
		}
		if got := f.counter("global-ip", filter.CounterAllowed); got != 1 {
			t.Errorf("allowed = %d", got)
		}
	})

	t.Run("429 OVER_LIMIT: 429, local refunded", func(t *testing.T) {
		f := jsonFixture(t, "deny")
		f.h.Start(f.p, req)
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, jsonAnswer("429",
			`{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","limitRemaining":0,"durationUntilReset":"2.500s"}]}`))
		if resp.Local == nil || resp.Local.Status != 429 {
			t.Fatalf("reply %+v, want 429", resp.Local)
		}
		if v, _ := findHeader(resp.Local.Headers, "retry-after"); v < "3" || len(v) != 1 {
			t.Errorf("retry-after %q, want 3 or 4 (2.5 s rounded up, plus jitter)", v)
		}
		if got := localTokens(t, f); got != "3.000000" {
			t.Errorf("local bucket %s, want 3 (refunded)", got)
		}
	})

	for _, tc := range []struct{ name, status, body string }{
		{"400 (envoyproxy/ratelimit's failed decision)", "400", "Bad Request\n"},
		{"500 (UNKNOWN)", "500", `{"overallCode":"UNKNOWN"}`},
		{"503 (tokengate-rls without Redis)", "503", "redis: timeout\n"},
		{"200 with a body that is not JSON", "200", "OK"},
		{"200 with an unknown code", "200", `{"overallCode":"MAYBE"}`},
		{"no response", "", ""},
	} {
		t.Run(tc.name+": on_error deny", func(t *testing.T) {
			f := jsonFixture(t, "deny")
			f.h.Start(f.p, req)
			var ans filtertest.CallResponse
			if tc.status != "" {
				ans = jsonAnswer(tc.status, tc.body)
			}
			resp := f.h.Deliver(f.p, f.h.Calls[0].Token, ans)
			if resp.Local == nil || resp.Local.Status != 503 {
				t.Fatalf("reply %+v, want on_error deny's 503", resp.Local)
			}
			if n, _ := f.h.Counter(filter.MetricRLSErrors); n != 1 {
				t.Errorf("rls_errors = %d", n)
			}
		})
	}

	t.Run("lease calls go as JSON too", func(t *testing.T) {
		f := newFixture(t, strings.Replace(leaseCfg, `"timeout_ms":50`, `"timeout_ms":50,"protocol":"json"`, 1))
		// Cold: the request waits for the tick's exact take.
		f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:1"))
		f.h.Tick(f.p)
		if len(f.h.Calls) != 1 {
			t.Fatalf("%d calls", len(f.h.Calls))
		}
		const take = `{"domain":"tokengate","descriptors":[{"entries":[{"key":"tokengate_rule","value":"lease-ip"},{"key":"key","value":"192.0.2.1"},{"key":"tokengate_mode","value":"lease"}],"hitsAddend":"1"}]}`
		if p, _ := findHeader(f.h.Calls[0].Headers, ":path"); p != "/json" || string(f.h.Calls[0].Body) != take {
			t.Errorf("cold call %s %s, want a JSON exact take %s", p, f.h.Calls[0].Body, take)
		}
		resp := f.h.Deliver(f.p, f.h.Calls[0].Token, jsonAnswer("200", `{"overallCode":"OK","statuses":[{"code":"OK","limitRemaining":19}]}`))
		if resp.Local != nil || len(f.h.Continued) != 1 {
			t.Fatalf("reply %+v, continued %v; want resumed", resp.Local, f.h.Continued)
		}
		// Demand continues: the next call is a lease request.
		f.h.Start(f.p, filtertest.Get("/", "192.0.2.1:1"))
		f.h.Tick(f.p)
		if len(f.h.Calls) != 2 {
			t.Fatalf("%d calls", len(f.h.Calls))
		}
		if p, _ := findHeader(f.h.Calls[1].Headers, ":path"); p != "/json" || !bytes.Contains(f.h.Calls[1].Body, []byte(`{"key":"tokengate_mode","value":"lease"}`)) ||
			!bytes.Contains(f.h.Calls[1].Body, []byte(`{"key":"tokengate_holder","value":"`)) {
			t.Errorf("lease call %s %s, want a JSON lease request", p, f.h.Calls[1].Body)
		}
		resp = f.h.Deliver(f.p, f.h.Calls[1].Token, jsonAnswer("200", `{"overallCode":"OK","statuses":[{"code":"OK","limitRemaining":16,"quota":{"requests":3,"id":"1"}}]}`))
		if resp.Local != nil || len(f.h.Continued) != 2 {
			t.Fatalf("reply %+v, continued %v; want resumed", resp.Local, f.h.Continued)
		}
		if r := record(t, f); r.Tokens != 2 || r.Grant != 1 {
			t.Errorf("record %+v, want 2 held under grant 1", r)
		}
	})
}
