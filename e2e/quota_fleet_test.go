package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// The quota fleet tests: three proxies (the built module in three local
// hosts, two worker VMs each) and 64 concurrent clients spend per-key
// quotas decided by one tokengate-rls on a real Redis. The period is a
// calendar month; a test that finds the month changed while it ran says
// so and checks nothing (its keys' consumption then spans two periods).

const (
	fleetProxies = 3
	fleetClients = 64
	fleetKeys    = 4 // 16 clients per key, spread over the proxies
)

// perKeyUpstream answers /llm?tokens=N with N as the usage and counts,
// per x-api-key, the requests it served and the tokens it reported.
type perKeyUpstream struct {
	mu             sync.Mutex
	served, tokens map[string]int
}

func (u *perKeyUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	n, _ := strconv.Atoi(r.URL.Query().Get("tokens"))
	k := r.Header.Get("x-api-key")
	u.mu.Lock()
	u.served[k]++
	u.tokens[k] += n
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"usage":{"total_tokens":`+strconv.Itoa(n)+`}}`)
}

// quotaFleet starts Redis, tokengate-rls with cfg and fleetProxies proxies
// with cfg in front of up.
func quotaFleet(t *testing.T, cfg string, up http.Handler) (*redistest.Server, []*wasmhost.Host, []*httptest.Server) {
	t.Helper()
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, cfg, redis.Addr)
	var hosts []*wasmhost.Host
	var proxies []*httptest.Server
	for range fleetProxies {
		h, srv := startSettleFleetHost(t, cfg, rlsBootstrap(rls.Addr), up)
		hosts = append(hosts, h)
		proxies = append(proxies, srv)
	}
	return redis, hosts, proxies
}

// fleetRun has fleetClients clients send perClient requests each (client
// i to proxy i%fleetProxies with key "k<i%fleetKeys>"), a body when body
// is not empty, and returns the 200s per key; a client stops at its first
// 429. Any other answer fails the test.
func fleetRun(t *testing.T, proxies []*httptest.Server, perClient int, path, body string) map[string]int {
	t.Helper()
	var mu sync.Mutex
	admitted := map[string]int{}
	var other atomic.Int64
	var wg sync.WaitGroup
	for i := range fleetClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "k" + strconv.Itoa(i%fleetKeys)
			srv := proxies[i%len(proxies)]
			c := clientFrom("127.0.0.1", 1)
			for range perClient {
				r, err := doBody(c, srv, path, map[string]string{"x-api-key": key}, body)
				switch {
				case err != nil:
					other.Add(1)
					t.Error(err)
					return
				case r.status == http.StatusOK:
					mu.Lock()
					admitted[key]++
					mu.Unlock()
				case r.status == http.StatusTooManyRequests:
					return
				default:
					other.Add(1)
					t.Errorf("key %s: status %d: %s", key, r.status, r.body)
					return
				}
			}
		}()
	}
	wg.Wait()
	if other.Load() != 0 {
		t.Fatalf("%d answers neither 200 nor 429 while Redis and the service are up", other.Load())
	}
	return admitted
}

// sameMonth reports whether the test's period did not change between
// start and now; if it did, the test says so and skips its checks.
func sameMonth(t *testing.T, start time.Time) bool {
	t.Helper()
	if now := time.Now().UTC(); now.Year() != start.Year() || now.Month() != start.Month() {
		t.Skipf("the month changed while the test ran (%v to %v): the consumption spans two periods", start, now)
		return false
	}
	return true
}

// TestQuotaFleetRequests: a quota of Q requests per key per month, 64
// clients over 3 proxies, 16 per key, each sending up to 12 (192 per key,
// more than Q): each key gets between Q - 1 and Q requests admitted,
// whichever proxies they reached, and Redis holds exactly what was
// admitted (refused requests are not counted).
func TestQuotaFleetRequests(t *testing.T) {
	const Q = 100
	start := time.Now().UTC()
	cfg := `{"rules":[{"name":"plan","scope":"cluster","algorithm":"quota","limit_keys":["header:x-api-key"],
	  "algorithm_config":{"limit":` + strconv.Itoa(Q) + `,"period":"month"}}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":5000,"on_error":"deny"}}}`
	up := &perKeyUpstream{served: map[string]int{}, tokens: map[string]int{}}
	redis, hosts, proxies := quotaFleet(t, cfg, up)
	admitted := fleetRun(t, proxies, 12, "/llm?tokens=0", "")
	if !sameMonth(t, start) {
		return
	}
	for k := range fleetKeys {
		key := "k" + strconv.Itoa(k)
		got := admitted[key]
		t.Logf("key %s: admitted %d of the quota %d", key, got, Q)
		if got > Q || got < Q-1 {
			t.Errorf("key %s: admitted %d, want %d or %d (the quota, minus at most one)", key, got, Q-1, Q)
		}
		if used := quotaUsed(t, redis, "plan", key); used != float64(got) {
			t.Errorf("key %s: Redis holds %v used, %d admitted", key, used, got)
		}
		if up.served[key] != got {
			t.Errorf("key %s: upstream served %d, clients saw %d admitted", key, up.served[key], got)
		}
	}
	var allowed uint64
	for _, h := range hosts {
		allowed += metric(t, h, "plan", "allowed")
	}
	if total := admitted["k0"] + admitted["k1"] + admitted["k2"] + admitted["k3"]; allowed != uint64(total) {
		t.Errorf("the proxies counted %d allowed, the clients %d", allowed, total)
	}
}

// TestQuotaFleetLLM: a quota of Q tokens per key per month charged the
// usage each response reports (u), with the body's max_tokens (e) as the
// estimate, 64 clients over 3 proxies, 16 per key. The usage the upstream
// reported for a key is at most Q + 16*max(0, u-e) (at most 16 of the
// key's requests in flight: docs/configuration.md's bound) and at least
// Q - e (u > e: no reservation settles lower than it took), and the period's consumption in Redis is exactly that usage once
// the settlements have arrived.
func TestQuotaFleetLLM(t *testing.T) {
	const Q, e, u = 1000, 10, 15
	start := time.Now().UTC()
	cfg := fmt.Sprintf(`{"rules":[{"name":"tokens","scope":"cluster","limit_keys":["header:x-api-key"],%s}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":5000,"on_error":"deny"}}}`, quotaRule(Q, ""))
	up := &perKeyUpstream{served: map[string]int{}, tokens: map[string]int{}}
	redis, hosts, proxies := quotaFleet(t, cfg, up)
	admitted := fleetRun(t, proxies, 8, "/llm?tokens="+strconv.Itoa(u), `{"max_tokens":`+strconv.Itoa(e)+`}`)
	if !sameMonth(t, start) {
		return
	}
	perKeyInFlight := fleetClients / fleetKeys
	bound := Q + perKeyInFlight*max(0, u-e)
	for k := range fleetKeys {
		key := "k" + strconv.Itoa(k)
		up.mu.Lock()
		billed, served := up.tokens[key], up.served[key]
		up.mu.Unlock()
		t.Logf("key %s: admitted %d, upstream reported %d tokens (quota %d, bound %d)", key, admitted[key], billed, Q, bound)
		if served != admitted[key] {
			t.Errorf("key %s: upstream served %d, clients saw %d admitted", key, served, admitted[key])
		}
		if billed > bound {
			t.Errorf("key %s: %d tokens reported, over Q + %d*max(0, u-e) = %d", key, billed, perKeyInFlight, bound)
		}
		if low := Q - e - (perKeyInFlight-1)*max(0, e-u); billed < low {
			t.Errorf("key %s: %d tokens reported with demand over the quota, want at least Q - e - %d*max(0, e-u) = %d", key, billed, perKeyInFlight-1, low)
		}
		waitQuotaUsed(t, redis, "tokens", key, float64(billed))
	}
	var charged uint64
	for _, h := range hosts {
		charged += metric(t, h, "tokens", "settle_charged")
	}
	if charged == 0 {
		t.Error("no settlement charged the usage above the estimate")
	}
}
