package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// sprayRequests is the number of distinct client IPs TestSprayBoundedKeys
// sends: 200,000 by default, TOKENGATE_SPRAY (e.g. 1000000) to change it.
func sprayRequests(t *testing.T) int {
	n := 200_000
	if v := os.Getenv("TOKENGATE_SPRAY"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			t.Fatalf("TOKENGATE_SPRAY=%q: want a number >= 1000", v)
		}
	}
	if testing.Short() {
		n = min(n, 50_000)
	}
	return n
}

// serve runs one request from remoteAddr straight through the local
// host's proxy (no TCP) and returns the recorded response.
func serve(h *wasmhost.Host, remoteAddr string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = remoteAddr
	rec := httptest.NewRecorder()
	proxy.New(h, proxy.Options{}).ServeHTTP(rec, req)
	return rec
}

// TestSprayBoundedKeys (issue 6): 200,000 (TOKENGATE_SPRAY=1000000 for the
// full million) distinct client IPs, one request each, from 4 goroutines
// through 4 worker VMs, while the fake clock advances 100 µs per request
// (10,000 new identities per second), against a rule keyed by ip:address
// with the default key bound (65,536) at rps 10, burst 20:
//   - the rule never holds more than 65,536 keys;
//   - every sprayed identity is admitted (a new identity starts full);
//   - a hot client sending every tenth request is limited exactly: admitted
//     within [burst + rate·t − 1, burst + rate·t];
//   - 20 legitimate clients that emptied their buckets before the spray and
//     then went idle, most of whose slots were taken over meanwhile, each get
//     a full bucket (exactly 20 admitted) when they come back once every
//     bucket has had time to refill.
func TestSprayBoundedKeys(t *testing.T) {
	const (
		bound       = 65536
		rate, burst = 10.0, 20.0
		goroutines  = 4
		hotEvery    = 10
		tick        = 100 * time.Microsecond
		legit       = 20
	)
	n := sprayRequests(t)
	cfg := `{"rules":[{"name":"spray","limit_keys":["ip:address"],"algorithm_config":{"rps":10,"burst":20}}]}`
	clk := wasmhost.NewFakeClock(t0)
	ms := wasmhost.NewSharedData(false)
	h, _ := startHost(t, hostOpts(cfg, false, 4, clk, ms))
	const hot = "192.0.2.1"
	legitIP := func(i int) string { return fmt.Sprintf("198.51.100.%d", i+1) }

	// drainAt sends requests from ip at the current instant until a 429
	// and returns how many were admitted.
	drainAt := func(ip string) int {
		for k := 0; ; k++ {
			rec := serve(h, ip+":4242")
			switch {
			case rec.Code == http.StatusTooManyRequests:
				return k
			case rec.Code != http.StatusOK || rec.Header().Get("RateLimit-Remaining") == "":
				t.Fatalf("%s: got %d %v", ip, rec.Code, rec.Header())
			case k > int(burst):
				t.Fatalf("%s: more than the burst admitted at one instant", ip)
			}
		}
	}
	// Before the spray: the hot client and the legitimate ones empty their
	// buckets.
	hotAdmitted := drainAt(hot)
	for i := range legit {
		if got := drainAt(legitIP(i)); got != int(burst) {
			t.Fatalf("%s: admitted %d at t0, want %v", legitIP(i), got, burst)
		}
	}
	legitKeys := make([]string, legit)
	for i := range legit {
		b, ok := findBucket(t, ms, "spray", legitIP(i))
		if !ok {
			t.Fatalf("no bucket for %s", legitIP(i))
		}
		legitKeys[i] = b.key
	}

	start := time.Now()
	var (
		next, hotOK, sprayBad, maxKeys atomic.Int64
		wg                             sync.WaitGroup
		badMu                          sync.Mutex
		firstBad                       string
	)
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if i%hotEvery == 0 {
					rec := serve(h, hot+":4242")
					if rec.Code == http.StatusOK {
						hotOK.Add(1)
					}
					continue
				}
				// 10.0.0.0/8 holds 16.7 million distinct addresses.
				ip := fmt.Sprintf("10.%d.%d.%d:%d", i>>16&255, i>>8&255, i&255, 1024+i%50000)
				rec := serve(h, ip)
				if rec.Code != http.StatusOK || rec.Header().Get("RateLimit-Remaining") == "" {
					if sprayBad.Add(1) == 1 {
						badMu.Lock()
						firstBad = fmt.Sprintf("%s: %d %v %q", ip, rec.Code, rec.Header(), rec.Body.String())
						badMu.Unlock()
					}
				}
				clk.Advance(tick)
				if i%50_000 == 0 {
					k := int64(ms.Len())
					for {
						m := maxKeys.Load()
						if k <= m || maxKeys.CompareAndSwap(m, k) {
							break
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	elapsed := clk.Now().Sub(t0)

	hotAdmitted += int(hotOK.Load()) + drainAt(hot)
	checkBounds(t, "hot client", hotAdmitted, burst, rate, elapsed)
	if got := sprayBad.Load(); got > 0 {
		t.Errorf("%d sprayed identities were not admitted with RateLimit headers; first: %s", got, firstBad)
	}
	keys := bucketKeys(ms, "spray")
	if len(keys) > bound || maxKeys.Load() > bound+1 {
		t.Errorf("the rule holds %d keys (store peak %d), want at most %d", len(keys), maxKeys.Load(), bound)
	}

	// Every bucket refills within 2 s; then the legitimate clients return.
	clk.Advance(2 * time.Second)
	takenOver := 0
	for i := range legit {
		if b, ok := findBucket(t, ms, "spray", legitIP(i)); !ok || b.key != legitKeys[i] {
			takenOver++
		}
		rec := serve(h, legitIP(i)+":4242")
		if rec.Code != http.StatusOK || rec.Header().Get("RateLimit-Remaining") != "19" {
			t.Errorf("%s returning: got %d remaining %q, want 200 and 19 (a full bucket)", legitIP(i), rec.Code, rec.Header().Get("RateLimit-Remaining"))
		}
		if got := 1 + drainAt(legitIP(i)); got != int(burst) {
			t.Errorf("%s returning: admitted %d, want the full burst %v", legitIP(i), got, burst)
		}
	}
	if takenOver == 0 {
		t.Errorf("none of the %d legitimate clients' slots was taken over during the spray; the test proves nothing", legit)
	}
	if got := metric(t, h, "spray", "fail_open"); got != 0 {
		t.Errorf("fail_open: got %d, want 0", got)
	}
	t.Logf("%d requests through ServeHTTP in %v (%.0f req/s), %v of fake time: %d keys for the rule (bound %d); "+
		"hot client admitted %d for bound %.1f; %d of %d idle clients' slots taken over; slot_takeovers %d, slot_collisions %d, cas_retries %d",
		n, d.Round(time.Millisecond), float64(n)/d.Seconds(), elapsed, len(keys), bound, hotAdmitted, burst+rate*elapsed.Seconds(),
		takenOver, legit, metric(t, h, "spray", "slot_takeovers"), metric(t, h, "spray", "slot_collisions"), metric(t, h, "spray", "cas_retries"))
}
