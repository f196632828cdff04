package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/rlscontract"
)

// overrideConfig has a monthly quota of 3 requests per API key (a month,
// so that the test is not cut by a period's end but once in millions of
// runs) and a token bucket of burst 2 that (almost) never refills, per
// API key.
const overrideConfig = `{
  "settings": {"rls": {"cluster": "rls"}},
  "rules": [
    {"name": "monthly", "scope": "cluster", "algorithm": "quota", "limit_keys": ["header:x-api-key"],
     "algorithm_config": {"limit": 3, "period": "month", "time_zone": "UTC"}},
    {"name": "bucket", "scope": "cluster", "limit_keys": ["header:x-api-key"],
     "algorithm_config": {"tokens_per_second": 0.000001, "burst": 2}}
  ]
}`

// overrideAdminCred is the admins' credential of TestOverrideAcrossReplicas.
const overrideAdminCred = "override-test-admin-credential"

// TestOverrideAcrossReplicas is issue 31's override test: two built
// tokengate-rls processes on one Redis; an override set, changed or
// removed through replica A's admin API is applied by replica B's very
// next ShouldRateLimit, with no wait between the two calls. For a quota:
// raised (a key at its limit is admitted again), lowered below what the
// key used (refused at once), removed (the rule's limit again). For a
// token bucket: a rate override refills an empty bucket that the rule
// would leave empty for a million seconds, and a burst override caps a
// fresh key below the rule's burst. Each step fails if B decided with
// the rule's limit instead of the override.
func TestOverrideAcrossReplicas(t *testing.T) {
	redis := redistest.Start(t)
	credFile := filepath.Join(t.TempDir(), "admin-credential")
	if err := os.WriteFile(credFile, []byte(overrideAdminCred+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startTokengateRLS(t, overrideConfig, redis.Addr, "-admin-credential-file", credFile)
	b := startTokengateRLS(t, overrideConfig, redis.Addr, "-admin-credential-file", credFile)
	replicaB := rlsClient(t, b.Addr)

	decide := func(rule, key string) bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		d := rlscontract.ClusterDescriptor(rule, key, 1)
		pd := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range d.Entries {
			pd.Entries = append(pd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
		}
		resp, err := replicaB.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{pd}})
		if err != nil {
			t.Fatalf("replica B: %s %s: %v", rule, key, err)
		}
		return resp.OverallCode == rlsv3.RateLimitResponse_OK
	}
	admin := func(method, path, body string) map[string]any {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+a.Admin+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("authorization", "Bearer "+overrideAdminCred)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("replica A: %s %s: %d %s", method, path, resp.StatusCode, raw)
		}
		var out map[string]any
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("replica A: %s %s: %v: %s", method, path, err, raw)
		}
		return out
	}
	// expect runs decisions on B and compares the admitted ones with want.
	expect := func(step, rule, key string, want ...bool) {
		t.Helper()
		for i, w := range want {
			if got := decide(rule, key); got != w {
				t.Fatalf("%s: request %d of %s/%s on replica B: admitted %v, want %v", step, i+1, rule, key, got, w)
			}
		}
	}

	// Quota: the rule's 3 a day.
	expect("the rule's quota", "monthly", "q", true, true, true, false)
	admin("PUT", "/v1/overrides/monthly?key=q", `{"limit": 5}`)
	expect("raised to 5 through A", "monthly", "q", true, true, false)
	admin("PUT", "/v1/overrides/monthly?key=q", `{"limit": 1}`)
	expect("lowered to 1, below the 5 used", "monthly", "q", false)
	admin("DELETE", "/v1/overrides/monthly?key=q", "")
	expect("removed: the rule's 3, 5 used", "monthly", "q", false)
	admin("PUT", "/v1/overrides/monthly?key=q", `{"limit": 6}`)
	expect("raised to 6", "monthly", "q", true, false)
	u := admin("GET", "/v1/usage/monthly?key=q", "")
	if u["used"] != 6.0 || u["limit"] != 6.0 || u["remaining"] != 0.0 || u["source"] != "override" || u["period"] != "month" {
		t.Errorf("usage through A: %v, want used 6 of an override's 6, none left", u)
	}

	// Token bucket: burst 2, refilling one token in a million seconds.
	expect("the rule's bucket", "bucket", "k", true, true, false)
	admin("PUT", "/v1/overrides/bucket?key=k", `{"rate": 1000000, "burst": 1000000}`)
	// The decision after the PUT's round trip (more than a microsecond)
	// finds at least one token refilled at the override's rate; at the
	// rule's it would find none.
	expect("rate override through A", "bucket", "k", true)
	admin("PUT", "/v1/overrides/bucket?value=fresh", `{"burst": 1}`)
	expect("burst lowered to 1 for a fresh key", "bucket", "fresh", true, false)
	admin("DELETE", "/v1/overrides/bucket?key=k", "")
	admin("DELETE", "/v1/overrides/bucket?key=fresh", "")
}
