// Package daemon is tokengate-rls's lifecycle, one for both of its entry
// points: tokengate-rls, configured by flags and a JSON file, and the
// drop-in for envoyproxy/ratelimit, configured by that project's
// environment and its runtime directory or xDS source. The entry points
// differ only in how they fill Settings; Run opens the store and the
// listeners, serves RLS v3, RLQS and the gRPC health service, follows the
// rules and the TLS files, and drains on shutdown, the same way for both
// (as gubernator's command is a thin call into its daemon).
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rlqs"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// DefaultRedisTimeout is the bound on each Redis round trip by default
// (-redis-timeout, the drop-in's REDIS_TIMEOUT): tens of milliseconds, so
// that a failing Redis costs a request that, never seconds. A decision
// takes at most two round trips (the take, then the refund of a rejected
// or failed request), so clients wait above twice this plus the network:
// the filter's timeout_ms defaults to 60 (docs/rls.md#timeouts).
const DefaultRedisTimeout = 25 * time.Millisecond

// ErrorLogInterval is how often at most an error of one kind (a Redis
// failure by cause and node, a TLS handshake failure) is logged; the next
// line says how many were not.
const ErrorLogInterval = 10 * time.Second

// Settings are one run's: what both entry points configure.
type Settings struct {
	// Log receives the service's lines.
	Log *slog.Logger
	// Rules is where the configuration comes from.
	Rules Rules
	// Store are Redis's options; Run sets Observe.
	Store redisstore.Options
	// RedisNode labels the Redis errors that name no node: a single
	// Redis's address ("" for a Cluster).
	RedisNode string
	// DetailedLimit caps the descriptors that get detailed_metric series
	// of their own (rls.Metrics.SetDetailedLimit; < 0: the default).
	DetailedLimit int
	// GRPC is the gRPC listener's address: RLS v3, RLQS and
	// grpc.health.v1.
	GRPC string
	// Workers are the goroutines kept to run calls (0: a new goroutine
	// per call).
	Workers uint32
	// MaxConnections bounds the gRPC connections open at once (<= 0:
	// DefaultMaxConnections); the next one waits until one closes
	// (connlimit.go).
	MaxConnections int
	// Limits bound each caller's calls and the calls in flight (fields
	// <= 0: rls.DefaultLimits; docs/rls.md#limits).
	Limits rls.Limits
	// TLS, when not nil, serves gRPC over TLS from these files; a start
	// error about them is prefixed with TLSNames.
	TLS      *rls.TLSFiles
	TLSNames string
	// Writes say who may settle and lease (rls.WriteAuth,
	// docs/rls.md#trust-model); the zero value refuses every write.
	Writes rls.WriteAuth
	// CredentialFile, when not empty, is the file of the proxies'
	// credentials Writes was built with (rls.ReadCredentialFile): read
	// again on Hup and, polled, when its contents change, so that a
	// credential is rotated without a restart. A file that does not read
	// keeps the credentials in force, and says why once.
	CredentialFile string
	// AdminAuth and UsageAuth say who may call the admin API and the
	// usage endpoint (rls.AdminGate; the zero values: nobody), built with
	// the credentials of AdminCredentialFile and UsageCredentialFile when
	// set, which are read again as CredentialFile is.
	AdminAuth, UsageAuth                     rls.WriteAuth
	AdminCredentialFile, UsageCredentialFile string
	// HealthNames are the service names the health service answers for
	// besides "" and rls.RLSService.
	HealthNames []string
	// HoldWhileEmpty keeps the service not ready while the configuration
	// in force has no domain (the drop-in's
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	HoldWhileEmpty bool
	// HTTP are the HTTP listeners, in order.
	HTTP []HTTP
	// Poll is how often the rules' source and the TLS files are checked
	// for changes (0: only a signal on Hup reloads).
	Poll time.Duration
	// Hup, when not nil, asks for a reload of the rules and the TLS files
	// (SIGHUP).
	Hup <-chan os.Signal
	// DrainDelay is how long, once ctx is done, the service keeps
	// serving while not ready (health NOT_SERVING) before it stops
	// accepting calls; Drain how long it then waits for the calls in
	// flight.
	DrainDelay, Drain time.Duration
	// Serving, when not nil, is called once every listener listens.
	Serving func(Serving)
}

// HTTP is one HTTP listener: its address and what it serves.
type HTTP struct {
	Addr    string
	Handler func(Parts) http.Handler
	// TLS serves the listener over TLS with Settings.TLS's files
	// (rls.ServerTLS.HTTPConfig), when they are set.
	TLS bool
}

// Parts are the running service's pieces an HTTP listener serves.
type Parts struct {
	Server  *rls.Server
	Metrics *rls.Metrics
	Ready   *rls.Readiness
	// Store is the Redis store; Gate says who may call the admin API.
	Store *redisstore.Store
	Gate  *rls.AdminGate
}

// Serving describes the service once it listens.
type Serving struct {
	// GRPC and HTTP are the listeners' addresses, HTTP in Settings.HTTP's
	// order.
	GRPC string
	HTTP []string
	// Config is the configuration in force.
	Config *rls.Config
}

// Rules is the source of the service's configuration. Its methods other
// than Follow's goroutines are called from one goroutine.
type Rules interface {
	// First returns the configuration to start with.
	First() (*rls.Config, error)
	// Follow starts following the source until ctx is done, giving every
	// new configuration (or failure to load one) to apply. It returns
	// when the service may start serving: start is false when ctx ended
	// first (xDS waits for its first configuration).
	Follow(ctx context.Context, apply Apply) (start bool, err error)
	// Poll loads the source again if it changed (every Settings.Poll).
	Poll(apply Apply)
	// Reload loads the source again (why: the trigger, for the log).
	Reload(why string, apply Apply)
}

// Apply puts a configuration in force, or counts the failure to load one
// (err, c nil; the configuration in force stays). The source logs.
type Apply func(c *rls.Config, err error)

// Run serves until ctx is done, then drains and returns nil; or returns
// the error that kept it from starting or stopped a listener.
func Run(ctx context.Context, s Settings) error {
	// What Run starts (the rules' source, RLQS's streams) ends when it
	// returns, whatever the reason.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg, err := s.Rules.First()
	if err != nil {
		return err
	}
	var serverTLS *rls.ServerTLS
	if s.TLS != nil {
		if serverTLS, err = rls.NewServerTLS(*s.TLS); err != nil {
			if s.TLSNames != "" {
				return fmt.Errorf("%s: %w", s.TLSNames, err)
			}
			return err
		}
	}
	metrics := rls.NewMetrics(cfg)
	metrics.SetDetailedLimit(s.DetailedLimit)
	metrics.SetErrorLog(rls.NewErrorLog(s.Log, ErrorLogInterval, nil))
	if s.RedisNode != "" {
		metrics.SetRedisNode(s.RedisNode)
	}
	storeOpt := s.Store
	storeOpt.Observe = metrics.ObserveRedis
	store, err := redisstore.New(storeOpt)
	if err != nil {
		return err
	}
	defer store.Close()
	srv := rls.NewServer(cfg, store, metrics)
	srv.SetWriteAuth(s.Writes)
	limits := s.Limits.WithDefaults()
	srv.SetLimits(limits)
	ready := rls.NewReadiness(store, time.Second, func(msg string) { s.Log.Warn(msg) })
	defer ready.Stop()
	HoldFor(ready, s.HoldWhileEmpty, cfg)

	opts := append(limits.ServerOptions(), grpc.StatsHandler(metrics.StatsHandler()))
	if serverTLS != nil {
		opts = append(opts, grpc.Creds(serverTLS.Credentials(metrics)))
	}
	gs := rls.NewGRPCServer(srv, s.Workers, opts...)
	// RLQS beside RLS v3 (docs/rlqs.md); its streams expire their
	// assignments when ctx is done.
	quota := rlqs.Register(ctx, gs, cfg.Rules(), store, metrics.Registry())
	quota.SetMaxBuckets(limits.RLQSBuckets)
	quota.SetDomain(rlqs.FileDomain(cfg.File))
	health := rls.RegisterHealth(gs, ready, s.HealthNames...)

	apply := func(c *rls.Config, err error) {
		metrics.Reloaded(err)
		if err != nil {
			return
		}
		srv.SetConfig(c)
		quota.SetRules(c.Rules())
		quota.SetDomain(rlqs.FileDomain(c.File))
		HoldFor(ready, s.HoldWhileEmpty, c)
	}
	start, err := s.Rules.Follow(ctx, apply)
	if err != nil || !start {
		return err
	}

	ls, err := listen(s)
	if err != nil {
		return err
	}
	errc := make(chan error, 1+len(ls))
	go func() { errc <- gs.Serve(ls[0]) }()
	gate := rls.NewAdminGate(s.AdminAuth, s.UsageAuth)
	parts := Parts{Server: srv, Metrics: metrics, Ready: ready, Store: store, Gate: gate}
	var https []*http.Server
	serving := Serving{GRPC: ls[0].Addr().String(), Config: srv.Config()}
	for i, h := range s.HTTP {
		hs := &http.Server{Handler: h.Handler(parts), ReadHeaderTimeout: 5 * time.Second}
		https = append(https, hs)
		l := ls[i+1]
		if h.TLS && serverTLS != nil {
			l = tls.NewListener(l, serverTLS.HTTPConfig())
		}
		go func() { errc <- hs.Serve(l) }()
		serving.HTTP = append(serving.HTTP, l.Addr().String())
	}
	if s.Serving != nil {
		s.Serving(serving)
	}

	w := &watcher{log: s.Log, rules: s.Rules, apply: apply, tls: serverTLS}
	if s.CredentialFile != "" {
		w.creds = append(w.creds, newCredentials(s.CredentialFile, s.Writes, srv.SetWriteAuth))
	}
	if s.AdminCredentialFile != "" {
		w.creds = append(w.creds, newCredentials(s.AdminCredentialFile, s.AdminAuth, gate.SetAdmin))
	}
	if s.UsageCredentialFile != "" {
		w.creds = append(w.creds, newCredentials(s.UsageCredentialFile, s.UsageAuth, gate.SetUsage))
	}
	if err := w.serve(ctx, s.Hup, s.Poll, errc); err != nil {
		gs.Stop()
		for _, hs := range https {
			_ = hs.Close()
		}
		return err
	}
	return shutdown(s, ready, health, gs, https, errc)
}

// HoldFor keeps ready not ready while c has no domain, when whileEmpty
// (Settings.HoldWhileEmpty), and releases it otherwise.
func HoldFor(ready *rls.Readiness, whileEmpty bool, c *rls.Config) {
	ready.Hold(whileEmpty && len(c.Domains()) == 0)
}

// listen opens the gRPC listener (at most s.MaxConnections connections
// open at once), then the HTTP ones; on failure none stays open.
func listen(s Settings) ([]net.Listener, error) {
	addrs := []string{s.GRPC}
	for _, h := range s.HTTP {
		addrs = append(addrs, h.Addr)
	}
	var ls []net.Listener
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return nil, err
		}
		if len(ls) == 0 {
			l = limitConnections(l, s.MaxConnections)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

// shutdown stops the service gracefully once ctx is done: not ready
// first, so that health checks and load balancers send no new calls;
// serving those that still come for DrainDelay; then no new calls, and
// up to Drain for those in flight.
func shutdown(s Settings, ready *rls.Readiness, health interface{ Shutdown() }, gs *grpc.Server, https []*http.Server, errc <-chan error) error {
	s.Log.Info("shutting down: not ready", "drain_delay", s.DrainDelay, "drain", s.Drain)
	ready.Drain()
	if s.DrainDelay > 0 {
		t := time.NewTimer(s.DrainDelay)
		select {
		case <-t.C:
		case err := <-errc:
			t.Stop()
			s.Log.Error("listener failed while draining", "error", err)
		}
	}
	health.Shutdown()
	done := make(chan struct{})
	go func() { gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.Drain):
		s.Log.Warn("calls still in flight after -drain: stopping them", "drain", s.Drain)
		gs.Stop()
	}
	s.Log.Info("stopped")
	sctx, cancel := context.WithTimeout(context.Background(), s.Drain)
	defer cancel()
	var err error
	for _, hs := range https {
		err = errors.Join(err, hs.Shutdown(sctx))
	}
	return err
}

// WithPprof serves net/http/pprof's handlers under /debug/pprof/ and the
// rest with h. Registered on a mux of our own: importing net/http/pprof
// also registers them on http.DefaultServeMux, which nothing here serves.
func WithPprof(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/", h)
	return mux
}
