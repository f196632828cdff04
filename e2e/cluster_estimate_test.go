package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// clusterEstimateConfig is one cluster token bucket of B tokens (a refill
// too slow to show in six decimals: a budget) charged the usage an
// OpenAI-style response reports, with the request body's max_tokens as its
// estimate (issue 31: accepted for cluster rules). %s is the rule's
// algorithm and algorithm_config fields.
const clusterEstimateConfig = `{"rules":[
  {"name":"llm","scope":"cluster","limit_keys":["header:x-api-key"],%s}],
 "settings":{"rls":{"cluster":"ratelimit","timeout_ms":5000,"on_error":"deny"}}}`

// estimateBucket is clusterEstimateConfig's token bucket of burst b.
func estimateBucket(b int) string {
	return fmt.Sprintf(`"algorithm_config":{"tokens_per_second":1e-7,"burst":%d,"cost_source":"response_json:/usage/total_tokens",`+
		`"estimate_source":"request_json:/max_tokens","pre_charge":0}`, b)
}

// billingUpstream answers /llm?tokens=N with N as the usage, and counts the
// requests it served and the tokens it reported (what a provider bills).
type billingUpstream struct {
	served, tokens atomic.Int64
	// inFlight and maxInFlight: requests the upstream is serving now, and
	// the most at once.
	inFlight, maxInFlight atomic.Int64
	hold                  time.Duration
}

func (u *billingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.inFlight.Add(1)
	defer u.inFlight.Add(-1)
	for {
		m := u.maxInFlight.Load()
		if n <= m || u.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	_, _ = io.Copy(io.Discard, r.Body)
	tokens, _ := strconv.Atoi(r.URL.Query().Get("tokens"))
	if u.hold > 0 {
		time.Sleep(u.hold) // overlap the parallel requests (no assertion depends on it)
	}
	u.served.Add(1)
	u.tokens.Add(int64(tokens))
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"usage":{"total_tokens":`+strconv.Itoa(tokens)+`}}`)
}

// waitRedisTokens waits until key holds want tokens, or fails.
func waitRedisTokens(t *testing.T, redis *redistest.Server, key, want string) {
	t.Helper()
	var got string
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if got = redisTokens(t, redis, key); got == want {
			return
		}
	}
	t.Fatalf("%s: tokens %q, want %q", key, got, want)
}

// TestClusterRequestJSONEstimate: a cluster rule takes the estimate stated
// in the request body from the service before the upstream runs, and
// settles the usage after the response, through the built module, against
// tokengate-rls on a real Redis. Sequentially the bucket is exact: a
// response of 10 tokens on an estimate of 30 leaves 90 of 100; an
// estimate of 95 is then refused by the service (429, the upstream never
// sees it) and what its headers took (1 hit) is given back; an estimate of
// 90 still passes.
func TestClusterRequestJSONEstimate(t *testing.T) {
	redis := redistest.Start(t)
	cfg := fmt.Sprintf(clusterEstimateConfig, estimateBucket(100))
	rls := startTokengateRLS(t, cfg, redis.Addr)
	up := &billingUpstream{}
	h, srv := startSettleFleetHost(t, cfg, rlsBootstrap(rls.Addr), up)
	c := srv.Client()
	ended := uint64(0)
	post := func(tokens, maxTokens, want int) response {
		t.Helper()
		r, err := doBody(c, srv, "/llm?tokens="+strconv.Itoa(tokens), map[string]string{"x-api-key": "k"},
			`{"model":"m","max_tokens":`+strconv.Itoa(maxTokens)+`}`)
		if err != nil {
			t.Fatal(err)
		}
		if r.status != want {
			t.Fatalf("max_tokens %d: got %d, want %d: %s", maxTokens, r.status, want, r.body)
		}
		ended++
		waitStreamsEnded(t, h, ended)
		return r
	}
	post(10, 30, 200)
	waitRedisTokens(t, redis, "tb:{llm:k}", "90.000000") // 100 - 10: the 30 reserved, 20 refunded
	r := post(1, 95, 429)
	if r.header.Get("Retry-After") == "" {
		t.Errorf("429 of the estimate: no Retry-After")
	}
	waitRedisTokens(t, redis, "tb:{llm:k}", "90.000000") // the headers' hit given back
	if got := up.served.Load(); got != 1 {
		t.Fatalf("the upstream served %d requests, want 1: the refused estimate reached it", got)
	}
	post(5, 90, 200)
	waitRedisTokens(t, redis, "tb:{llm:k}", "85.000000")
	if got, want := metric(t, h, "llm", "allowed"), uint64(2); got != want {
		t.Errorf("allowed: got %d, want %d (counted once each, when the body was read)", got, want)
	}
	if got := metric(t, h, "llm", "rejected"); got != 1 {
		t.Errorf("rejected: got %d, want 1", got)
	}
}

// TestClusterEstimateParallelBound: P clients in parallel spend one budget
// B through the built module and tokengate-rls, each request estimating e
// tokens in its body and the upstream reporting u. The service reserves
// each estimate before the upstream runs, so what the upstream reports in
// all (what the provider bills) is at most B + P*max(0, u-e)
// (filter/cluster_estimate.go): exactly B when the usage stays within the
// estimate, and at least B - e - (P-1)*max(0, e-u) since demand exceeds
// the budget (docs/configuration.md). Afterwards
// Redis holds B minus exactly what the upstream reported: every
// settlement arrived.
func TestClusterEstimateParallelBound(t *testing.T) {
	for _, tc := range []struct {
		name          string
		estimate, use int
	}{
		{"usage within the estimate", 10, 8},
		{"usage over the estimate", 10, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testEstimateParallel(t, estimateBucket(100), "tb:{llm:k}", 100, tc.estimate, tc.use)
		})
	}
}

// testEstimateParallel runs P clients against rule (clusterEstimateConfig's
// rule fields) with budget b; key is the Redis key of the bucket whose
// tokens are b minus the consumption, "" to skip that check. It returns
// the Redis and what the upstream reported in all.
func testEstimateParallel(t *testing.T, rule, key string, b, e, u int) (*redistest.Server, int) {
	const P, perClient = 8, 40
	redis := redistest.Start(t)
	cfg := fmt.Sprintf(clusterEstimateConfig, rule)
	rls := startTokengateRLS(t, cfg, redis.Addr)
	up := &billingUpstream{hold: 5 * time.Millisecond}
	h, srv := startSettleFleetHost(t, cfg, rlsBootstrap(rls.Addr), up)
	var wg sync.WaitGroup
	var admitted, refused, streams atomic.Int64
	errs := make(chan error, P)
	for i := 0; i < P; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clientFrom("127.0.0.1", 1)
			for k := 0; k < perClient; k++ {
				r, err := doBody(c, srv, "/llm?tokens="+strconv.Itoa(u), map[string]string{"x-api-key": "k"},
					`{"max_tokens":`+strconv.Itoa(e)+`}`)
				if err != nil {
					errs <- err
					return
				}
				streams.Add(1)
				switch r.status {
				case 200:
					admitted.Add(1)
				case 429:
					refused.Add(1)
					return // this client's budget is spent
				default:
					errs <- fmt.Errorf("status %d: %s", r.status, r.body)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	waitStreamsEnded(t, h, uint64(streams.Load()))
	billed := int(up.tokens.Load())
	bound := b + P*max(0, u-e)
	t.Logf("admitted %d, refused %d, upstream reported %d tokens (bound %d), at most %d at once upstream",
		admitted.Load(), refused.Load(), billed, bound, up.maxInFlight.Load())
	if int(up.served.Load()) != int(admitted.Load()) {
		t.Errorf("upstream served %d, clients saw %d admitted", up.served.Load(), admitted.Load())
	}
	if billed > bound {
		t.Errorf("consumed %d tokens, over the bound B + P*max(0, u-e) = %d", billed, bound)
	}
	// A client stops at its first refusal, and a refusal means less than
	// one estimate was left counting the reservations in flight, which
	// may then settle lower: up to P-1 of them give back e-u each.
	if low := b - e - (P-1)*max(0, e-u); billed < low {
		t.Errorf("consumed %d tokens with demand over the budget, want at least B - e - (P-1)*max(0, e-u) = %d", billed, low)
	}
	if refused.Load() == 0 {
		t.Errorf("no request was refused: demand (%d requests of %d) did not exceed the budget", P*perClient, u)
	}
	if key != "" {
		waitRedisTokens(t, redis, key, strconv.Itoa(b-billed)+".000000")
	}
	return redis, billed
}
