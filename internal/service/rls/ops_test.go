package rls_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// TestErrorLog walks a fake clock: the first error of a kind is logged,
// the others within the interval counted, and the next line after it
// says how many were suppressed; kinds do not hold each other back.
func TestErrorLog(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	l := rls.NewErrorLog(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})), 10*time.Second, func() time.Time { return now })
	steps := []struct {
		at   time.Duration
		kind string
		want string // the line written, or ""
	}{
		{0, "a", `level=ERROR msg=failed n=0` + "\n"},
		{time.Second, "a", ""},
		{2 * time.Second, "b", `level=ERROR msg=failed n=2` + "\n"},
		{9 * time.Second, "a", ""},
		{10 * time.Second, "a", `level=ERROR msg=failed n=4 suppressed=2` + "\n"},
		{11 * time.Second, "a", ""},
		{30 * time.Second, "a", `level=ERROR msg=failed n=6 suppressed=1` + "\n"},
		{31 * time.Second, "b", `level=ERROR msg=failed n=7` + "\n"},
	}
	for i, s := range steps {
		now = time.Unix(1000, 0).Add(s.at)
		buf.Reset()
		l.Error("failed", s.kind, "n", i)
		if got := buf.String(); got != s.want {
			t.Errorf("step %d: got %q, want %q", i, got, s.want)
		}
	}
}

// TestRedisCause: each kind of Redis failure gets its cause, and the node
// when the error names it.
func TestRedisCause(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 7), Port: 6379}
	for _, tc := range []struct {
		name        string
		err         error
		cause, node string
	}{
		{"deadline", context.DeadlineExceeded, "timeout", ""},
		{"wrapped deadline", fmt.Errorf("x: %w", context.DeadlineExceeded), "timeout", ""},
		{"canceled", context.Canceled, "canceled", ""},
		{"not connected", redisstore.ErrNotConnected, "not_connected", ""},
		{"node not answering", redisstore.ErrBacklog, "not_answering", ""},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Addr: addr, Err: errors.New("connection refused")}, "connection", "10.0.0.7:6379"},
		{"eof", io.EOF, "connection", ""},
		{"closing", rueidis.ErrClosing, "connection", ""},
		{"other", errors.New("something"), "other", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cause, node := rls.RedisCause(tc.err)
			if cause != tc.cause || node != tc.node {
				t.Errorf("got %q %q, want %q %q", cause, node, tc.cause, tc.node)
			}
		})
	}
}

// TestMetricsRedisErrors: a failed round trip counts under its cause and
// node; a plain Redis's address stands for errors that name none.
func TestMetricsRedisErrors(t *testing.T) {
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	m := rls.NewMetrics(cfg)
	m.SetRedisNode("127.0.0.1:6379")
	m.ObserveRedis(time.Millisecond, context.DeadlineExceeded)
	m.ObserveRedis(time.Millisecond, context.DeadlineExceeded)
	m.ObserveRedis(time.Millisecond, nil)
	text := m.String()
	for _, want := range []string{
		`tokengate_rls_redis_errors_total{cause="timeout",node="127.0.0.1:6379"} 2`,
		`tokengate_rls_redis_duration_seconds_count 3`,
		`go_goroutines `,
		`process_cpu_seconds_total `,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestHitsWeighted: decisions count once per descriptor, hits by the
// tokens each asked for.
func TestHitsWeighted(t *testing.T) {
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	m := rls.NewMetrics(cfg)
	srv := rls.NewServer(cfg, allow{}, m)
	for _, hits := range []uint64{0, 5, 7} {
		req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("hot", "", hits)}}
		if _, err := srv.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	text := m.String()
	for _, want := range []string{`tokengate_rls_decisions_total{code="ok",rule="hot"} 3`, `tokengate_rls_hits_total{code="ok",rule="hot"} 13`} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q:\n%s", want, text)
		}
	}
}

// TestSetConfigUnderLoad: calls keep being answered, each by one whole
// configuration, while the configuration is swapped back and forth (run
// with -race); a rule the new configuration names is decided from the
// swap on, and its counters continue across swaps.
func TestSetConfigUnderLoad(t *testing.T) {
	a, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	b, err := rls.ParseConfig([]byte(strings.Replace(testConfig, `"name": "hot"`, `"name": "hot2"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	m := rls.NewMetrics(a)
	srv := rls.NewServer(a, allow{}, m)
	req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("hot", "", 0), ours("keys", "k", 0)}}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := srv.ShouldRateLimit(context.Background(), req)
				if err != nil || len(resp.Statuses) != 2 {
					t.Errorf("call during swaps: %v %v", resp, err)
					return
				}
			}
		}()
	}
	for i := range 200 {
		if i%2 == 0 {
			srv.SetConfig(b)
		} else {
			srv.SetConfig(a)
		}
	}
	close(stop)
	wg.Wait()
	srv.SetConfig(b)
	resp, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokengate",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("hot2", "", 0)}})
	if err != nil || resp.Statuses[0].GetCurrentLimit().GetName() != "hot2" {
		t.Errorf("hot2 after the swap: %v %v", resp, err)
	}
	if srv.Config() != b {
		t.Error("Config is not the last one set")
	}
	if !strings.Contains(m.String(), `tokengate_rls_decisions_total{code="ok",rule="hot2"} `) {
		t.Error("no counters for the swapped-in rule")
	}
}

// TestStatsHandler: calls gRPC refuses before the service (a message
// above the receive limit) are counted by code, as are answered ones, and
// none stays in flight.
func TestStatsHandler(t *testing.T) {
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	m := rls.NewMetrics(cfg)
	gs := rls.NewGRPCServer(rls.NewServer(cfg, allow{}, m), 0, grpc.StatsHandler(m.StatsHandler()), grpc.MaxRecvMsgSize(1<<10))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(l) }()
	defer gs.Stop()
	conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("hot", "", 0)}}); err != nil {
		t.Fatal(err)
	}
	_, err = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("hot", strings.Repeat("x", 2<<10), 0)}})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 2 KiB call with a 1 KiB limit: %v", err)
	}
	text := m.String()
	for _, want := range []string{
		`tokengate_rls_grpc_calls_total{code="OK",method="ShouldRateLimit"} 1`,
		`tokengate_rls_grpc_calls_total{code="ResourceExhausted",method="ShouldRateLimit"} 1`,
		`tokengate_rls_grpc_call_duration_seconds_count{code="OK",method="ShouldRateLimit"} 1`,
		`tokengate_rls_grpc_calls_in_flight 0`,
		`tokengate_rls_requests_total{code="ok"} 1`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// BenchmarkGRPCDecide is a decision through gRPC on loopback with a store
// that always admits: "plain" without the stats handler, "stats" with
// it, the per-call cost of counting every gRPC call.
func BenchmarkGRPCDecide(b *testing.B) {
	cfg, err := rls.ParseConfig([]byte(testConfig))
	if err != nil {
		b.Fatal(err)
	}
	for _, withStats := range []bool{false, true} {
		name := "plain"
		if withStats {
			name = "stats"
		}
		b.Run(name, func(b *testing.B) {
			m := rls.NewMetrics(cfg)
			var opts []grpc.ServerOption
			if withStats {
				opts = append(opts, grpc.StatsHandler(m.StatsHandler()))
			}
			gs := rls.NewGRPCServer(rls.NewServer(cfg, allow{}, m), rls.DefaultStreamWorkers, opts...)
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go func() { _ = gs.Serve(l) }()
			defer gs.Stop()
			conn, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "tokengate", Descriptors: []*ratelimitv3.RateLimitDescriptor{ours("keys", "203.0.113.7", 0)}}
			b.ReportAllocs()
			start := cpuTime()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := c.ShouldRateLimit(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			// The process's CPU time (client and server) per call: on a
			// shared machine steadier than the wall clock's ns/op.
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestNotConnectedObserved: calls made before the store ever reached Redis
// fail with ErrNotConnected and are reported to Observe, so that the error
// counter and the error log see them (they were only in requests_total).
func TestNotConnectedObserved(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there: the store never connects
	var got []error
	var mu sync.Mutex
	s, err := redisstore.New(redisstore.Options{Addrs: []string{addr}, Timeout: 25 * time.Millisecond,
		Observe: func(_ time.Duration, err error) { mu.Lock(); got = append(got, err); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out := s.Run(context.Background(), []redisstore.Op{{Key: "k", Rate: 1, Burst: 1, Cost: 1}})
	if !errors.Is(out[0].Err, redisstore.ErrNotConnected) {
		t.Fatalf("outcome %+v, want ErrNotConnected", out[0])
	}
	if _, err := s.Lease(context.Background(), redisstore.LeaseOp{Key: "k", Rate: 1, Burst: 1}); !errors.Is(err, redisstore.ErrNotConnected) {
		t.Fatalf("lease error %v, want ErrNotConnected", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || !errors.Is(got[0], redisstore.ErrNotConnected) || !errors.Is(got[1], redisstore.ErrNotConnected) {
		t.Fatalf("observed %v, want ErrNotConnected twice", got)
	}
}
