package rls_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/redistest"
	"github.com/tokengate/tokengate/internal/rls"
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
	hot := rls.BucketKey("hot", "")
	type fault struct {
		name  string
		redis string // standalone, cluster or sentinel
		// start and stop inject the fault and end it; stop nil: the fault
		// ends as it starts (a failover), and recovery is timed from it.
		start, stop func(s *redistest.Server, p *redistest.Proxy)
	}
	none := func(*redistest.Server, *redistest.Proxy) {}
	freeze := func(s *redistest.Server, _ *redistest.Proxy) { s.Freeze() }
	thaw := func(s *redistest.Server, _ *redistest.Proxy) { s.Thaw() }
	kill := func(s *redistest.Server, _ *redistest.Proxy) { s.Kill() }
	restart := func(s *redistest.Server, _ *redistest.Proxy) { s.Restart() }
	sleep := func(s *redistest.Server, _ *redistest.Proxy) { go func() { _, _ = s.Do("DEBUG", "SLEEP", "2") }() }
	faults := []fault{
		{"none", "standalone", none, none},
		{"SIGSTOP", "standalone", freeze, thaw},
		{"kill, restart", "standalone", kill, restart},
		{"DEBUG SLEEP 2", "standalone", sleep, none},
		{"proxy stops forwarding", "standalone", func(_ *redistest.Server, p *redistest.Proxy) { p.Stall() }, func(_ *redistest.Server, p *redistest.Proxy) { p.Resume() }},
		{"none", "cluster", none, none},
		{"SIGSTOP the hot key's master", "cluster", freeze, thaw},
		{"kill, restart the hot key's master", "cluster", kill, restart},
		{"DEBUG SLEEP 2 on the hot key's master", "cluster", sleep, none},
		{"none", "sentinel", none, none},
		{"kill the master: Sentinel promotes the replica", "sentinel", kill, nil},
	}
	var cluster *redistest.Cluster
	rows := []string{
		"| Redis | Fault (2 s) | Calls | OK / OVER_LIMIT / UNAVAILABLE / DEADLINE_EXCEEDED | p50 | p99 | max | Over 65 ms | Admitted (bound) | Recovered after |",
		"|---|---|---|---|---|---|---|---|---|---|",
	}
	for _, f := range faults {
		var store *rls.Store
		var srv *redistest.Server
		var proxy *redistest.Proxy
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
		default:
			srv = redistest.Start(t)
			proxy = redistest.StartProxy(t, srv.Addr)
			store = newStore(t, []string{proxy.Addr}, false, timeout)
		}
		e := startServer(t, testConfig, store)
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
		f.start(srv, proxy)
		if f.stop == nil {
			mu.Lock()
			faultEnd = time.Now()
			mu.Unlock()
		}
		time.Sleep(2 * time.Second)
		if f.stop != nil {
			f.stop(srv, proxy)
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
		redis := map[string]string{"standalone": "standalone", "cluster": "Cluster (3 masters)", "sentinel": "Sentinel (master, replica)"}[f.redis]
		rows = append(rows, fmt.Sprintf("| %s | %s | %d | %d / %d / %d / %d | %s | %s | %s | %d | %d (%.0f) | %s |",
			redis, f.name, len(lat), byCode[codes.OK], byCode[codes.ResourceExhausted], byCode[codes.Unavailable], byCode[codes.DeadlineExceeded],
			q(0.5), q(0.99), q(1), over, admitted, 40+20*elapsed, rec))
		store.Close()
	}
	t.Log("\n" + strings.Join(rows, "\n"))
}
