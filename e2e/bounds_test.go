package e2e

// Issue 30's size attacks against the built tokengate-rls on a real
// redis-server: each caller's work and memory are bounded
// (docs/rls.md#limits, docs/dropin.md#limits). Memory is read from the
// child's /proc/<pid>/status (VmHWM: the peak resident set) and, for the
// live heap, from its /metrics after /debug/pprof/heap?gc=1 has run a
// collection. Nothing here depends on the machine's speed: the attacks are
// a fixed number of calls, the steady client runs until they are all
// answered, and every bound is on bytes or counts.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// memLimitMiB is the chart's memory limit (deploy/helm values
// resources.limits.memory), which the chart also gives as GOMEMLIMIT.
const memLimitMiB = 256

// procStatusKB returns a field of /proc/<pid>/status (VmHWM, VmRSS) in KiB.
func procStatusKB(t testing.TB, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("reading the service's memory: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", field, line)
			}
			return n
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, field)
	return 0
}

// liveHeapMiB runs a collection in the service (its pprof heap profile
// with gc=1, on the listener base) and returns its live heap
// (go_memstats_heap_alloc_bytes of base's /metrics) in MiB.
func liveHeapMiB(t testing.TB, base string) float64 {
	t.Helper()
	get := func(path string) string {
		resp, err := http.Get("http://" + base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", path, resp.StatusCode)
		}
		return string(b)
	}
	get("/debug/pprof/heap?gc=1")
	for _, line := range strings.Split(get("/metrics"), "\n") {
		if rest, ok := strings.CutPrefix(line, "go_memstats_heap_alloc_bytes "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v / (1 << 20)
		}
	}
	t.Fatal("no go_memstats_heap_alloc_bytes in /metrics")
	return 0
}

// boundsConfig has one cluster rule every descriptor of these tests names.
const boundsConfig = `{"rules":[{"name":"s","scope":"cluster","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":100000,"burst":1000000}}],
  "settings":{"rls":{"cluster":"ratelimit"}}}`

func boundsDesc(key string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "tokengate_rule", Value: "s"}, {Key: "key", Value: key}}}
}

// TestBoundsLargeCallsFailAlone: ten calls of 20,000 descriptors, four of
// 100,000 over the message limit and four of 100,000 tiny descriptors
// under it, sent three times while another client makes a steady stream
// of ordinary calls. Every large call is refused (INVALID_ARGUMENT or
// RESOURCE_EXHAUSTED, naming the limit) without one Redis key of its own;
// no ordinary call fails (before: 40–52 of ~2,250 UNAVAILABLE, the Redis
// guard tripped for everyone); the service's peak RSS stays under the
// chart's 256 MiB (before: 254 MB, then 324–333 MiB).
func TestBoundsLargeCallsFailAlone(t *testing.T) {
	redis := redistest.Start(t)
	// A Redis timeout far above any healthy round trip on a loaded
	// machine (the product's 25 ms is not: an ordinary call could fail
	// for the machine's sake), yet below what a pipeline of 20,000
	// scripts queued behind nine others takes, which is what tripped the
	// node guard for everyone.
	rls := startTokengateRLS(t, boundsConfig, redis.Addr, "-redis-timeout", "1s", "-pprof")
	pid := rls.cmd.Process.Pid
	before := procStatusKB(t, pid, "VmRSS")

	dial := func() rlsv3.RateLimitServiceClient {
		conn, err := grpc.NewClient(rls.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}

	// The steady client: ordinary calls of one descriptor, until the
	// attacks are over and at least minSteady have been made (bounded
	// by maxSteady calls).
	const minSteady, maxSteady = 600, 200000
	steady := dial()
	var steadyCalls, steadyFails atomic.Int64
	var firstFail atomic.Value
	attacksDone := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < maxSteady/2; i++ {
				select {
				case <-attacksDone:
					if steadyCalls.Load() >= minSteady {
						return
					}
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err := steady.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate",
					Descriptors: []*ratelimitv3.RateLimitDescriptor{boundsDesc(fmt.Sprintf("normal-%d-%d", g, i%50))}})
				cancel()
				steadyCalls.Add(1)
				if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK {
					steadyFails.Add(1)
					firstFail.CompareAndSwap(nil, fmt.Sprintf("%v %v", r, err))
				}
			}
		}()
	}

	big := func(n int, key string) *rlsv3.RateLimitRequest {
		req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: make([]*ratelimitv3.RateLimitDescriptor, n)}
		for i := range req.Descriptors {
			req.Descriptors[i] = boundsDesc(key + strconv.Itoa(i))
		}
		return req
	}
	tiny := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: make([]*ratelimitv3.RateLimitDescriptor, 100000)}
	for i := range tiny.Descriptors {
		tiny.Descriptors[i] = &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k"}}}
	}
	attacks := []struct {
		name string
		n    int
		req  *rlsv3.RateLimitRequest
		want codes.Code
		msg  string
	}{
		{"20,000 descriptors", 10, big(20000, "attack-"), codes.InvalidArgument, "-max-descriptors"},
		{"100,000 descriptors (2.6 MB)", 4, big(100000, "attack-"), codes.ResourceExhausted, "larger than max"},
		{"100,000 tiny descriptors (0.7 MB)", 4, tiny, codes.InvalidArgument, "-max-descriptors"},
	}
	var peakDuring int64
	for round := range 3 {
		var awg sync.WaitGroup
		for _, a := range attacks {
			for range a.n {
				awg.Add(1)
				c := dial() // each attacker on a connection of its own
				go func() {
					defer awg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					_, err := c.ShouldRateLimit(ctx, a.req)
					if st := status.Convert(err); st.Code() != a.want || !strings.Contains(st.Message(), a.msg) {
						t.Errorf("round %d, %s: got %v, want %v naming %q", round, a.name, err, a.want, a.msg)
					}
				}()
			}
		}
		awg.Wait()
		peakDuring = max(peakDuring, procStatusKB(t, pid, "VmRSS"))
	}
	close(attacksDone)
	wg.Wait()

	if n := steadyFails.Load(); n != 0 {
		t.Errorf("%d of %d ordinary calls failed during the attacks (first: %v), want 0", n, steadyCalls.Load(), firstFail.Load())
	}
	// The attacks reached no Redis key; the ordinary calls did (so the
	// check can fail).
	countKeys := func(pattern string) int {
		keys, ok := redis.MustDo("KEYS", pattern).([]any)
		if !ok {
			t.Fatalf("KEYS %s: not a list", pattern)
		}
		return len(keys)
	}
	if n := countKeys("*attack*"); n != 0 {
		t.Errorf("%d Redis keys of the refused calls, want none", n)
	}
	if countKeys("*normal*") == 0 {
		t.Error("no Redis key of the ordinary calls: the test does not see Redis")
	}
	hwm := procStatusKB(t, pid, "VmHWM")
	heap := liveHeapMiB(t, rls.Admin)
	t.Logf("ordinary calls: %d, failed %d; RSS before %d KiB, after the attacks %d KiB, peak (VmHWM) %d KiB; live heap after %.1f MiB",
		steadyCalls.Load(), steadyFails.Load(), before, peakDuring, hwm, heap)
	if hwm >= memLimitMiB<<10 {
		t.Errorf("peak RSS %d KiB, want under the chart's %d MiB", hwm, memLimitMiB)
	}
}

// TestBoundsRLQSUnknownBuckets: 200,000 bucket ids that name no rule, in
// reports of 10,000 on one RLQS stream, are each answered ALLOW_ALL and
// not kept: with the stream still open, the service's live heap is
// bounded by one report, not by the 200,000 ids (before: 238–250 MB kept).
// A report past -max-rlqs-buckets ends the stream RESOURCE_EXHAUSTED,
// naming the limit.
func TestBoundsRLQSUnknownBuckets(t *testing.T) {
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, boundsConfig, redis.Addr, "-pprof", "-max-rlqs-buckets", "10000")
	pid := rls.cmd.Process.Pid
	conn, err := grpc.NewClient(rls.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlqsv3.NewRateLimitQuotaServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := client.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heapBefore := liveHeapMiB(t, rls.Admin)
	const reports, per = 20, 10000
	report := func(r, n int) *rlqsv3.RateLimitQuotaUsageReports {
		m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "tokengate"}
		for i := range n {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"tokengate_rule": "no-such-rule", "id": fmt.Sprintf("unknown-%d-%d", r, i)}},
				NumRequestsAllowed: 1,
			})
		}
		return m
	}
	for r := range reports {
		if err := stream.Send(report(r, per)); err != nil {
			t.Fatalf("report %d: %v", r, err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("report %d: %v", r, err)
		}
		if len(resp.BucketAction) != per {
			t.Fatalf("report %d: %d actions, want %d", r, len(resp.BucketAction), per)
		}
		if got := resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule().String(); got != "ALLOW_ALL" {
			t.Fatalf("report %d: %s, want ALLOW_ALL", r, got)
		}
	}
	heapOpen := liveHeapMiB(t, rls.Admin) // the stream still open
	hwm := procStatusKB(t, pid, "VmHWM")
	t.Logf("live heap before %.1f MiB, after %d unknown ids on an open stream %.1f MiB; peak RSS %d KiB", heapBefore, reports*per, heapOpen, hwm)
	// 200,000 kept ids are over 100 MB of heap; one report's are a few.
	if heapOpen > heapBefore+32 {
		t.Errorf("live heap %.1f MiB after %d unknown bucket ids (%.1f before): they are kept", heapOpen, reports*per, heapBefore)
	}
	if hwm >= memLimitMiB<<10 {
		t.Errorf("peak RSS %d KiB, want under %d MiB", hwm, memLimitMiB)
	}

	// Past the stream's limit: one report of 10,001 buckets.
	if err := stream.Send(report(reports, per+1)); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "-max-rlqs-buckets") {
		t.Errorf("a report of %d buckets: got %v, want RESOURCE_EXHAUSTED naming -max-rlqs-buckets", per+1, err)
	}
}

// dropinYAML writes a runtime file of n descriptors (about 140 bytes
// each), each with a limit of its own; salt changes their values, hence
// the rules' names.
func dropinYAML(t testing.TB, path, domain string, n, salt int) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for i := range n {
		fmt.Fprintf(&b, "  - key: customer_id_number\n    value: \"customer-%08d-%03d-padding-padding\"\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", i, salt, i%1000+1)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBoundsDropinYAML: a runtime directory of 8.6 MB (60,000
// descriptors) is refused at start with a message naming
// TOKENGATE_RUNTIME_MAX_BYTES (before: loaded in 370 MB); one within the
// bounds (9,000 descriptors, 1.3 MB) loads under the chart's limit, and a
// reload that renames every descriptor does not double the memory
// (before: 370 → 670 MB, every rule's series kept).
func TestBoundsDropinYAML(t *testing.T) {
	redis := redistest.Start(t)

	// Refused: the process exits, naming the limit.
	bin := tokengateRLS(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "ratelimit", "config")
	if err := os.MkdirAll(config, 0o755); err != nil {
		t.Fatal(err)
	}
	dropinYAML(t, filepath.Join(config, "big.yaml"), "big", 60000, 0)
	cmd := exec.Command(bin)
	cmd.Args = []string{"ratelimit"}
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOST=127.0.0.1", "PORT=" + portOf(freeAddr(t)), "GRPC_HOST=127.0.0.1",
		"GRPC_PORT=" + portOf(freeAddr(t)), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + portOf(freeAddr(t)), "USE_STATSD=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr, "RUNTIME_ROOT=" + dir, "RUNTIME_SUBDIRECTORY=ratelimit"}
	done := make(chan struct{})
	var out []byte
	var runErr error
	go func() { out, runErr = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the drop-in did not refuse a directory over its limit within 20 s:\n%s", out)
	}
	if runErr == nil || !strings.Contains(string(out), "TOKENGATE_RUNTIME_MAX_BYTES") {
		t.Errorf("a directory of 60,000 descriptors: exit %v, output:\n%s\nwant a refusal naming TOKENGATE_RUNTIME_MAX_BYTES", runErr, out)
	}

	// Within the bounds: loaded, then reloaded.
	p := startDropinLayout(t, redis.Addr, func(config string) {
		dropinYAML(t, filepath.Join(config, "load.yaml"), "load", 9000, 0)
	}, "LOG_LEVEL=warn", "TOKENGATE_RLS_MEMORY_LIMIT="+strconv.Itoa(memLimitMiB<<20)) // as the chart sets it
	if p.pid == 0 {
		t.Fatal("no pid")
	}
	hwmLoad := procStatusKB(t, p.pid, "VmHWM")
	rssLoad := procStatusKB(t, p.pid, "VmRSS")
	heapLoad := liveHeapMiB(t, p.debug)
	dropinYAML(t, filepath.Join(p.config, "load.yaml"), "load", 9000, 7)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(p.out.String(), "configuration reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("not reloaded within 20 s:\n%s", p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	hwmReload := procStatusKB(t, p.pid, "VmHWM")
	rssReload := procStatusKB(t, p.pid, "VmRSS")
	heapReload := liveHeapMiB(t, p.debug)
	t.Logf("load: peak RSS %d KiB, RSS %d KiB, live heap %.1f MiB; after the reload: peak RSS %d KiB, RSS %d KiB, live heap %.1f MiB",
		hwmLoad, rssLoad, heapLoad, hwmReload, rssReload, heapReload)
	if hwmReload >= memLimitMiB<<10 {
		t.Errorf("peak RSS %d KiB, want under %d MiB", hwmReload, memLimitMiB)
	}
	// The configuration replaced is not kept: the live heap after the
	// reload is the one configuration's (two would be twice it; on a
	// loaded machine up to 1.4 times was seen while the reload's last
	// garbage was still reachable), and the resident set has not doubled.
	if heapReload > heapLoad*1.6+4 {
		t.Errorf("live heap %.1f MiB after the reload, %.1f before: the old configuration is kept", heapReload, heapLoad)
	}
	// The reload's peak holds the configuration in force, the new one and
	// the parse's garbage: under twice the first load's peak (before: 2.5
	// times, at GOGC=400).
	if hwmReload >= 2*hwmLoad {
		t.Errorf("peak RSS %d KiB after the reload, %d after the first load: want under twice", hwmReload, hwmLoad)
	}
	if rssReload > rssLoad*3/2 {
		t.Errorf("RSS %d KiB after the reload, %d before: want under 1.5 times", rssReload, rssLoad)
	}
}

func portOf(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }
