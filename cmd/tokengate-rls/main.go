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
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"
	// The zone database, built in: quota rules name IANA time zones
	// (algorithm_config.time_zone), and a container image may have none.
	_ "time/tzdata"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// defaultRedisTimeout is -redis-timeout's default (daemon.DefaultRedisTimeout).
const defaultRedisTimeout = daemon.DefaultRedisTimeout

// defaultGCPercent is the garbage collector's GOGC when the environment
// sets none. The live heap is small (a few megabytes: connection buffers,
// the configuration) and every call allocates a few kilobytes, mostly in
// grpc-go, so at Go's default of 100 the collector ran about 50 times a
// second under load and took about a tenth of the CPU; at 400 the heap
// may grow to five times the live heap (about 15 MB) and the collector
// runs a fifth as often.
const defaultGCPercent = 400

// envPrefix prefixes the environment variable of every flag: -redis-timeout
// is also TOKENGATE_RLS_REDIS_TIMEOUT.
const envPrefix = "TOKENGATE_RLS_"

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	if limit, ok, err := softMemoryLimit(os.LookupEnv); err != nil {
		fmt.Fprintln(os.Stderr, "tokengate-rls:", err)
		os.Exit(1)
	} else if ok {
		debug.SetMemoryLimit(limit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	run := run
	if isRatelimit(os.Args[0]) { // envoyproxy/ratelimit's environment (compat.go)
		run = func(ctx context.Context, args []string, logw io.Writer, l chan<- [2]string) error {
			return runRatelimitArgs(ctx, args, os.LookupEnv, logw, l)
		}
	}
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "tokengate-rls:", err)
		os.Exit(1)
	}
}

// options are the service's settings: its flags, each also settable
// from the environment (flagsFromEnv).
type options struct {
	configPath  string
	redisAddrs  string
	cluster     bool
	timeout     time.Duration
	flushDelay  time.Duration
	listen      string
	admin       string
	drain       time.Duration
	drainDelay  time.Duration
	workers     uint
	pprofOn     bool
	tlsCert     string
	tlsKey      string
	tlsClientCA string
	// The trust model (docs/rls.md#trust-model).
	tlsClientOptional bool
	tlsWriterURI      string
	credentialFile    string
	openWrites        bool
	watch             time.Duration
	logLevel          string
	logFormat         string
	redisSec          redisSecurity
	limits            limitFlags

	// The admin API (docs/rls.md#admin-api).
	adminCredFile, usageCredFile, tlsAdminURI string
}

// parseOptions reads the flags, then the environment for those the command
// line left unset, and checks them.
func parseOptions(args []string, logw io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("tokengate-rls", flag.ContinueOnError)
	fs.SetOutput(logw)
	fs.StringVar(&o.configPath, "config", "", "the JSON configuration `file` (the filter's format; required); reloaded on SIGHUP and when it changes")
	fs.StringVar(&o.redisAddrs, "redis", "127.0.0.1:6379", "Redis `address`es, comma-separated (several need -redis-cluster)")
	fs.BoolVar(&o.cluster, "redis-cluster", false, "the addresses are seed nodes of a Redis Cluster")
	fs.DurationVar(&o.timeout, "redis-timeout", defaultRedisTimeout, "bound on each of a request's Redis round trips (the take, and the refund if any); "+
		"keep clients' timeouts above twice this plus the network")
	fs.DurationVar(&o.flushDelay, "redis-flush-delay", 20*time.Microsecond, "how long a Redis connection's writer may wait, under concurrent load, to batch commands into one write (0: none)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8081", "gRPC `address` of the rate-limit service and the gRPC health service")
	fs.StringVar(&o.admin, "admin", "127.0.0.1:9901", "HTTP `address` of /metrics, /live, /ready, /json and the admin API /v1/ (empty: none)")
	fs.DurationVar(&o.drain, "drain", 5*time.Second, "how long shutdown waits for calls in flight")
	fs.DurationVar(&o.drainDelay, "drain-delay", 5*time.Second, "on SIGTERM, how long the service keeps serving, not ready (/ready 503, gRPC health NOT_SERVING), before it stops accepting calls")
	fs.UintVar(&o.workers, "stream-workers", rls.DefaultStreamWorkers, "goroutines kept to run calls (0: a new goroutine per call)")
	o.redisSec.flags(fs)
	o.limits.flags(fs)
	fs.BoolVar(&o.pprofOn, "pprof", false, "serve Go's profiles (net/http/pprof) on the admin listener under /debug/pprof/")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM `file` of the gRPC listener's certificate chain (with -tls-key: gRPC over TLS); re-read when it changes")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM `file` of the gRPC listener's private key")
	fs.StringVar(&o.tlsClientCA, "tls-client-ca", "", "PEM `file` of the CAs client certificates must chain to: clients without one are refused")
	fs.BoolVar(&o.tlsClientOptional, "tls-client-optional", false, "with -tls-client-ca: clients without a certificate may connect and get decisions, but not settle or lease")
	fs.StringVar(&o.tlsWriterURI, "tls-writer-uri-prefix", "", "with -tls-client-ca: a client certificate authenticates a proxy's settlements and lease calls only when it has a URI SAN with this `prefix` (e.g. spiffe://cluster.local/ns/edge/)")
	fs.StringVar(&o.credentialFile, "credential-file", "", "`file` of the proxies' credentials, one per line: a settlement or lease call must carry one (authorization: Bearer <credential>; the filter's settings.rls.credential)")
	fs.StringVar(&o.adminCredFile, "admin-credential-file", "", "`file` of the admin API's credentials, one per line: PUT/GET/DELETE /v1/overrides and GET /v1/usage on -admin need one "+
		"(authorization: Bearer <credential>); without it or -tls-admin-uri-prefix the admin API answers 403")
	fs.StringVar(&o.usageCredFile, "usage-credential-file", "", "`file` of credentials that may only read GET /v1/usage (a customer portal's backend); the admin's credentials read it too")
	fs.StringVar(&o.tlsAdminURI, "tls-admin-uri-prefix", "", "with -tls-client-ca: serve -admin over TLS, and accept admin API calls with a client certificate that has a URI SAN with this `prefix` "+
		"(e.g. spiffe://cluster.local/ns/ops/)")
	fs.BoolVar(&o.openWrites, "allow-unauthenticated-writes", false, "accept settlements and lease calls from any caller (unsafe: any client that reaches the port can refund, reset or charge any key); "+
		"without it, and without -credential-file or -tls-client-ca, they are refused")
	fs.DurationVar(&o.watch, "watch-interval", 2*time.Second, "how often the -config file, the TLS files and the -credential-file are checked for changes (0: only SIGHUP reloads)")
	fs.StringVar(&o.logLevel, "log-level", "info", "least `level` logged: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log `format`: text (logfmt) or json")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := flagsFromEnv(fs, os.LookupEnv); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.flushDelay < 0 {
		return nil, fmt.Errorf("-redis-flush-delay %v: must not be negative", o.flushDelay)
	}
	if o.workers > 1<<16 {
		return nil, fmt.Errorf("-stream-workers %d: at most 65536", o.workers)
	}
	if o.drainDelay < 0 || o.watch < 0 {
		return nil, errors.New("-drain-delay and -watch-interval must not be negative")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") || o.tlsClientCA != "" && o.tlsCert == "" {
		return nil, errors.New("-tls-cert and -tls-key go together, and -tls-client-ca needs them")
	}
	if (o.tlsClientOptional || o.tlsWriterURI != "") && o.tlsClientCA == "" {
		return nil, errors.New("-tls-client-optional and -tls-writer-uri-prefix need -tls-client-ca")
	}
	if o.openWrites && (o.credentialFile != "" || o.tlsClientCA != "") {
		return nil, errors.New("-allow-unauthenticated-writes contradicts -credential-file and -tls-client-ca: choose one")
	}
	if err := o.checkAdmin(); err != nil {
		return nil, err
	}
	if err := o.limits.check(); err != nil {
		return nil, err
	}
	if o.configPath == "" {
		return nil, errors.New("-config is required")
	}
	return o, nil
}

// run serves until ctx is done, then drains and stops gracefully
// (daemon.Run). When listening is not nil it receives the gRPC and admin
// addresses once both listen. SIGHUP, from the start of run until it
// returns, reloads the configuration and the TLS files.
func run(ctx context.Context, args []string, logw io.Writer, listening chan<- [2]string) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	o, err := parseOptions(args, logw)
	if err != nil {
		return err
	}
	logger, err := newLogger(logw, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	s, err := o.settings(logger, hup)
	if err != nil {
		return err
	}
	s.Serving = func(sv daemon.Serving) {
		adminAddr := ""
		if len(sv.HTTP) > 0 {
			adminAddr = sv.HTTP[0]
		}
		logger.Info("serving", "rules", len(sv.Config.Rules()), "grpc", sv.GRPC, "tls", s.TLS != nil,
			"client_certs", o.tlsClientCA != "", "admin", adminAddr, "admin_api", o.adminAPIState(), "redis", dropin.RedactURL(o.redisAddrs), "cluster", o.cluster, "redis_timeout", o.timeout)
		switch {
		case s.Writes.Open:
			logger.Warn("UNSAFE: -allow-unauthenticated-writes: any client that reaches the gRPC or admin port can refund, reset and charge any key " +
				"and lease its tokens; give the proxies a credential (-credential-file) or client certificates (-tls-client-ca) instead (docs/rls.md#trust-model)")
		case !s.Writes.Configured() && writes(sv.Config):
			logger.Warn("settlements and lease calls are refused: no -credential-file or -tls-client-ca authenticates the proxies; " +
				"rules that settle after the response or run in lease mode will fail (docs/rls.md#trust-model)")
		}
		if listening != nil {
			listening <- [2]string{sv.GRPC, adminAddr}
		}
	}
	return daemon.Run(ctx, s)
}

// writes reports whether c has rules whose proxies write: rules that
// settle after the response or run in lease mode.
func writes(c *rls.Config) bool {
	for _, r := range c.Rules() {
		if r.Cluster && (r.Settle != nil || r.Lease != nil) {
			return true
		}
	}
	return false
}

// settings are the service's, from the options: the JSON file's rules,
// the admin listener unless -admin is empty.
func (o *options) settings(logger *slog.Logger, hup <-chan os.Signal) (daemon.Settings, error) {
	storeOpt, err := o.storeOptions()
	if err != nil {
		return daemon.Settings{}, err
	}
	s := daemon.Settings{
		Log:           logger,
		Rules:         daemon.NewJSONFile(o.configPath, logger),
		Store:         storeOpt,
		DetailedLimit: rls.DefaultDetailedDescriptors,
		GRPC:          o.listen,
		Workers:       uint32(o.workers),
		Limits:        o.limits.Limits(),
		Poll:          o.watch,
		Hup:           hup,
		DrainDelay:    o.drainDelay,
		Drain:         o.drain,
	}
	s.MaxConnections = int(o.limits.conns)
	if !o.cluster {
		s.RedisNode = o.redisAddrs
	}
	if o.tlsCert != "" {
		s.TLS = &rls.TLSFiles{Cert: o.tlsCert, Key: o.tlsKey, ClientCA: o.tlsClientCA, ClientOptional: o.tlsClientOptional}
	}
	s.Writes = rls.WriteAuth{Open: o.openWrites, Certs: o.tlsClientCA != "", URIPrefix: o.tlsWriterURI}
	s.CredentialFile = o.credentialFile
	if o.credentialFile != "" {
		creds, err := rls.ReadCredentialFile(o.credentialFile)
		if err != nil {
			return daemon.Settings{}, fmt.Errorf("-credential-file: %w", err)
		}
		for _, c := range creds {
			s.Writes.AddCredential(c)
		}
	}
	if err := o.adminSettings(&s); err != nil {
		return daemon.Settings{}, err
	}
	if o.admin != "" {
		pprofOn := o.pprofOn
		s.HTTP = []daemon.HTTP{{Addr: o.admin, TLS: o.tlsAdminURI != "", Handler: func(p daemon.Parts) http.Handler {
			h := rls.AdminHandler(p.Server, p.Metrics, p.Ready)
			h = rls.NewAdminAPI(p.Server, p.Store, p.Gate, p.Metrics).Handler(h)
			if pprofOn {
				h = daemon.WithPprof(h)
			}
			return h
		}}}
	}
	return s, nil
}

// storeOptions are the Redis store's options; it connects in the
// background.
func (o *options) storeOptions() (redisstore.Options, error) {
	storeOpt := redisstore.Options{
		Addrs:      strings.Split(o.redisAddrs, ","),
		Cluster:    o.cluster,
		Timeout:    o.timeout,
		FlushDelay: o.flushDelay,
	}
	if err := o.redisSec.apply(&storeOpt, os.Getenv); err != nil {
		return storeOpt, err
	}
	return storeOpt, nil
}

// flagsFromEnv sets every flag the command line did not set from its
// environment variable, when that is set: -redis-timeout from
// TOKENGATE_RLS_REDIS_TIMEOUT. The command line wins.
func flagsFromEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		name := envName(f.Name)
		if v, ok := lookup(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", name, v, e)
			}
		}
	})
	return err
}

// envName is the environment variable of a flag: -redis-timeout is
// TOKENGATE_RLS_REDIS_TIMEOUT.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newLogger returns the structured logger -log-level and -log-format ask
// for, writing to w.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", level)
	}
	o := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("-log-format %q: want text or json", format)
}
