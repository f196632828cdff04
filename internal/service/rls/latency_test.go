package rls_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// latencyTimeout is the store timeout of the latency-bound tests:
// production's default, since the bound is about it.
const latencyTimeout = 25 * time.Millisecond

// structuralSlack is how far past its own deadline a call may return in
// TestLatencyBound, beyond the scheduler's own lateness measured at the same
// time (schedLag). Not the 5 ms the service promises: the defect it pins is
// structural (calls waited for rueidis to give up the connection, a second
// and more, whatever their deadline), and on a loaded two-core machine any
// goroutine, in the store or not, can wait hundreds of milliseconds for a
// CPU (a no-fault call 986 ms past its budget, 0 s of it in the store:
// docs/failures.md). The fault script measures the real distribution.
const structuralSlack = 500 * time.Millisecond

// schedLag measures, until stop closes, how late a goroutine of this
// process wakes from a 1 ms sleep, and returns the worst: what the machine,
// not the store, adds to any call at that time.
func schedLag(stop <-chan struct{}) time.Duration {
	var worst time.Duration
	for {
		select {
		case <-stop:
			return worst
		default:
		}
		t0 := time.Now()
		time.Sleep(time.Millisecond)
		worst = max(worst, time.Since(t0)-time.Millisecond)
	}
}

// loadResult is what a load saw: every call's overrun of its own
// deadline, and how many calls failed.
type loadResult struct {
	overruns []time.Duration
	calls    int
	failed   int
	// late are the starts of the calls that returned more than 5 ms past
	// their deadline, for the log: when, relative to the fault, they
	// began.
	late []time.Time
}

// load runs workers goroutines calling store.Run until stop closes; each
// call has a deadline of its own (none, 5 ms, 15 ms, in turn: without
// one the store's timeout bounds it), and its overrun is measured against
// the earlier of its deadline and the store's timeout.
func load(store *redisstore.Store, workers int, stop <-chan struct{}) loadResult {
	var mu sync.Mutex
	var res loadResult
	var wg sync.WaitGroup
	budgets := []time.Duration{0, 5 * time.Millisecond, 15 * time.Millisecond}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				budget := budgets[(w+n)%len(budgets)]
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				start := time.Now()
				dl := start.Add(latencyTimeout + time.Millisecond) // the store's bound
				if budget > 0 {
					ctx, cancel = context.WithTimeout(ctx, budget)
					dl = start.Add(budget)
				}
				out := store.Run(ctx, []redisstore.Op{{Key: redisstore.BucketKey("lat", fmt.Sprint(w)), Rate: 1e6, Burst: 1e6, Cost: 1}})
				end := time.Now()
				cancel()
				mu.Lock()
				res.calls++
				if out[0].Err != nil {
					res.failed++
				}
				res.overruns = append(res.overruns, end.Sub(dl))
				if end.Sub(dl) > 5*time.Millisecond {
					res.late = append(res.late, start)
				}
				mu.Unlock()
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	return res
}

// TestLatencyBound: under every Redis fault (frozen with SIGSTOP, killed,
// busy in DEBUG SLEEP, behind a connection that stops forwarding), every
// call returns by its own deadline, give or take scheduling: none waits
// for the connection to be given up. Before the store bounded what a
// connection holds (internal/service/redisstore/guard.go), a frozen Redis under a few thousand calls
// a second filled rueidis's queue within a second, and calls then waited
// about a second past their deadline (issue 23, defect 1). Redis comes
// back and calls succeed again within a bounded time.
func TestLatencyBound(t *testing.T) {
	type fault struct {
		name       string
		cluster    bool
		start, end func(t *testing.T, srv *redistest.Server)
	}
	faults := []fault{
		{"sigstop", false, func(t *testing.T, s *redistest.Server) { s.Freeze() }, func(t *testing.T, s *redistest.Server) { s.Thaw() }},
		{"kill", false, func(t *testing.T, s *redistest.Server) { s.Kill() }, func(t *testing.T, s *redistest.Server) { s.Restart() }},
		{"debug-sleep", false, func(t *testing.T, s *redistest.Server) {
			go func() { _, _ = s.Do("DEBUG", "SLEEP", "1.5") }()
		}, func(t *testing.T, s *redistest.Server) {}},
		{"stalled-proxy", false, nil, nil},
		{"cluster-sigstop", true, func(t *testing.T, s *redistest.Server) { s.Freeze() }, func(t *testing.T, s *redistest.Server) { s.Thaw() }},
		{"cluster-kill", true, func(t *testing.T, s *redistest.Server) { s.Kill() }, func(t *testing.T, s *redistest.Server) { s.Restart() }},
		// Shorter than cluster-node-timeout (3 s): the other nodes do not
		// mark the sleeping master failed.
		{"cluster-debug-sleep", true, func(t *testing.T, s *redistest.Server) {
			go func() { _, _ = s.Do("DEBUG", "SLEEP", "1.5") }()
		}, func(t *testing.T, s *redistest.Server) {}},
	}
	var cluster *redistest.Cluster
	parent := t
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			var store *redisstore.Store
			var srv *redistest.Server
			start, end := f.start, f.end
			if f.cluster {
				if cluster == nil {
					cluster = redistest.StartCluster(parent, 3)
				}
				store = newStore(t, cluster.Addrs(), true, latencyTimeout)
				srv = cluster.Nodes[0]
			} else {
				srv = redistest.Start(t)
				addr := srv.Addr
				if start == nil {
					p := redistest.StartProxy(t, srv.Addr)
					addr = p.Addr
					start = func(*testing.T, *redistest.Server) { p.Stall() }
					end = func(*testing.T, *redistest.Server) { p.Resume() }
				}
				store = newStore(t, []string{addr}, false, latencyTimeout)
			}
			stop := make(chan struct{})
			done := make(chan loadResult)
			lag := make(chan time.Duration)
			go func() { done <- load(store, 64, stop) }()
			go func() { lag <- schedLag(stop) }()
			time.Sleep(100 * time.Millisecond)
			faultAt := time.Now()
			start(t, srv)
			time.Sleep(1500 * time.Millisecond)
			end(t, srv)
			close(stop)
			res, worstLag := <-done, <-lag
			slices.Sort(res.overruns)
			worst := res.overruns[len(res.overruns)-1]
			// When the late calls began, from the fault's start: all in
			// its first moments would point at a wait of the fault's own
			// (a reconnection, a refresh); spread over it, at the
			// machine's scheduling.
			first50 := 0
			for _, st := range res.late {
				if d := st.Sub(faultAt); d >= 0 && d < 50*time.Millisecond {
					first50++
				}
			}
			t.Logf("%d calls, %d failed; past deadline: p50 %v, p99 %v, max %v; %d past it by > 5 ms (%d begun in the fault's first 50 ms); worst scheduler lag %v",
				res.calls, res.failed, res.overruns[len(res.overruns)/2], res.overruns[len(res.overruns)*99/100], worst, len(res.late), first50, worstLag)
			if res.failed == 0 {
				t.Errorf("no call failed: the fault did not reach the store")
			}
			// Twice the lag: the control is one goroutine's wake-ups, the
			// calls are 64 goroutines' and the store's own.
			if bound := structuralSlack + 2*worstLag; worst > bound {
				t.Errorf("a call returned %v past its deadline, want < %v (%v + twice the scheduler's worst lag, %v)",
					worst, bound, structuralSlack, worstLag)
			}
			waitRecovery(t, store)
		})
	}
}

// waitRecovery waits (10 s at most) until a call succeeds again.
func waitRecovery(t *testing.T, store *redisstore.Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out := store.Run(context.Background(), []redisstore.Op{{Key: redisstore.BucketKey("lat", "recover"), Rate: 1, Burst: 1e6, Cost: 1}})
		if out[0].Err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 10 s after the fault ended: %v", out[0].Err)
		}
		if errors.Is(out[0].Err, redisstore.ErrNotConnected) {
			t.Fatal(out[0].Err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
