package main

// The drop-in for envoyproxy/ratelimit (docs/dropin.md): started as
// "ratelimit" (the image's /bin/ratelimit, the command Envoy Gateway and
// Istio's sample run), tokengate-rls reads that project's environment
// instead of flags, its YAML runtime directory or its xDS source, and
// serves its listeners, health check and answers.

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/service/dropin/rlsxds"
	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// isRatelimit reports whether the program was started under
// envoyproxy/ratelimit's name.
func isRatelimit(arg0 string) bool { return filepath.Base(arg0) == "ratelimit" }

// ratelimitEnv is envoyproxy/ratelimit's environment, with its defaults.
type ratelimitEnv struct {
	host, grpcHost, debugHost string
	port, grpcPort, debugPort int

	grpcTLS                       bool
	grpcCert, grpcKey, grpcCA     string
	grpcClientSAN                 string
	configType                    string // FILE or GRPC_XDS_SOTW
	runtimeRoot, runtimeSub       string
	runtimeApp                    string
	ignoreDot, watchRoot          bool
	forceStart, healthyWithConfig bool

	xdsURL, xdsNode                    string
	xdsTLS                             bool
	xdsCert, xdsKey, xdsCA, xdsSAN     string
	xdsRetry, xdsBackoffMax            time.Duration
	redisSocket, redisType, redisURL   string
	redisAuth, redisSentinelAuth       string
	redisTLS, redisTLSSkipVerify       bool
	redisTLSCert, redisTLSKey, redisCA string
	redisTimeout                       time.Duration

	prometheus               bool
	prometheusAddr, promPath string
	headers                  *rls.HeaderNames
	cacheKeyPrefix           string
	globalShadow             bool
	algorithm                rls.Algorithm
	detailedMax              int // TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS
	logLevel, logFormat      string
	notes                    []string // settings read but not implemented, for the startup log
}

// envReader reads typed variables and collects the first error.
type envReader struct {
	get func(string) (string, bool)
	err error
}

func (r *envReader) str(name, def string) string {
	if v, ok := r.get(name); ok {
		return v
	}
	return def
}

func (r *envReader) boolean(name string, def bool) bool {
	v, ok := r.get(name)
	if !ok || v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("%s=%q: want true or false", name, v)
	}
	return b
}

func (r *envReader) integer(name string, def int) int {
	v, ok := r.get(name)
	if !ok || v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if (err != nil || n < 0 || n > 65535) && r.err == nil {
		r.err = fmt.Errorf("%s=%q: want a port number", name, v)
	}
	return n
}

func (r *envReader) duration(name string, def time.Duration) time.Duration {
	v, ok := r.get(name)
	if !ok || v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if (err != nil || d <= 0) && r.err == nil {
		r.err = fmt.Errorf("%s=%q: want a positive duration such as 25ms", name, v)
	}
	return d
}

// refused are envoyproxy/ratelimit's settings that would change decisions
// if ignored: a value other than the default (second) is an error.
var refused = []struct{ name, def, why string }{
	{"BACKEND_TYPE", "redis", "only Redis is supported"},
	{"REDIS_PERSECOND", "false", "one Redis for every unit; per-second limits cannot go to another"},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", "over-limit calls always count in fixed windows"},
	{"QUOTA_MODE", "false", "quota mode is not supported"},
	{"MERGE_DOMAIN_CONFIG", "false", "a domain must be in one file"},
	{"GRPC_UDS", "", "the gRPC listener is TCP (GRPC_HOST, GRPC_PORT)"},
	{"RESPONSE_DYNAMIC_METADATA", "false", "no dynamic metadata is returned"},
}

// ignored are settings read and not implemented that do not change
// decisions: named in the startup log when their value (or, unset, their
// default def) is not off, which asks for nothing.
var ignored = []struct{ name, def, off, what string }{
	{"USE_STATSD", "true", "false", "statsd is not supported; metrics are Prometheus on DEBUG_PORT /metrics (and PROMETHEUS_ADDR with USE_PROMETHEUS)"},
	{"USE_DOG_STATSD", "false", "false", "statsd is not supported"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", "0", "no local over-limit cache (the same decisions, from Redis)"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "300", "300", "fixed-window keys expire at the end of their window"},
	{"NEAR_LIMIT_RATIO", "0.8", "0.8", "there is no near-limit statistic"},
	{"REDIS_POOL_SIZE", "10", "10", "one pipelined connection per Redis node"},
	{"REDIS_PIPELINE_WINDOW", "0", "0", "writes are batched under load (-redis-flush-delay)"},
	{"REDIS_PIPELINE_LIMIT", "0", "0", "writes are batched under load (-redis-flush-delay)"},
	{"TRACING_ENABLED", "false", "false", "no tracing"},
	{"GRPC_MAX_CONNECTION_AGE", "24h", "24h", "connections are not aged"},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1h", "1h", "connections are not aged"},
	{"EXTRA_TAGS", "", "", "no statsd tags"},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false", "false", "health follows PING"},
	{"REDIS_CLOSE_CONNECTION_ON_READONLY_ERROR", "false", "false", "rueidis follows a failover by itself"},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", "3s", "reconnects follow XDS_CLIENT_BACKOFF_INITIAL_INTERVAL and _MAX_INTERVAL"},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "", "", "the xDS node carries only its id"},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", "", "no extra xDS headers"},
}

// maxDetailedDescriptors bounds TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS:
// each descriptor is 8 series, so a million is already more than a
// Prometheus server should scrape from one target.
const maxDetailedDescriptors = 1000000

// parseRatelimitEnv reads the environment as envoyproxy/ratelimit's
// settings do, with its defaults, plus TOKENGATE_ALGORITHM.
func parseRatelimitEnv(get func(string) (string, bool)) (*ratelimitEnv, error) {
	r := &envReader{get: get}
	e := &ratelimitEnv{
		host: r.str("HOST", "0.0.0.0"), port: r.integer("PORT", 8080),
		grpcHost: r.str("GRPC_HOST", "0.0.0.0"), grpcPort: r.integer("GRPC_PORT", 8081),
		debugHost: r.str("DEBUG_HOST", "0.0.0.0"), debugPort: r.integer("DEBUG_PORT", 6070),
		grpcTLS: r.boolean("GRPC_SERVER_USE_TLS", false), grpcCert: r.str("GRPC_SERVER_TLS_CERT", ""),
		grpcKey: r.str("GRPC_SERVER_TLS_KEY", ""), grpcCA: r.str("GRPC_CLIENT_TLS_CACERT", ""),
		grpcClientSAN: r.str("GRPC_CLIENT_TLS_SAN", ""),
		configType:    strings.ToUpper(r.str("CONFIG_TYPE", "FILE")),
		runtimeRoot:   r.str("RUNTIME_ROOT", "/srv/runtime_data/current"), runtimeSub: r.str("RUNTIME_SUBDIRECTORY", ""),
		runtimeApp: r.str("RUNTIME_APPDIRECTORY", "config"), ignoreDot: r.boolean("RUNTIME_IGNOREDOTFILES", false),
		watchRoot: r.boolean("RUNTIME_WATCH_ROOT", true), forceStart: r.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false),
		healthyWithConfig: r.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false),
		xdsURL:            r.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"), xdsNode: r.str("CONFIG_GRPC_XDS_NODE_ID", "default"),
		xdsTLS: r.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false), xdsCert: r.str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", ""),
		xdsKey: r.str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", ""), xdsCA: r.str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", ""),
		xdsSAN:        r.str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", ""),
		xdsRetry:      r.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10*time.Second),
		xdsBackoffMax: r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", 60*time.Second),
		redisSocket:   strings.ToLower(r.str("REDIS_SOCKET_TYPE", "unix")), redisType: strings.ToUpper(r.str("REDIS_TYPE", "SINGLE")),
		redisURL: r.str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"), redisAuth: r.str("REDIS_AUTH", ""),
		redisSentinelAuth: r.str("REDIS_SENTINEL_AUTH", ""),
		redisTLS:          r.boolean("REDIS_TLS", false), redisTLSSkipVerify: r.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false),
		redisTLSCert: r.str("REDIS_TLS_CLIENT_CERT", ""), redisTLSKey: r.str("REDIS_TLS_CLIENT_KEY", ""),
		redisCA: r.str("REDIS_TLS_CACERT", ""),
		// Not envoyproxy/ratelimit's 10 s: a failing Redis costs a call
		// tens of milliseconds, and the call is answered UNAVAILABLE.
		redisTimeout: r.duration("REDIS_TIMEOUT", defaultRedisTimeout),
		prometheus:   r.boolean("USE_PROMETHEUS", false), prometheusAddr: r.str("PROMETHEUS_ADDR", ":9090"),
		promPath: r.str("PROMETHEUS_PATH", "/metrics"), cacheKeyPrefix: r.str("CACHE_KEY_PREFIX", ""),
		globalShadow: r.boolean("SHADOW_MODE", false),
		logLevel:     strings.ToLower(r.str("LOG_LEVEL", "warn")), logFormat: strings.ToLower(r.str("LOG_FORMAT", "text")),
	}
	if r.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false) {
		e.headers = &rls.HeaderNames{Limit: r.str("LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
			Remaining: r.str("LIMIT_REMAINING_HEADER", "RateLimit-Remaining"), Reset: r.str("LIMIT_RESET_HEADER", "RateLimit-Reset")}
	}
	if r.err != nil {
		return nil, r.err
	}
	switch a := r.str("TOKENGATE_ALGORITHM", "token_bucket"); a {
	case "token_bucket", "":
		e.algorithm = rls.TokenBucket
	case "fixed_window":
		e.algorithm = rls.FixedWindow
	default:
		return nil, fmt.Errorf("TOKENGATE_ALGORITHM=%q: want token_bucket or fixed_window", a)
	}
	e.detailedMax = rls.DefaultDetailedDescriptors
	if v := r.str("TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS", ""); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxDetailedDescriptors {
			return nil, fmt.Errorf("TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS=%q: want a number of descriptors from 0 to %d", v, maxDetailedDescriptors)
		}
		e.detailedMax = n
	}
	for _, s := range refused {
		if v, ok := get(s.name); ok && v != "" && !strings.EqualFold(v, s.def) {
			return nil, fmt.Errorf("%s=%q is not supported by tokengate-rls: %s (docs/dropin.md#environment)", s.name, v, s.why)
		}
	}
	for _, s := range ignored {
		v, ok := get(s.name)
		shown := v
		if !ok || v == "" {
			v, shown = s.def, s.def+" (its default)"
		}
		if !strings.EqualFold(v, s.off) {
			e.notes = append(e.notes, s.name+"="+shown+": "+s.what)
		}
	}
	switch e.configType {
	case "FILE", "GRPC_XDS_SOTW":
	default:
		return nil, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", e.configType)
	}
	switch e.redisSocket {
	case "tcp", "unix":
	default:
		return nil, fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", e.redisSocket)
	}
	switch e.redisType {
	case "SINGLE", "CLUSTER", "SENTINEL":
	default:
		return nil, fmt.Errorf("REDIS_TYPE=%q: want single, cluster or sentinel", e.redisType)
	}
	switch e.logLevel {
	case "trace", "debug", "info", "warn", "warning", "error", "fatal", "panic":
	default:
		return nil, fmt.Errorf("LOG_LEVEL=%q: want debug, info, warn or error", e.logLevel)
	}
	if e.logFormat != "text" && e.logFormat != "json" {
		return nil, fmt.Errorf("LOG_FORMAT=%q: want text or json", e.logFormat)
	}
	if e.grpcTLS && (e.grpcCert == "" || e.grpcKey == "") {
		return nil, errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}
	return e, nil
}

// storeOptions are the Redis settings as rls.StoreOptions.
func (e *ratelimitEnv) storeOptions() (rls.StoreOptions, error) {
	o := rls.StoreOptions{Timeout: e.redisTimeout, Network: e.redisSocket, FlushDelay: 20 * time.Microsecond}
	urls := strings.Split(e.redisURL, ",")
	switch e.redisType {
	case "CLUSTER":
		o.Cluster = true
	case "SENTINEL":
		// envoyproxy/ratelimit's form: "master,sentinel1:port,sentinel2:port".
		if len(urls) < 2 {
			return o, fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=sentinel wants the master's name, then the Sentinels' addresses", e.redisURL)
		}
		o.SentinelMaster, urls = urls[0], urls[1:]
		o.SentinelUsername, o.SentinelPassword = splitAuth(e.redisSentinelAuth)
	}
	o.Username, o.Password = splitAuth(e.redisAuth)
	for i, u := range urls {
		// radix's URL form, which envoyproxy/ratelimit accepts too:
		// redis://[user:password@]host:port[/0]; rediss:// is TLS.
		if !strings.HasPrefix(u, "redis://") && !strings.HasPrefix(u, "rediss://") {
			continue
		}
		pu, err := url.Parse(u)
		if err != nil {
			return o, fmt.Errorf("REDIS_URL: %w", err)
		}
		if db := strings.Trim(pu.Path, "/"); db != "" && db != "0" {
			return o, fmt.Errorf("REDIS_URL=%q: database %s: tokengate-rls uses database 0 only", e.redisURL, db)
		}
		if pu.User != nil {
			o.Username = pu.User.Username()
			o.Password, _ = pu.User.Password()
		}
		if pu.Scheme == "rediss" {
			e.redisTLS = true
		}
		urls[i] = pu.Host
	}
	o.Addrs = urls
	if e.redisTLS {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: e.redisTLSSkipVerify} //nolint:gosec // REDIS_TLS_SKIP_HOSTNAME_VERIFICATION asks for it
		if e.redisCA != "" {
			pool, err := loadPool(e.redisCA)
			if err != nil {
				return o, fmt.Errorf("REDIS_TLS_CACERT: %w", err)
			}
			cfg.RootCAs = pool
		}
		if e.redisTLSCert != "" {
			c, err := tls.LoadX509KeyPair(e.redisTLSCert, e.redisTLSKey)
			if err != nil {
				return o, fmt.Errorf("REDIS_TLS_CLIENT_CERT: %w", err)
			}
			cfg.Certificates = []tls.Certificate{c}
		}
		o.TLS = cfg
	}
	return o, nil
}

// splitAuth splits REDIS_AUTH: "password" or "user:password".
func splitAuth(s string) (user, pass string) {
	if u, p, ok := strings.Cut(s, ":"); ok {
		return u, p
	}
	return "", s
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate", path)
	}
	return pool, nil
}

// slogLevel is LOG_LEVEL as a slog level name: logrus's trace is debug,
// its fatal and panic are error.
func (e *ratelimitEnv) slogLevel() string {
	switch e.logLevel {
	case "trace":
		return "debug"
	case "warning":
		return "warn"
	case "fatal", "panic":
		return "error"
	}
	return e.logLevel
}

// dropin is the drop-in's state, built by runRatelimit's steps.
type dropin struct {
	env     *ratelimitEnv
	log     *slog.Logger
	opt     rls.DropinOptions
	dir     string      // the runtime directory (CONFIG_TYPE=FILE)
	cfg     *rls.Config // the first configuration
	metrics *rls.Metrics
	store   *rls.Store
	srv     *rls.Server
	ready   *rls.Readiness
	tls     *rls.ServerTLS // nil without GRPC_SERVER_USE_TLS
	gs      *grpc.Server
	gl      net.Listener
	https   []*http.Server
	errc    chan error // a server that stopped serving
}

// runRatelimit is run for the drop-in: it serves until ctx is done, then
// fails its health checks and drains.
func runRatelimit(ctx context.Context, get func(string) (string, bool), logw io.Writer, listening chan<- [2]string) error {
	e, err := parseRatelimitEnv(get)
	if err != nil {
		return err
	}
	logger, err := newLogger(logw, e.slogLevel(), e.logFormat)
	if err != nil {
		return err
	}
	for _, n := range e.notes {
		logger.Warn("not implemented: " + n)
	}
	d := &dropin{env: e, log: logger, errc: make(chan error, 4),
		opt: rls.DropinOptions{Algorithm: e.algorithm, CacheKeyPrefix: e.cacheKeyPrefix, Headers: e.headers, GlobalShadow: e.globalShadow}}
	if err := d.firstConfig(); err != nil {
		return err
	}
	if err := d.openStore(); err != nil {
		return err
	}
	defer d.store.Close()
	defer d.ready.Stop()
	if err := d.grpcServer(); err != nil {
		return err
	}
	started, stop, err := d.followConfig(ctx)
	if err != nil || !started {
		return err
	}
	defer stop()
	httpAddr, err := d.serve()
	if err != nil {
		return err
	}
	if d.tls != nil {
		go d.watchTLS(ctx)
	}
	logger.Info("envoyproxy/ratelimit drop-in serving", "domains", len(d.cfg.Domains()), "config_type", e.configType,
		"algorithm", algorithmName(e.algorithm), "grpc", d.gl.Addr().String(), "tls", d.tls != nil, "http", httpAddr,
		"redis_type", e.redisType, "redis", e.redisURL, "redis_timeout", e.redisTimeout)
	if listening != nil {
		listening <- [2]string{d.gl.Addr().String(), httpAddr}
	}
	return d.wait(ctx)
}

// firstConfig reads the first configuration: the runtime directory must
// load (a bad file stops the start); with xDS it is empty until the
// server sends one.
func (d *dropin) firstConfig() (err error) {
	d.dir = filepath.Join(d.env.runtimeRoot, d.env.runtimeSub, d.env.runtimeApp)
	if d.env.configType == "FILE" {
		d.cfg, err = loadRuntime(d.dir, d.env.ignoreDot, d.opt)
	} else {
		d.cfg, err = rls.NewDropinConfig(nil, d.opt)
	}
	return err
}

// openStore connects Redis, with the metrics, the rate-limit server and
// the readiness (Redis answers PING) the health checks follow.
func (d *dropin) openStore() error {
	storeOpt, err := d.env.storeOptions()
	if err != nil {
		return err
	}
	d.metrics = rls.NewMetrics(d.cfg)
	d.metrics.SetDetailedLimit(d.env.detailedMax)
	d.metrics.SetErrorLog(rls.NewErrorLog(d.log, errorLogInterval, nil))
	storeOpt.Observe = d.metrics.ObserveRedis
	if d.store, err = rls.NewStore(storeOpt); err != nil {
		return err
	}
	d.srv = rls.NewServer(d.cfg, d.store, d.metrics)
	d.ready = rls.NewReadiness(d.store, time.Second, func(msg string) { d.log.Warn(msg) })
	d.holdForConfig(d.cfg)
	return nil
}

// holdForConfig keeps the service unhealthy, with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, while c has no domain.
func (d *dropin) holdForConfig(c *rls.Config) {
	d.ready.Hold(d.env.healthyWithConfig && len(c.Domains()) == 0)
}

// grpcServer builds the gRPC server: RLS, over TLS with
// GRPC_SERVER_USE_TLS, and the health service, which answers for
// "ratelimit" too.
func (d *dropin) grpcServer() error {
	opts := []grpc.ServerOption{grpc.StatsHandler(d.metrics.StatsHandler())}
	if d.env.grpcTLS {
		var err error
		d.tls, err = rls.NewServerTLS(rls.TLSFiles{Cert: d.env.grpcCert, Key: d.env.grpcKey,
			ClientCA: d.env.grpcCA, ClientSAN: d.env.grpcClientSAN})
		if err != nil {
			return fmt.Errorf("GRPC_SERVER_TLS_CERT, _KEY or GRPC_CLIENT_TLS_CACERT: %w", err)
		}
		opts = append(opts, grpc.Creds(d.tls.Credentials(d.metrics)))
	}
	d.gs = rls.NewGRPCServer(d.srv, rls.DefaultStreamWorkers, opts...)
	rls.RegisterHealth(d.gs, d.ready, "ratelimit")
	return nil
}

// setConfig puts a new configuration in force.
func (d *dropin) setConfig(c *rls.Config) {
	d.srv.SetConfig(c)
	d.holdForConfig(c)
}

// followConfig starts following the configuration source: the runtime
// directory's watch or the xDS client. Without
// FORCE_START_WITHOUT_INITIAL_CONFIG it waits, as envoyproxy/ratelimit,
// for xDS's first configuration; started is false when ctx ends first.
// stop releases the xDS connection.
func (d *dropin) followConfig(ctx context.Context) (started bool, stop func(), err error) {
	if d.env.configType == "FILE" {
		logf := func(format string, args ...any) { d.log.Warn(fmt.Sprintf(format, args...)) }
		go watchRuntime(ctx, d.env.runtimeRoot, d.dir, d.env.ignoreDot, d.opt, d.setConfig, logf)
		return true, func() {}, nil
	}
	xo, conn, err := d.env.xdsOptions(d.opt)
	if err != nil {
		return false, nil, err
	}
	first := make(chan struct{})
	var once sync.Once
	xo.Set = func(c *rls.Config) { d.setConfig(c); once.Do(func() { close(first) }) }
	xo.Logf = func(msg string) { d.log.Warn("xds: " + msg) }
	go rlsxds.Run(ctx, xo)
	if !d.env.forceStart {
		select {
		case <-first:
		case <-ctx.Done():
			conn.Close()
			return false, nil, nil
		}
	}
	return true, func() { conn.Close() }, nil
}

// serve opens the listeners and serves: gRPC on GRPC_HOST:GRPC_PORT,
// /healthcheck and /json on HOST:PORT, /metrics and pprof on
// DEBUG_HOST:DEBUG_PORT, and with USE_PROMETHEUS the metrics on
// PROMETHEUS_ADDR at PROMETHEUS_PATH. It returns HOST:PORT's address.
func (d *dropin) serve() (string, error) {
	e := d.env
	admin := rls.AdminHandler(d.srv, d.metrics, d.ready)
	httpMux := http.NewServeMux()
	httpMux.Handle("/healthcheck", healthcheck(d.ready))
	httpMux.Handle("/json", admin)
	debugMux := http.NewServeMux()
	debugMux.Handle("/metrics", admin)
	debugMux.Handle("/", withPprof(http.NotFoundHandler()))
	addrs := []string{net.JoinHostPort(e.grpcHost, strconv.Itoa(e.grpcPort)),
		net.JoinHostPort(e.host, strconv.Itoa(e.port)), net.JoinHostPort(e.debugHost, strconv.Itoa(e.debugPort))}
	handlers := []http.Handler{nil, httpMux, debugMux}
	if e.prometheus {
		pm := http.NewServeMux()
		pm.HandleFunc(e.promPath, func(w http.ResponseWriter, r *http.Request) {
			r2 := r.Clone(r.Context())
			r2.URL.Path = "/metrics" // the admin handler's path for them
			admin.ServeHTTP(w, r2)
		})
		addrs, handlers = append(addrs, e.prometheusAddr), append(handlers, pm)
	}
	var ls []net.Listener
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, l := range ls {
				l.Close()
			}
			return "", err
		}
		ls = append(ls, l)
	}
	d.gl = ls[0]
	go func() { d.errc <- d.gs.Serve(d.gl) }()
	for i, h := range handlers[1:] {
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
		d.https = append(d.https, hs)
		l := ls[i+1]
		go func() { d.errc <- hs.Serve(l) }()
	}
	return ls[1].Addr().String(), nil
}

// healthcheck is envoyproxy/ratelimit's /healthcheck: 200 "OK" while
// ready (Redis answers, not shutting down, and with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED a domain in force), 500
// otherwise.
func healthcheck(ready *rls.Readiness) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Ready() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "OK")
	})
}

// watchTLS reloads the gRPC listener's certificate, key and client CA
// when the files change, as envoyproxy/ratelimit does; a file missing
// or bad mid-rotation keeps the ones in use (logged once per error).
func (d *dropin) watchTLS(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok, err := d.tls.ReloadIfChanged()
		switch {
		case err != nil && err.Error() != lastErr:
			lastErr = err.Error()
			d.log.Error("TLS files not reloaded: the previous ones stay", "error", err)
		case err == nil:
			lastErr = ""
			if ok {
				d.log.Info("TLS files reloaded", "trigger", "file changed")
			}
		}
	}
}

// wait serves until ctx is done or a server fails; then, as
// envoyproxy/ratelimit, it is unhealthy from SIGTERM on and drains.
func (d *dropin) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case err := <-d.errc:
		d.gs.Stop()
		for _, h := range d.https {
			_ = h.Close()
		}
		return err
	}
	d.ready.Drain()
	d.log.Info("shutting down")
	done := make(chan struct{})
	go func() { d.gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		d.gs.Stop()
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, h := range d.https {
		_ = h.Shutdown(sctx)
	}
	return nil
}

// xdsOptions are the xDS client's, with its connection to
// CONFIG_GRPC_XDS_SERVER_URL (TLS with CONFIG_GRPC_XDS_SERVER_USE_TLS: the
// server verified against CONFIG_GRPC_XDS_SERVER_TLS_CACERT, the client
// certificate CONFIG_GRPC_XDS_CLIENT_TLS_CERT/KEY).
func (e *ratelimitEnv) xdsOptions(opt rls.DropinOptions) (rlsxds.Options, *grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if e.xdsTLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: e.xdsSAN}
		if e.xdsCA != "" {
			pool, err := loadPool(e.xdsCA)
			if err != nil {
				return rlsxds.Options{}, nil, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_TLS_CACERT: %w", err)
			}
			tc.RootCAs = pool
		}
		if e.xdsCert != "" {
			c, err := tls.LoadX509KeyPair(e.xdsCert, e.xdsKey)
			if err != nil {
				return rlsxds.Options{}, nil, fmt.Errorf("CONFIG_GRPC_XDS_CLIENT_TLS_CERT: %w", err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(e.xdsURL, grpc.WithTransportCredentials(creds))
	if err != nil {
		return rlsxds.Options{}, nil, fmt.Errorf("CONFIG_GRPC_XDS_SERVER_URL=%q: %w", e.xdsURL, err)
	}
	return rlsxds.Options{Conn: conn, NodeID: e.xdsNode, Dropin: opt, Backoff: e.xdsRetry, MaxBackoff: e.xdsBackoffMax}, conn, nil
}

func algorithmName(a rls.Algorithm) string {
	if a == rls.FixedWindow {
		return "fixed windows (TOKENGATE_ALGORITHM=fixed_window)"
	}
	return "token buckets"
}

// loadRuntime reads the runtime directory's YAML files into a
// configuration. A directory that does not exist holds no domains.
func loadRuntime(dir string, ignoreDot bool, opt rls.DropinOptions) (*rls.Config, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return rls.NewDropinConfig(nil, opt)
	}
	domains, err := rlsyaml.LoadDir(dir, ignoreDot)
	if err != nil {
		return nil, err
	}
	return rls.NewDropinConfig(domains, opt)
}

// watchRuntime reloads the runtime directory when it changes, as
// envoyproxy/ratelimit's runtime watch does: it polls every second a
// digest of the files' names, sizes, times and the root's symlink target
// (a Kubernetes ConfigMap volume swaps a symlink). A bad configuration is
// logged and the one in force kept.
func watchRuntime(ctx context.Context, root, dir string, ignoreDot bool, opt rls.DropinOptions, set func(*rls.Config), logf func(string, ...any)) {
	last := runtimeDigest(root, dir)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d := runtimeDigest(root, dir)
		if d == last {
			continue
		}
		last = d
		c, err := loadRuntime(dir, ignoreDot, opt)
		if err != nil {
			logf("configuration not reloaded, the one in force is kept: %v", err)
			continue
		}
		set(c)
		logf("configuration reloaded: %d domains", len(c.Domains()))
	}
}

func runtimeDigest(root, dir string) [32]byte {
	h := sha256.New()
	if t, err := os.Readlink(root); err == nil {
		fmt.Fprintf(h, "root->%s\n", t)
	}
	var lines []string
	_ = filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if st, err := os.Stat(path); err == nil {
			lines = append(lines, fmt.Sprintf("%s %d %d", path, st.Size(), st.ModTime().UnixNano()))
		}
		return nil
	})
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(h, l)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
