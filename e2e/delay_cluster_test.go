package e2e

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/envoyconf"
	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
	"github.com/tokengate/tokengate/sharedstate"
)

// TestDelayWithCluster: a local rule that holds requests (10/s, burst 1,
// max_reserved 5) and a cluster rule decided by tokengate-rls on Redis
// (burst 2, next to no refill), through the built module on a fake clock.
// The request the local rule would hold is asked of the service first and
// held only once the service admitted it, until its deadline (never
// before); the next, which the service rejects, gets the cluster rule's
// 429 and its local reservation back.
func TestDelayWithCluster(t *testing.T) {
	cfg := `{"rules":[
	  {"name":"g","algorithm_config":{"rps":10,"burst":1,"max_reserved":5}},
	  {"name":"c","scope":"cluster","algorithm_config":{"rps":0.001,"burst":2}}],
	  "settings":{"rls":{"cluster":"ratelimit","timeout_ms":2000,"on_error":"deny"}}}`
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, cfg, redis.Addr)
	cls, err := envoyconf.Clusters([]byte(rlsBootstrap(rls.Addr)))
	if err != nil {
		t.Fatal(err)
	}
	r := newDelayRig(t, cfg, 1, func(o *wasmhost.Options, _ *proxy.Options) {
		o.Clusters = map[string]wasmhost.Cluster{}
		for name, c := range cls {
			o.Clusters[name] = wasmhost.Cluster{Address: c.Address, HTTP2: c.HTTP2}
		}
	})
	metric := func(rule, counter string) uint64 {
		v, _ := r.h.Metric("tokengate.rule." + rule + "." + counter)
		return v
	}
	local := func() string {
		v, _, _ := r.h.Store().Get(string(sharedstate.AppendKey(nil, false, "g", nil)))
		return string(v)
	}

	// 1: on at once. 2: 100 ms of debt: asked of the service, then held.
	r.sendInOrder(2)
	if got := metric("c", "allowed"); got != 2 {
		t.Fatalf("the service admitted %d requests, want 2: the held request must be asked first", got)
	}
	if got := metric("g", "delayed"); got != 1 {
		t.Fatalf("delayed = %d, want request 2 held", got)
	}
	// 3: 200 ms of debt, but the service has nothing left: 429 from the
	// cluster rule, and the local bucket as it was before it.
	before := local()
	r.send(context.Background(), 3, nil)
	r.decided(3)
	_, res := r.snapshot()
	if res[3].status != http.StatusTooManyRequests || res[3].rule != "c" {
		t.Fatalf("request 3: %+v, want the cluster rule's 429", res[3])
	}
	if after := local(); after != before {
		t.Errorf("local bucket %q after the rejection, want %q: its reservation given back", after, before)
	}
	if got := metric("g", "delayed"); got != 1 {
		t.Errorf("delayed = %d, want 1: a rejected request is not held", got)
	}
	// The held request reaches the upstream at +100 ms, never before.
	r.run(200*time.Millisecond, func(el time.Duration) int {
		if el < 100*time.Millisecond {
			return 1
		}
		return 2
	})
	arrivals, res := r.snapshot()
	if len(arrivals) != 2 || arrivals[1].id != 2 || arrivals[1].at < 100*time.Millisecond {
		t.Fatalf("arrivals %+v, want request 2 at +100 ms or later", arrivals)
	}
	r.until("request 2's answer", func() bool { _, res = r.snapshot(); return res[2].status != 0 })
	if res[1].status != http.StatusOK || res[2].status != http.StatusOK {
		t.Errorf("results %+v, want 1 and 2 admitted", res)
	}
	if n := r.h.StrayContinues(); n != 0 {
		t.Errorf("%d continues of a stream gone or already continued", n)
	}
	// The service answered the three requests (tokengate-rls's own count).
	_, body := getURL(t, "http://"+rls.Admin+"/metrics", nil)
	n := 0.0
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "tokengate_rls_requests_total{") {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			n += v
		}
	}
	if n != 3 {
		t.Errorf("tokengate-rls answered %v requests, want 3", n)
	}
}
