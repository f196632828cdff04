package rls_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// faultTimeout is the Redis timeout of the fault tests. Not production's
// tens of milliseconds: the healthy calls around each fault must not fail
// on a loaded machine, where a round trip can take longer than that. The
// faults themselves do not race it: a killed Redis refuses at once, and a
// frozen one answers nothing until the test thaws it, however long the
// timeout and the machine take.
const faultTimeout = time.Second

// call sends one request and returns the response or the error; the
// client's own deadline (10 s) is far beyond anything the service should
// take, so a hang shows as a failure, not as a slow pass.
func call(e env, domain string, ds ...*ratelimitv3.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
}

func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, faultTimeout)
	e := startServer(t, testConfig, store)
	if _, err := call(e, "tokengate", ours("keys", "a", 0)); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for i := range 5 {
		start := time.Now()
		_, err := call(e, "tokengate", ours("keys", "a", 0))
		took := time.Since(start)
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("request %d with Redis down: got %v, want UNAVAILABLE", i, err)
		}
		// Generous: the point is seconds (a client's defaults) versus a
		// bounded failure.
		if took > 2*time.Second {
			t.Fatalf("request %d with Redis down took %v", i, took)
		}
	}
	// Unmatched descriptors need no Redis.
	if r, err := call(e, "tokengate", ours("no-such-rule", "", 0)); err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("unmatched descriptor with Redis down: %v %v", r, err)
	}
	srv.Restart()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := call(e, "tokengate", ours("keys", "a", 0))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 10 s after Redis came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !containsLine(e.m.String(), `tokengate_rls_decisions_total{code="error",rule="keys"}`) {
		t.Errorf("failed decisions not counted:\n%s", e.m.String())
	}
	if !containsLine(e.m.String(), `tokengate_rls_requests_total{code="unavailable"}`) {
		t.Errorf("unavailable requests not counted:\n%s", e.m.String())
	}
}

// TestRedisSlow: while Redis is frozen (SIGSTOP: it accepts connections
// and answers nothing until the test thaws it, longer than any timeout),
// requests answer UNAVAILABLE: the timeout, not Redis, ended the wait.
func TestRedisSlow(t *testing.T) {
	srv := redistest.Start(t)
	store := newStore(t, []string{srv.Addr}, false, faultTimeout)
	e := startServer(t, testConfig, store)
	if _, err := call(e, "tokengate", ours("keys", "slow", 0)); err != nil {
		t.Fatal(err)
	}
	srv.Freeze() // returns once Redis is certainly stopped
	defer srv.Thaw()
	for i := range 2 {
		if _, err := call(e, "tokengate", ours("keys", "slow", 0)); status.Code(err) != codes.Unavailable {
			t.Fatalf("request %d with Redis frozen: got %v, want UNAVAILABLE", i, err)
		}
	}
}

// clusterMasterKilled: with one of three masters down, descriptors in
// its slots fail with UNAVAILABLE (refunding the live ones of the same
// request), the other masters' buckets keep working, and nothing is
// admitted over the limit.
// clusterMasterKilled runs as the last subtest of TestServer on the
// cluster backend (starting a cluster takes seconds).
func clusterMasterKilled(t *testing.T, c *redistest.Cluster) {
	store := newStore(t, c.Addrs(), true, faultTimeout)
	e := startServer(t, testConfig, store)
	var dead, live []string
	for i := 0; len(dead) < 5 || len(live) < 10; i++ {
		k := fmt.Sprintf("198.51.100.%d", i)
		if c.NodeFor(redisstore.BucketKey("keys", k)) == 0 {
			dead = append(dead, k)
		} else {
			live = append(live, k)
		}
	}
	c.Nodes[0].Kill()
	for _, k := range dead {
		if _, err := call(e, "tokengate", ours("keys", k, 0)); status.Code(err) != codes.Unavailable {
			t.Fatalf("key %s on the dead master: got %v, want UNAVAILABLE", k, err)
		}
	}
	// A request spanning a dead and a live master: UNAVAILABLE, and the
	// live bucket gets its token back.
	if _, err := call(e, "tokengate", ours("keys", live[0], 0), ours("keys", dead[0], 0)); status.Code(err) != codes.Unavailable {
		t.Fatalf("request across live and dead masters: got %v, want UNAVAILABLE", err)
	}
	for _, k := range live {
		admitted := 0
		for range 5 {
			r, err := call(e, "tokengate", ours("keys", k, 0))
			if err != nil {
				t.Fatalf("key %s on a live master: %v", k, err)
			}
			if r.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		if admitted != 3 {
			t.Errorf("key %s on a live master: admitted %d of 5, want burst 3", k, admitted)
		}
	}
	// The master comes back (empty: no persistence) and its slots decide
	// again without restarting the service.
	c.Nodes[0].Restart()
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := call(e, "tokengate", ours("keys", dead[1], 0))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slots of the restarted master still fail 15 s later: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func containsLine(text, prefix string) bool {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, prefix) && line != prefix+" 0" {
			return true
		}
	}
	return false
}
