// Command tokengate-rls serves Envoy's rate-limit service API (RLS v3 over
// gRPC) with continuous token buckets kept in Redis or a Redis Cluster. It
// reads the same JSON configuration as the filter. See docs/rls.md.
//
//	tokengate-rls -config tokengate.json -redis 127.0.0.1:6379 \
//	    -listen 127.0.0.1:8081 -admin 127.0.0.1:9901
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/tokengate/tokengate/internal/rlqs"
	"github.com/tokengate/tokengate/internal/rls"
)

// defaultRedisTimeout is -redis-timeout's default: tens of milliseconds, so
// that a failing Redis costs a request that, never seconds. A decision
// takes at most two round trips (the take, then the refund of a rejected
// or failed request), so clients wait above twice this plus the network:
// the filter's timeout_ms defaults to 60 (docs/rls.md#timeouts).
const defaultRedisTimeout = 25 * time.Millisecond

// defaultGCPercent is the garbage collector's GOGC when the environment
// sets none. The live heap is small (a few megabytes: connection buffers,
// the configuration) and every call allocates a few kilobytes, mostly in
// grpc-go, so at Go's default of 100 the collector ran about 50 times a
// second under load and took about a tenth of the CPU; at 400 the heap
// may grow to five times the live heap (about 15 MB) and the collector
// runs a fifth as often.
const defaultGCPercent = 400

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	run := run
	if isRatelimit(os.Args[0]) { // envoyproxy/ratelimit's environment (compat.go)
		run = func(ctx context.Context, _ []string, logw io.Writer, l chan<- [2]string) error {
			return runRatelimit(ctx, os.LookupEnv, logw, l)
		}
	}
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "tokengate-rls:", err)
		os.Exit(1)
	}
}

// run serves until ctx is done, then stops gracefully. When listening is
// not nil it receives the gRPC and admin addresses once both listen.
func run(ctx context.Context, args []string, logw io.Writer, listening chan<- [2]string) error {
	fs := flag.NewFlagSet("tokengate-rls", flag.ContinueOnError)
	fs.SetOutput(logw)
	configPath := fs.String("config", "", "the JSON configuration `file` (the filter's format; required)")
	redisAddrs := fs.String("redis", "127.0.0.1:6379", "Redis `address`es, comma-separated (several need -redis-cluster)")
	cluster := fs.Bool("redis-cluster", false, "the addresses are seed nodes of a Redis Cluster")
	timeout := fs.Duration("redis-timeout", defaultRedisTimeout, "bound on each of a request's Redis round trips (the take, and the refund if any); "+
		"keep clients' timeouts above twice this plus the network")
	flushDelay := fs.Duration("redis-flush-delay", 20*time.Microsecond, "how long a Redis connection's writer may wait, under concurrent load, to batch commands into one write (0: none)")
	listen := fs.String("listen", "127.0.0.1:8081", "gRPC `address` of the rate-limit service")
	admin := fs.String("admin", "127.0.0.1:9901", "HTTP `address` of /metrics, /ready and /json")
	drain := fs.Duration("drain", 5*time.Second, "how long shutdown waits for calls in flight")
	workers := fs.Uint("stream-workers", rls.DefaultStreamWorkers, "goroutines kept to run calls (0: a new goroutine per call)")
	pprofOn := fs.Bool("pprof", false, "serve Go's profiles (net/http/pprof) on the admin listener under /debug/pprof/")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *flushDelay < 0 {
		return fmt.Errorf("-redis-flush-delay %v: must not be negative", *flushDelay)
	}
	if *workers > 1<<16 {
		return fmt.Errorf("-stream-workers %d: at most 65536", *workers)
	}
	if *configPath == "" {
		return errors.New("-config is required")
	}
	data, err := os.ReadFile(*configPath)
	if err != nil {
		return err
	}
	cfg, err := rls.ParseConfig(data)
	if err != nil {
		return fmt.Errorf("%s: %w", *configPath, err)
	}
	metrics := rls.NewMetrics(cfg)
	store, err := rls.NewStore(rls.StoreOptions{
		Addrs:      strings.Split(*redisAddrs, ","),
		Cluster:    *cluster,
		Timeout:    *timeout,
		Observe:    metrics.ObserveRedis,
		FlushDelay: *flushDelay,
	})
	if err != nil {
		return err
	}
	defer store.Close()

	gl, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	al, err := net.Listen("tcp", *admin)
	if err != nil {
		gl.Close()
		return err
	}
	srv := rls.NewServer(cfg, store, metrics)
	gs := rls.NewGRPCServer(srv, uint32(*workers))
	rlqs.Register(ctx, gs, cfg, store) // RLQS beside RLS v3 (docs/rlqs.md); streams expire their assignments on shutdown
	ready := rls.NewReadiness(store, time.Second, func(msg string) { fmt.Fprintln(logw, "tokengate-rls:", msg) })
	defer ready.Stop()
	handler := rls.AdminHandler(srv, metrics, ready)
	if *pprofOn {
		handler = withPprof(handler)
	}
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}

	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(gl) }()
	go func() { errc <- hs.Serve(al) }()
	fmt.Fprintf(logw, "tokengate-rls: %d rules, gRPC on %s, admin on %s, Redis %s (cluster %v, timeout %v)\n",
		len(cfg.Rules()), gl.Addr(), al.Addr(), *redisAddrs, *cluster, *timeout)
	if listening != nil {
		listening <- [2]string{gl.Addr().String(), al.Addr().String()}
	}

	select {
	case <-ctx.Done():
	case err := <-errc:
		gs.Stop()
		_ = hs.Close()
		return err
	}
	fmt.Fprintln(logw, "tokengate-rls: shutting down")
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(*drain):
		gs.Stop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	return hs.Shutdown(sctx)
}

// withPprof serves net/http/pprof's handlers under /debug/pprof/ and the
// rest with h. Registered on a mux of our own: importing net/http/pprof
// also registers them on http.DefaultServeMux, which nothing here serves.
func withPprof(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/", h)
	return mux
}
