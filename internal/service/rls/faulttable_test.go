package rls_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// TestFaultTable measures what gRPC clients of the service see under each
// Redis fault, standalone and Cluster, and prints it as the table of
// docs/failures.md. It runs only with TOKENGATE_FAULT_TABLE=1
// (tools/faults.sh): it measures, it asserts nothing a loaded machine
// could change. TestLatencyBound is the test of the same faults.
//
// Each row: 16 clients call for 1 s before the fault, 2 s during it and
// 2 s after, each call with Envoy's 60 ms deadline (the filter's default
// timeout_ms) on one hot bucket (20/s, burst 40), at the service's
// default -redis-timeout.
func TestFaultTable(t *testing.T) {
	if os.Getenv("TOKENGATE_FAULT_TABLE") == "" {
		t.Skip("measurement: run tools/faults.sh (TOKENGATE_FAULT_TABLE=1)")
	}
	const (
		clients  = 16
		deadline = 60 * time.Millisecond
		timeout  = 25 * time.Millisecond
	)
	hot := redisstore.BucketKey("hot", "")
	// target is what a fault acts on: the Redis node of the hot bucket,
	// the proxy in front of a standalone one, and the switch of a store
	// that stops answering.
	type target struct {
		srv   *redistest.Server
		proxy *redistest.Proxy
		stall *atomic.Bool
	}
	type fault struct {
		name  string
		redis string // standalone, cluster, sentinel, or stalled (no Redis fault: the store waits)
		// start and stop inject the fault and end it; stop nil: the fault
		// ends as it starts (a failover), and recovery is timed from it.
		start, stop func(*target)
	}
	none := func(*target) {}
	freeze := func(t *target) { t.srv.Freeze() }
	thaw := func(t *target) { t.srv.Thaw() }
	kill := func(t *target) { t.srv.Kill() }
	restart := func(t *target) { t.srv.Restart() }
	sleep := func(t *target) { go func() { _, _ = t.srv.Do("DEBUG", "SLEEP", "2") }() }
	faults := []fault{
		{"none", "standalone", none, none},
		{"SIGSTOP", "standalone", freeze, thaw},
		{"kill, restart", "standalone", kill, restart},
		{"DEBUG SLEEP 2", "standalone", sleep, none},
		{"proxy stops forwarding", "standalone", func(t *target) { t.proxy.Stall() }, func(t *target) { t.proxy.Resume() }},
		{"no fault: every call waits out its budget", "stalled", func(t *target) { t.stall.Store(true) }, func(t *target) { t.stall.Store(false) }},
		{"none", "cluster", none, none},
		{"SIGSTOP the hot key's master", "cluster", freeze, thaw},
		{"kill, restart the hot key's master", "cluster", kill, restart},
		{"DEBUG SLEEP 2 on the hot key's master", "cluster", sleep, none},
		{"none", "sentinel", none, none},
		{"kill the master: Sentinel promotes the replica", "sentinel", kill, nil},
	}
	var cluster *redistest.Cluster
	rows := []string{
		"| Redis | Fault (2 s) | Calls | OK / OVER_LIMIT / UNAVAILABLE / DEADLINE_EXCEEDED | p50 | p99 | max | Over 65 ms | Past budget: > 1 ms, max (its time in the store) | Admitted (bound) | Recovered after |",
		"|---|---|---|---|---|---|---|---|---|---|---|",
	}
	for _, f := range faults {
		var store *redisstore.Store
		var srv *redistest.Server
		var proxy *redistest.Proxy
		stall := new(atomic.Bool)
		switch f.redis {
		case "cluster":
			if cluster == nil {
				cluster = redistest.StartCluster(t, 3)
			}
			srv = cluster.Nodes[cluster.NodeFor(hot)]
			store = newStore(t, cluster.Addrs(), true, timeout)
		case "sentinel":
			srv = redistest.Start(t)
			replica := redistest.StartReplica(t, srv)
			sentinel := redistest.StartSentinel(t, "tokengate", srv)
			sentinel.WaitSentinelReplicas("tokengate", 1)
			store = newSentinelStore(t, sentinel.Addr, "tokengate", timeout)
			_ = replica // promoted by the failover row
		case "stalled":
			srv = redistest.Start(t)
			store = newStore(t, []string{srv.Addr}, false, timeout)
		default:
			srv = redistest.Start(t)
			proxy = redistest.StartProxy(t, srv.Addr)
			store = newStore(t, []string{proxy.Addr}, false, timeout)
		}
		tm := &timedRunner{r: &stallingRunner{r: store, stall: stall}}
		e := startServer(t, testConfig, tm)
		tg := &target{srv: srv, proxy: proxy, stall: stall}
		var mu sync.Mutex
		var lat []time.Duration
		byCode := map[codes.Code]int{}
		over, admitted := 0, 0
		var faultEnd, recovered time.Time
		stop := make(chan struct{})
		var wg sync.WaitGroup
		begin := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					t0 := time.Now()
					r, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("hot", "", 0)}})
					d := time.Since(t0)
					cancel()
					mu.Lock()
					lat = append(lat, d)
					code := status.Code(err)
					if err == nil && r.OverallCode == rlsv3.RateLimitResponse_OK {
						admitted++
					}
					if err == nil && r.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
						code = codes.ResourceExhausted // counted as OVER_LIMIT
					}
					byCode[code]++
					if d > deadline+5*time.Millisecond {
						over++
					}
					if err == nil && !faultEnd.IsZero() && recovered.IsZero() && t0.After(faultEnd) { // any decision
						recovered = time.Now()
					}
					mu.Unlock()
					time.Sleep(2 * time.Millisecond)
				}
			}()
		}
		time.Sleep(time.Second)
		f.start(tg)
		if f.stop == nil {
			mu.Lock()
			faultEnd = time.Now()
			mu.Unlock()
		}
		time.Sleep(2 * time.Second)
		if f.stop != nil {
			f.stop(tg)
			mu.Lock()
			faultEnd = time.Now()
			mu.Unlock()
		}
		time.Sleep(2 * time.Second)
		close(stop)
		wg.Wait()
		elapsed := time.Since(begin).Seconds()
		slices.Sort(lat)
		q := func(p float64) string { return lat[int(p*float64(len(lat)-1))].Round(100 * time.Microsecond).String() }
		rec := "—"
		if !recovered.IsZero() {
			rec = recovered.Sub(faultEnd).Round(time.Millisecond).String()
		}
		redis := map[string]string{"standalone": "standalone", "stalled": "standalone", "cluster": "Cluster (3 masters)", "sentinel": "Sentinel (master, replica)"}[f.redis]
		late, worst, worstIn := tm.past()
		worst = max(worst, 0)
		rows = append(rows, fmt.Sprintf("| %s | %s | %d | %d / %d / %d / %d | %s | %s | %s | %d | %d, %s (%s) | %d (%.0f) | %s |",
			redis, f.name, len(lat), byCode[codes.OK], byCode[codes.ResourceExhausted], byCode[codes.Unavailable], byCode[codes.DeadlineExceeded],
			q(0.5), q(0.99), q(1), over, late, worst.Round(100*time.Microsecond), worstIn.Round(100*time.Microsecond), admitted, 40+20*elapsed, rec))
		store.Close()
	}
	t.Log("\n" + strings.Join(rows, "\n"))
}

// stallingRunner is r, except while stall is set: then each call answers
// nothing until 2 ms before its caller's deadline and fails, as the store
// does for a node that does not answer (Store.clientBudget), with no
// Redis, rueidis or guard in the way. Beside the real faults it shows
// what the same wait costs with no fault: the machine's scheduling.
type stallingRunner struct {
	r     rls.Runner
	stall *atomic.Bool
}

func (s *stallingRunner) Run(ctx context.Context, ops []redisstore.Op) []redisstore.Outcome {
	if !s.stall.Load() {
		return s.r.Run(ctx, ops)
	}
	out := make([]redisstore.Outcome, len(ops))
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(25 * time.Millisecond)
	}
	t := time.NewTimer(time.Until(dl.Add(-2 * time.Millisecond)))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	for i := range out {
		out[i].Err = context.DeadlineExceeded
	}
	return out
}

// timedRunner is r, and measures how long after its budget each call
// returns to the service: the budget of the table's calls (one
// descriptor, a 60 ms deadline) ends 2 ms before the deadline the
// service received (Store.clientBudget). Of the latest call it keeps the
// time spent in the store (rueidis, the guard, and scheduling while
// there): a call late by more than that reached the store late, after
// gRPC read its request.
type timedRunner struct {
	r       rls.Runner
	mu      sync.Mutex
	late    int           // calls that returned more than 1 ms past their budget
	worst   time.Duration // the most past it
	worstIn time.Duration // the time that call spent in the store
}

func (t *timedRunner) Run(ctx context.Context, ops []redisstore.Op) []redisstore.Outcome {
	start := time.Now()
	out := t.r.Run(ctx, ops)
	if dl, ok := ctx.Deadline(); ok {
		end := time.Now()
		past := end.Sub(dl.Add(-2 * time.Millisecond))
		t.mu.Lock()
		if past > time.Millisecond {
			t.late++
		}
		if past > t.worst {
			t.worst, t.worstIn = past, end.Sub(start)
		}
		t.mu.Unlock()
	}
	return out
}

func (t *timedRunner) past() (late int, worst, worstIn time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.late, t.worst, t.worstIn
}
