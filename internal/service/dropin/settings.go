package dropin

// The drop-in's settings: envoyproxy/ratelimit's environment (its
// settings.Settings), read by ParseSettings into one typed value.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin/rlsxds"
	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// Settings are envoyproxy/ratelimit's environment, with its defaults, as
// the drop-in reads it (ParseSettings), and the few variables of
// tokengate's own (TOKENGATE_*).
type Settings struct {
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
	// drain and drainDelay are -drain's and -drain-delay's, from their
	// environment variables (TOKENGATE_RLS_DRAIN, _DRAIN_DELAY); the
	// delay is 0 by default, as envoyproxy/ratelimit stops at once.
	drain, drainDelay time.Duration
	// serveBadConfig: TOKENGATE_BAD_CONFIG_AT_START=serve.
	serveBadConfig bool
	// limits are TOKENGATE_RLS_MAX_*, runtimeLimits
	// TOKENGATE_RUNTIME_MAX_* (limits.go).
	limits              rls.Limits
	maxConns            int // TOKENGATE_RLS_MAX_CONNECTIONS
	runtimeLimits       rlsyaml.Limits
	logLevel, logFormat string
	notes               []string // settings read but not implemented, for the startup log
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

// secretSettings are the ignored settings whose values may hold a
// credential (an authorization header): their notes never show them.
var secretSettings = map[string]bool{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": true}

// maxDetailedDescriptors bounds TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS:
// each descriptor is 8 series, so a million is already more than a
// Prometheus server should scrape from one target.
const maxDetailedDescriptors = 1000000

// envDuration reads a duration variable: def when unset or empty, never
// negative, and 0 only when zero allows it.
func envDuration(get func(string) (string, bool), name string, def time.Duration, zero bool) (time.Duration, error) {
	v, ok := get(name)
	if !ok || v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d == 0 && !zero {
		return 0, fmt.Errorf("%s=%q: want a positive duration such as 5s", name, v)
	}
	return d, nil
}

// ParseSettings reads the environment (get: os.LookupEnv) as
// envoyproxy/ratelimit's settings do, with its defaults, plus tokengate's
// own variables: TOKENGATE_ALGORITHM, TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS,
// TOKENGATE_BAD_CONFIG_AT_START and TOKENGATE_RLS_DRAIN(_DELAY).
func ParseSettings(get func(string) (string, bool)) (*Settings, error) {
	r := &envReader{get: get}
	e := &Settings{
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
		redisTimeout: r.duration("REDIS_TIMEOUT", daemon.DefaultRedisTimeout),
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
	var err error
	if v := r.str("TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS", ""); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxDetailedDescriptors {
			return nil, fmt.Errorf("TOKENGATE_DETAILED_METRIC_MAX_DESCRIPTORS=%q: want a number of descriptors from 0 to %d", v, maxDetailedDescriptors)
		}
		e.detailedMax = n
	}
	if e.drain, err = envDuration(get, "TOKENGATE_RLS_DRAIN", 5*time.Second, false); err != nil {
		return nil, err
	}
	if e.drainDelay, err = envDuration(get, "TOKENGATE_RLS_DRAIN_DELAY", 0, true); err != nil {
		return nil, err
	}
	if err := e.readLimits(get); err != nil {
		return nil, err
	}
	switch v := r.str("TOKENGATE_BAD_CONFIG_AT_START", "exit"); v {
	case "exit", "":
	case "serve":
		e.serveBadConfig = true
	default:
		return nil, fmt.Errorf("TOKENGATE_BAD_CONFIG_AT_START=%q: want exit or serve", v)
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
		if secretSettings[s.name] && ok && v != "" {
			shown = "(set, not shown)"
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

// storeOptions are the Redis settings as redisstore.Options.
func (e *Settings) storeOptions() (redisstore.Options, error) {
	o := redisstore.Options{Timeout: e.redisTimeout, Network: e.redisSocket, FlushDelay: 20 * time.Microsecond}
	urls := strings.Split(e.redisURL, ",")
	switch e.redisType {
	case "CLUSTER":
		o.Cluster = true
	case "SENTINEL":
		// envoyproxy/ratelimit's form: "master,sentinel1:port,sentinel2:port".
		if len(urls) < 2 {
			return o, fmt.Errorf("REDIS_URL=%q: REDIS_TYPE=sentinel wants the master's name, then the Sentinels' addresses", RedactURL(e.redisURL))
		}
		o.SentinelMaster, urls = urls[0], urls[1:]
		o.SentinelUsername, o.SentinelPassword = splitAuth(e.redisSentinelAuth)
	}
	o.Username, o.Password = splitAuth(e.redisAuth)
	for i, u := range urls {
		// radix's URL form, which envoyproxy/ratelimit accepts too:
		// redis://[user:password@]host:port[/0]; rediss:// is TLS.
		if !strings.HasPrefix(u, "redis://") && !strings.HasPrefix(u, "rediss://") {
			if strings.Contains(u, "@") {
				// Not an address: perhaps credentials without the
				// scheme, which would reach the connection errors.
				return o, fmt.Errorf("REDIS_URL=%q: credentials need the form redis://user:password@host:port", RedactURL(u))
			}
			continue
		}
		pu, err := url.Parse(u)
		if err != nil {
			// url.Error quotes the whole URL, password included.
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err
			}
			return o, fmt.Errorf("REDIS_URL=%q: %v", RedactURL(u), err)
		}
		if db := strings.Trim(pu.Path, "/"); db != "" && db != "0" {
			return o, fmt.Errorf("REDIS_URL=%q: database %s: tokengate-rls uses database 0 only", RedactURL(e.redisURL), db)
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

// RedactURL is REDIS_URL as the logs and errors show it: each of its
// comma-separated parts with the password of its user information
// ("redis://user:password@host:port") replaced by "xxxxx", as
// url.URL.Redacted does; a part that is not a URL but holds '@' is
// shown as "xxxxx@" and what follows the last '@'.
func RedactURL(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		at := strings.LastIndex(p, "@")
		if at < 0 {
			continue
		}
		if u, err := url.Parse(p); err == nil && u.User != nil && u.Host != "" {
			parts[i] = u.Redacted()
			continue
		}
		scheme := ""
		if j := strings.Index(p, "://"); j >= 0 && j < at {
			scheme = p[:j+3]
		}
		parts[i] = scheme + "xxxxx@" + p[at+1:]
	}
	return strings.Join(parts, ",")
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
func (e *Settings) slogLevel() string {
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

// xdsOptions are the xDS client's, with its connection to
// CONFIG_GRPC_XDS_SERVER_URL (TLS with CONFIG_GRPC_XDS_SERVER_USE_TLS: the
// server verified against CONFIG_GRPC_XDS_SERVER_TLS_CACERT, the client
// certificate CONFIG_GRPC_XDS_CLIENT_TLS_CERT/KEY).
func (e *Settings) xdsOptions(opt rls.DropinOptions) (rlsxds.Options, *grpc.ClientConn, error) {
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
