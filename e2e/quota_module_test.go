package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// quotaRule is clusterEstimateConfig's rule fields for a monthly quota of
// limit tokens charged the usage the response reports, with the body's
// max_tokens as its estimate; extra adds fields to its algorithm_config.
func quotaRule(limit int, extra string) string {
	return fmt.Sprintf(`"algorithm":"quota","algorithm_config":{"limit":%d,"period":"month","cost_source":"response_json:/usage/total_tokens",`+
		`"estimate_source":"request_json:/max_tokens","pre_charge":0%s}`, limit, extra)
}

// quotaUsed returns the consumption Redis holds for the quota of rule and
// key in the current period (the one qt:{rule:key}:<start> hash; the
// streams' receipts, qt:{rule:key}:<start>:r:<id>, are not consumption),
// or -1 if none.
func quotaUsed(t *testing.T, redis *redistest.Server, rule, key string) float64 {
	t.Helper()
	v, err := redis.Do("KEYS", "qt:{"+rule+":"+key+"}:*")
	if err != nil {
		t.Fatal(err)
	}
	var keys []any
	for _, k := range v.([]any) {
		if !strings.Contains(k.(string), ":r:") {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return -1
	}
	if len(keys) > 1 {
		t.Fatalf("quota keys %v: more than one period", keys)
	}
	u, err := redis.Do("HGET", keys[0].(string), "u")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := u.(string)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("HGET %s u: %q", keys[0], s)
	}
	return f
}

// waitQuotaUsed waits until the quota's consumption is want, or fails.
func waitQuotaUsed(t *testing.T, redis *redistest.Server, rule, key string, want float64) {
	t.Helper()
	var got float64
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if got = quotaUsed(t, redis, rule, key); got == want {
			return
		}
	}
	t.Fatalf("quota %s:%s used %v, want %v", rule, key, got, want)
}

// TestQuotaThroughTheModule: a quota rule through the built module and
// tokengate-rls on a real Redis. The body's max_tokens is reserved before
// the upstream runs and the usage the response reports is what the
// period's consumption ends at (settled in the service); the service's
// RateLimit headers and its threshold warning reach the client; a
// request the quota cannot cover is refused with the service's 429 and
// its headers, and consumes nothing. The identity's limit (limit_source)
// raises the quota for its key, within max_limit.
func TestQuotaThroughTheModule(t *testing.T) {
	redis := redistest.Start(t)
	cfg := fmt.Sprintf(clusterEstimateConfig, quotaRule(100, `,"thresholds":[0.5,0.9],"limit_source":"header:x-plan-tokens","max_limit":150`))
	rls := startTokengateRLS(t, cfg, redis.Addr)
	up := &billingUpstream{}
	h, srv := startSettleFleetHost(t, cfg, rlsBootstrap(rls.Addr), up)
	c := srv.Client()
	ended := uint64(0)
	post := func(key string, tokens, maxTokens int, hd map[string]string, want int) response {
		t.Helper()
		if hd == nil {
			hd = map[string]string{}
		}
		hd["x-api-key"] = key
		r, err := doBody(c, srv, "/llm?tokens="+strconv.Itoa(tokens), hd, `{"max_tokens":`+strconv.Itoa(maxTokens)+`}`)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != want {
			t.Fatalf("max_tokens %d: status %d, want %d: %s", maxTokens, r.status, want, r.body)
		}
		ended++
		waitStreamsEnded(t, h, ended)
		return r
	}

	// 30 reserved (remaining 70 when the upstream runs), 20 used.
	r := post("a", 20, 30, nil, 200)
	if got := r.header.Get("RateLimit-Policy"); !strings.Contains(got, `"llm";q=100;w=`) {
		t.Errorf("RateLimit-Policy %q, want the quota's (q=100)", got)
	}
	if got := r.header.Get("RateLimit"); !strings.Contains(got, `"llm";r=70;t=`) {
		t.Errorf("RateLimit %q, want r=70 (100 - the 30 reserved)", got)
	}
	waitQuotaUsed(t, redis, "llm", "a", 20)

	// 40 more reserved crosses 50 %: the warning; 40 used.
	r = post("a", 40, 40, nil, 200)
	if got := r.header.Get("Tokengate-Quota-Warning"); got != `"llm";t=50` {
		t.Errorf("Tokengate-Quota-Warning %q, want \"llm\";t=50", got)
	}
	waitQuotaUsed(t, redis, "llm", "a", 60)

	// 41 cannot be covered (40 remain): refused by the service before the
	// upstream, nothing consumed, the headers' hit given back (it is still
	// held when the body's 40 are refused: r=39).
	r = post("a", 1, 41, nil, 429)
	if r.header.Get("Retry-After") == "" || !strings.Contains(r.header.Get("RateLimit"), `"llm";r=39;`) {
		t.Errorf("429: Retry-After %q, RateLimit %q (want r=39)", r.header.Get("Retry-After"), r.header.Get("RateLimit"))
	}
	waitQuotaUsed(t, redis, "llm", "a", 60)
	if got := up.served.Load(); got != 2 {
		t.Errorf("upstream served %d, want 2", got)
	}

	// Usage over the estimate is charged in full after the response.
	post("a", 45, 10, nil, 200)
	waitQuotaUsed(t, redis, "llm", "a", 105)
	post("a", 1, 1, nil, 429)

	// An identity carrying 130 gets 130 (within max_limit 150); one
	// claiming 10^6 gets max_limit.
	r = post("b", 1, 120, map[string]string{"x-plan-tokens": "130"}, 200)
	if got := r.header.Get("RateLimit-Policy"); !strings.Contains(got, `q=130;`) {
		t.Errorf("identity limit 130: RateLimit-Policy %q", got)
	}
	r = post("c", 1, 150, map[string]string{"x-plan-tokens": "1000000"}, 200)
	if got := r.header.Get("RateLimit-Policy"); !strings.Contains(got, `q=150;`) {
		t.Errorf("identity limit 10^6 bounded by max_limit 150: RateLimit-Policy %q", got)
	}
	post("d", 1, 101, map[string]string{"x-plan-tokens": "1000000"}, 200) // over the rule's 100, within 150
}

// TestQuotaEstimateParallelBound is TestClusterEstimateParallelBound on a
// quota rule: P clients in parallel spend a monthly quota of Q tokens,
// each request estimating e and the upstream reporting u; what the upstream
// reports in all is at most Q + P*max(0, u-e), at least
// Q - e - (P-1)*max(0, e-u), and the
// period's consumption in Redis ends at exactly that.
func TestQuotaEstimateParallelBound(t *testing.T) {
	for _, tc := range []struct {
		name          string
		estimate, use int
	}{
		{"usage within the estimate", 10, 8},
		{"usage over the estimate", 10, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			redis, billed := testEstimateParallel(t, quotaRule(100, ""), "", 100, tc.estimate, tc.use)
			waitQuotaUsed(t, redis, "llm", "k", float64(billed))
		})
	}
}
