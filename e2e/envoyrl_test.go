package e2e

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// envoyRLConfig is envoyproxy/ratelimit's domain for the filter's
// descriptors: ("tokengate_rule", rule name), then ("key", composite key)
// with no value, so every key gets a limit of its own. envoyproxy/ratelimit
// only has calendar-aligned fixed windows; an hour makes a window edge
// inside a test unlikely, and the tests check for it.
const envoyRLConfig = `domain: tokengate
descriptors:
  - key: tokengate_rule
    value: per-key
    descriptors:
      - key: key
        rate_limit:
          unit: hour
          requests_per_unit: 5
`

// envoyRLFilter is the filter's side: rule per-key decided by the service
// of cluster "ratelimit". Its own rps and burst only matter for on_error
// local, which decides the rule in shared data.
func envoyRLFilter(onError string) string {
	return `{"rules":[{"name":"per-key","scope":"cluster","limit_keys":["header:x-api-key"],
	  "algorithm_config":{"rps":0.001,"burst":2}}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":1000,"on_error":"` + onError + `"}}}`
}

// sameHour reports whether t0 and t1 fall in one calendar hour (UTC), the
// window of envoyRLConfig.
func sameHour(t0, t1 time.Time) bool {
	return t0.UTC().Truncate(time.Hour).Equal(t1.UTC().Truncate(time.Hour))
}

// TestFilterAgainstEnvoyRatelimit runs the built module in the local host
// with a cluster-scope rule whose service is envoyproxy/ratelimit itself,
// on a real Redis: the RLS v3 messages the filter encodes by hand are
// understood by the reference server, and its answers (OVER_LIMIT, its
// RateLimit-* response headers (LIMIT_RESPONSE_HEADERS_ENABLED)) by the filter.
func TestFilterAgainstEnvoyRatelimit(t *testing.T) {
	redis := redistest.Start(t)
	rl := startEnvoyRatelimit(t, redis.Addr, envoyRLConfig, true)
	_, srv := startClusterHost(t, envoyRLFilter("deny"), rlsBootstrap(rl.GRPC), 2)

	t.Run("burst then 429", func(t *testing.T) {
		for attempt := 0; attempt < 2; attempt++ {
			key := "alice-" + strconv.Itoa(attempt)
			t0 := time.Now()
			var codes []int
			var last *http.Response
			var lastBody string
			for range 7 {
				resp, body := getKey(t, srv, key)
				codes = append(codes, resp.StatusCode)
				last, lastBody = resp, body
				if resp.StatusCode == http.StatusOK && resp.Header.Get("ratelimit-limit") != "5" {
					t.Errorf("admitted without the service's RateLimit-Limit: %v", resp.Header)
				}
			}
			if !sameHour(t0, time.Now()) {
				continue // the fixed window rolled over mid-test: try again
			}
			want := []int{200, 200, 200, 200, 200, 429, 429}
			if !slices.Equal(codes, want) {
				t.Fatalf("codes %v, want %v", codes, want)
			}
			h := last.Header
			if h.Get("x-tokengate-rule") != "per-key" || h.Get("x-tokengate-reason") == "" {
				t.Errorf("429 without the rule headers: %v", h)
			}
			if ra, err := strconv.Atoi(h.Get("retry-after")); err != nil || ra < 1 || ra > 5401 {
				t.Errorf("retry-after %q, want 1..5401 (the rest of the hour, plus the filter's spread of up to half)", h.Get("retry-after"))
			}
			if h.Get("ratelimit-limit") != "5" || h.Get("ratelimit-remaining") != "0" {
				t.Errorf("429 without the service's RateLimit headers: %v", h)
			}
			if want := `"rule":"per-key"`; !strings.Contains(lastBody, want) {
				t.Errorf("body %q, want it to name the rule", lastBody)
			}
			return
		}
		t.Fatal("two window edges in a row")
	})

	t.Run("keys are isolated", func(t *testing.T) {
		t0 := time.Now()
		admitted := map[string]int{}
		for range 7 {
			for _, k := range []string{"bob", "carol", "dave"} {
				if resp, _ := getKey(t, srv, k); resp.StatusCode == http.StatusOK {
					admitted[k]++
				} else if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("key %s: status %d", k, resp.StatusCode)
				}
			}
		}
		if !sameHour(t0, time.Now()) {
			t.Skip("the fixed window rolled over mid-test")
		}
		for _, k := range []string{"bob", "carol", "dave"} {
			if admitted[k] != 5 {
				t.Errorf("key %s: %d admitted, want 5 (each key its own limit)", k, admitted[k])
			}
		}
	})

	t.Run("on_error when the service is down", func(t *testing.T) {
		hosts := map[string]string{}
		for _, oe := range []string{"allow", "deny", "local"} {
			_, s := startClusterHost(t, envoyRLFilter(oe), rlsBootstrap(rl.GRPC), 2)
			hosts[oe] = s.URL
		}
		if err := rl.Stop(); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			onError string
			want    []int
		}{
			{"allow", []int{200, 200, 200, 200}},
			{"deny", []int{503, 503, 503, 503}},
			// Shared-data buckets of burst 2 decide instead.
			{"local", []int{200, 200, 429, 429}},
		} {
			var codes []int
			for range len(tc.want) {
				t0 := time.Now()
				resp, body := getURL(t, hosts[tc.onError]+"/", map[string]string{"x-api-key": "erin"})
				if d := time.Since(t0); d > time.Second+callSlack {
					t.Errorf("on_error %s: a request took %v with timeout_ms 1000 (+ %v slack, see callSlack)", tc.onError, d, callSlack)
				}
				codes = append(codes, resp.StatusCode)
				if resp.StatusCode == http.StatusServiceUnavailable && !strings.Contains(body, "rls_error") {
					t.Errorf("on_error deny: body %q, want reason rls_error", body)
				}
			}
			if !slices.Equal(codes, tc.want) {
				t.Errorf("on_error %s: codes %v, want %v", tc.onError, codes, tc.want)
			}
		}
	})
}

// TestEnvoyRatelimitRedisDown: envoyproxy/ratelimit up, its Redis gone; the
// filter sees an error or a timeout and follows on_error deny, admitting
// nothing.
func TestEnvoyRatelimitRedisDown(t *testing.T) {
	redis := redistest.Start(t)
	rl := startEnvoyRatelimit(t, redis.Addr, envoyRLConfig, false)
	_, srv := startClusterHost(t, envoyRLFilter("deny"), rlsBootstrap(rl.GRPC), 2)
	if resp, _ := getKey(t, srv, "frank"); resp.StatusCode != http.StatusOK {
		t.Fatalf("with Redis up: %d", resp.StatusCode)
	}
	redis.Kill()
	for i := range 3 {
		t0 := time.Now()
		resp, _ := getKey(t, srv, "frank")
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("request %d with Redis down: %d, want 503 (on_error deny)", i, resp.StatusCode)
		}
		if d := time.Since(t0); d > time.Second+callSlack {
			t.Errorf("request %d took %v with timeout_ms 1000 (+ %v slack, see callSlack)", i, d, callSlack)
		}
	}
}
