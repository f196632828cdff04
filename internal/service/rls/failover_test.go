package rls_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// hotLoad is clients calling the hot rule (20/s, burst 40) in a loop,
// each call with the filter's default 60 ms deadline, until stop: the
// traffic a fault test runs through the service.
type hotLoad struct {
	admitted, decided, failed atomic.Int64
	lastDecided               atomic.Int64 // Unix nanoseconds
	start                     time.Time
	stop                      chan struct{}
	wg                        sync.WaitGroup
}

func startHotLoad(e env, clients int) *hotLoad {
	l := &hotLoad{start: time.Now(), stop: make(chan struct{})}
	for range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Millisecond)
				r, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("hot", "", 0)}})
				cancel()
				switch {
				case err != nil:
					l.failed.Add(1)
				case r.OverallCode == rlsv3.RateLimitResponse_OK:
					l.admitted.Add(1)
					fallthrough
				default:
					l.decided.Add(1)
					l.lastDecided.Store(time.Now().UnixNano())
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return l
}

// end stops the load and returns the hot bucket's bound over its run:
// burst + rate × elapsed.
func (l *hotLoad) end() float64 {
	close(l.stop)
	l.wg.Wait()
	return 40 + 20*time.Since(l.start).Seconds()
}

// waitDecided waits (bounded by d) until a call that started after from
// has been decided, and reports whether one was.
func (l *hotLoad) waitDecided(from time.Time, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if l.lastDecided.Load() > from.Add(60*time.Millisecond).UnixNano() {
			return true
		}
	}
	return false
}

// newSentinelStore is newStore through the Sentinel at addr for the
// master set name.
func newSentinelStore(t testing.TB, addr, name string, timeout time.Duration) *redisstore.Store {
	t.Helper()
	store, err := redisstore.New(redisstore.Options{Addrs: []string{addr}, Timeout: timeout, SentinelMaster: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	for deadline := time.Now().Add(10 * time.Second); store.Ping(context.Background()) != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no PING answer through the Sentinel at %s within 10 s: %v", addr, store.Ping(context.Background()))
		}
	}
	return store
}

// TestSentinelFailover: the master Sentinel names is killed under load;
// Sentinel promotes its replica, and the service follows it (rueidis
// watches the Sentinel's +switch-master) and decides again without a
// restart. In exact mode nothing is over-admitted across the failover:
// the hot bucket admits at most burst + rate × elapsed, and a bucket
// emptied before the kill (and replicated) is still empty on the promoted
// replica.
//
// Replication is asynchronous: a write the master acknowledged just before
// it died can be missing on the replica, and its tokens are then spent
// again (docs/rls.md#failure-behaviour). The emptied bucket waits for the
// replica to catch up before the kill, so that it checks that the service
// decides on the promoted replica's state, not that race. The hot bucket
// cannot wait so (its load goes on to the kill); its bound does not depend
// on the race as long as the failover (Sentinel's down-after-milliseconds,
// 1 s here, a random delay of up to 1 s, then the promotion: 2.2–2.7 s
// measured) outlasts the 2 s the bucket takes to refill from empty: a
// refill stops at burst, so a lost write leaves the bucket as it finds it.
func TestSentinelFailover(t *testing.T) {
	const set = "tokengate"
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	sentinel := redistest.StartSentinel(t, set, master)
	sentinel.WaitSentinelReplicas(set, 1)
	store := newSentinelStore(t, sentinel.Addr, set, faultTimeout)
	e := startServer(t, testConfig, store)

	// A bucket of burst 3 (and no refill to speak of), emptied.
	for i := range 4 {
		r, err := call(e, "tokengate", ours("keys", "failover", 0))
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 3; (r.OverallCode == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("before the failover, call %d: %v, want admitted %v", i, r.OverallCode, want)
		}
	}
	replica.WaitCaughtUp(master)

	load := startHotLoad(e, 8)
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	master.Kill()
	sentinel.WaitSentinelMaster(set, replica)
	promoted := time.Now()
	if !load.waitDecided(promoted, 15*time.Second) {
		bound := load.end()
		t.Fatalf("no decision 15 s after Sentinel promoted the replica (%d failed calls; bound %.0f)", load.failed.Load(), bound)
	}
	followed := time.Now()
	time.Sleep(500 * time.Millisecond)
	bound := load.end()
	t.Logf("promoted %v after the kill, decisions again %v after that; %d decided, %d failed, %d admitted (bound %.1f)",
		promoted.Sub(killed).Round(time.Millisecond), followed.Sub(promoted).Round(time.Millisecond),
		load.decided.Load(), load.failed.Load(), load.admitted.Load(), bound)
	if got := float64(load.admitted.Load()); got > bound {
		t.Errorf("hot bucket across the failover: admitted %v > burst + rate × elapsed = %.1f", got, bound)
	}
	if load.failed.Load() == 0 {
		t.Errorf("no call failed: the kill did not reach the service")
	}
	if r, err := call(e, "tokengate", ours("keys", "failover", 0)); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("bucket emptied before the failover, after it: %v %v, want OVER_LIMIT", r.GetOverallCode(), err)
	}
	if got := replica.MustDo("EXISTS", redisstore.BucketKey("hot", "")); got != int64(1) {
		t.Errorf("hot bucket on the promoted replica: EXISTS %v, want 1", got)
	}
	if role := replica.Role(); role != "master" {
		t.Errorf("promoted replica's ROLE: %q, want master", role)
	}
}
