package filter_test

import (
	"slices"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
)

// headerCase is one expectation on a reply's headers: "" means absent.
type headerCase map[string]string

func checkHeaders(t *testing.T, what string, res filtertest.Result, want headerCase) {
	t.Helper()
	for k, v := range want {
		if got := res.Header(k); got != v {
			t.Errorf("%s: %s got %q, want %q", what, k, got, v)
		}
	}
}

// TestRejectionHeadersTellTheTruth is issue 11's item 6: a rejection's
// r is the whole tokens the bucket holds and t (and Retry-After) when this
// request could pass; a request that can never pass is a 413 with no
// Retry-After, so a client that retries on 429 stops.
func TestRejectionHeadersTellTheTruth(t *testing.T) {
	const cfg = `{"name":"llm","limit_keys":["ip:address"],
		"algorithm_config":{"rps":1,"burst":10,"cost_source":"header:x-cost","default_cost":1}}`
	t.Run("variable cost", func(t *testing.T) {
		f := newFixture(t, cfg)
		if res := f.get("x-cost", "7"); res.Status() != 200 {
			t.Fatalf("first: %d", res.Status())
		}
		// 3 tokens left, the request costs 5: 2 more tokens, 2 s at 1/s.
		res := f.get("x-cost", "5")
		if res.Status() != 429 {
			t.Fatalf("second: %d", res.Status())
		}
		checkHeaders(t, "429", res, headerCase{
			"ratelimit":           `"llm";r=3;t=2`,
			"ratelimit-remaining": "3",
			"ratelimit-reset":     "2",
		})
		if ra := res.Header("retry-after"); ra < "2" || ra > "3" {
			t.Errorf("Retry-After %q, want 2 plus at most 50%% jitter", ra)
		}
	})
	t.Run("cost exceeds burst on a fresh bucket", func(t *testing.T) {
		f := newFixture(t, cfg)
		res := f.get("x-cost", "11")
		if res.Status() != 413 {
			t.Fatalf("status %d, want 413: it can never pass", res.Status())
		}
		checkHeaders(t, "413", res, headerCase{
			"retry-after":        "",
			"ratelimit":          `"llm";r=10;t=0`,
			"x-tokengate-reason": filter.ReasonCostExceedsBurst,
		})
		if res.Local.GRPCStatus != filter.NoGRPCStatus {
			t.Errorf("grpc status %d on an HTTP request", res.Local.GRPCStatus)
		}
	})
}

// TestSeveralRulesListEveryRule is item 7: one RateLimit and
// RateLimit-Policy member per enforced rule, on admissions and rejections;
// the legacy headers describe the rule that rejected.
func TestSeveralRulesListEveryRule(t *testing.T) {
	f := newFixture(t, `{"rules":[
		{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1,"burst":10}},
		{"name":"per-path","limit_keys":["path"],"algorithm_config":{"rps":1,"burst":2}},
		{"name":"per-host","limit_keys":["path"],"algorithm_config":{"rps":1,"burst":5}}],
		"settings":{}}`)
	f.get()
	f.get()
	res := f.get() // per-path is empty
	if res.Status() != 429 {
		t.Fatalf("third request: %d", res.Status())
	}
	checkHeaders(t, "429", res, headerCase{
		"ratelimit-policy":    `"per-ip";q=10;w=10, "per-path";q=2;w=2, "per-host";q=5;w=5`,
		"x-tokengate-rule":    "per-path",
		"ratelimit-limit":     "2",
		"ratelimit-remaining": "0",
	})
	if got, want := res.Header("ratelimit"), `"per-ip";r=8;t=2, "per-path";r=0;t=1, "per-host";r=3;t=2`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
}

// TestUpstreamRateLimitKept is item 8: the upstream's own RateLimit and
// RateLimit-Policy are kept, ours added after them as lines of their own
// (both are lists, so the lines are one list: "api" then "edge"); the
// legacy headers, which are not lists, are replaced.
func TestUpstreamRateLimitKept(t *testing.T) {
	f := newFixture(t, `{"name":"edge","algorithm_config":{"rps":5,"burst":10}}`)
	req := filtertest.Get("/", "192.0.2.1:5000")
	req.UpstreamHeaders = [][2]string{{"ratelimit", `"api";r=41;t=30`}, {"ratelimit-policy", `"api";q=50;w=60`},
		{"ratelimit-remaining", "41"}}
	res := f.do(req)
	for name, want := range map[string][]string{
		"ratelimit":           {`"api";r=41;t=30`, `"edge";r=9;t=1`},
		"ratelimit-policy":    {`"api";q=50;w=60`, `"edge";q=10;w=2`},
		"ratelimit-remaining": {"9"},
		"ratelimit-limit":     {"10"},
	} {
		var got []string
		for _, kv := range res.Headers {
			if kv[0] == name {
				got = append(got, kv[1])
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s lines %q, want %q", name, got, want)
		}
	}
}

// TestResponseSettings is item 9: what Envoy's local_ratelimit lets an
// operator choose: no RateLimit headers, no rule names, the status and the
// body of a rejection.
func TestResponseSettings(t *testing.T) {
	rule := `{"name":"secret-rule","algorithm_config":{"rps":1,"burst":1}}`
	tests := []struct {
		name     string
		settings string
		status   uint32
		headers  headerCase
		body     string
	}{
		{"defaults", `{}`, 429,
			headerCase{"ratelimit": `"secret-rule";r=0;t=1`, "x-tokengate-rule": "secret-rule", "content-type": "application/json"},
			`{"error":"rate_limited","reason":"token_bucket_exceeded","rule":"secret-rule","retry_after":1}` + "\n"},
		{"headers off", `{"ratelimit_headers":false}`, 429,
			headerCase{"ratelimit": "", "ratelimit-policy": "", "ratelimit-limit": "", "ratelimit-remaining": "", "ratelimit-reset": "", "retry-after": "1"},
			`{"error":"rate_limited","reason":"token_bucket_exceeded","rule":"secret-rule","retry_after":1}` + "\n"},
		{"rule names hidden", `{"rule_headers":false}`, 429,
			headerCase{"x-tokengate-rule": "", "x-tokengate-reason": "", "retry-after": "1"},
			`{"error":"rate_limited","reason":"token_bucket_exceeded","retry_after":1}` + "\n"},
		{"status and body", `{"rejection_status":503,"rejection_body":"slow down\n"}`, 503,
			headerCase{"content-type": "text/plain", "retry-after": "1"}, "slow down\n"},
		{"body with a type", `{"rejection_body":"<p>slow</p>","rejection_content_type":"text/html"}`, 429,
			headerCase{"content-type": "text/html"}, "<p>slow</p>"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, `{"rules":[`+rule+`],"settings":`+tc.settings+`}`)
			if res := f.get(); res.Status() != 200 {
				t.Fatalf("first: %d", res.Status())
			}
			res := f.get()
			if res.Status() != tc.status {
				t.Fatalf("status %d, want %d", res.Status(), tc.status)
			}
			checkHeaders(t, tc.name, res, tc.headers)
			if res.Local.Body != tc.body {
				t.Errorf("body %q, want %q", res.Local.Body, tc.body)
			}
		})
	}
	t.Run("headers off on admissions", func(t *testing.T) {
		f := newFixture(t, `{"rules":[`+rule+`],"settings":{"ratelimit_headers":false}}`)
		if res := f.get(); res.Status() != 200 || len(res.Headers) != 0 {
			t.Errorf("got %d with headers %v, want 200 with none", res.Status(), res.Headers)
		}
	})
}

// TestGRPCDetection is issue 11's item 11: Envoy's rule, case-insensitive,
// in the filter (the local host applies the same rule).
func TestGRPCDetection(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc": true, "Application/GRPC": true, "application/grpc+proto": true,
		"application/grpc;charset=utf-8": true, "application/grpc-web": false, "application/grpc-web+proto": false,
		"application/grpcx": false, "application/json": false, "": false, "application/grp": false,
	} {
		if got := filter.IsGRPC(ct); got != want {
			t.Errorf("IsGRPC(%q) = %v, want %v", ct, got, want)
		}
	}
	f := newFixture(t, `{"name":"g","algorithm_config":{"rps":1,"burst":1}}`)
	f.get("content-type", "Application/GRPC")
	res := f.get("content-type", "Application/GRPC")
	if res.Local == nil || res.Local.GRPCStatus != 8 {
		t.Fatalf("a 429 to Application/GRPC: %+v, want gRPC RESOURCE_EXHAUSTED", res.Local)
	}
}
