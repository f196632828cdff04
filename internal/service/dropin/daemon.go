package dropin

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// LogLevel is LOG_LEVEL as a slog level name (debug, info, warn, error).
func (e *Settings) LogLevel() string { return e.slogLevel() }

// LogFormat is LOG_FORMAT: text or json.
func (e *Settings) LogFormat() string { return e.logFormat }

// Notes are the settings read and not implemented, for the start's log.
func (e *Settings) Notes() []string { return e.notes }

// Drain returns how long shutdown waits for calls in flight, and before
// that how long the service keeps serving while not ready.
func (e *Settings) Drain() (drain, delay time.Duration) { return e.drain, e.drainDelay }

// SetDrain sets what Drain returns (the command line's -drain and
// -drain-delay, which win over the environment).
func (e *Settings) SetDrain(drain, delay time.Duration) { e.drain, e.drainDelay = drain, delay }

// ServingAttrs are the start's log line's attributes, once the service
// listens.
func (e *Settings) ServingAttrs(sv daemon.Serving) []any {
	return []any{"domains", len(sv.Config.Domains()), "config_type", e.configType,
		"algorithm", algorithmName(e.algorithm), "grpc", sv.GRPC, "tls", e.grpcTLS, "http", sv.HTTP[0],
		"redis_type", e.redisType, "redis", RedactURL(e.redisURL), "redis_timeout", e.redisTimeout}
}

// Daemon returns the service's settings, from the environment: the rules of the
// runtime directory or of xDS; gRPC on GRPC_HOST:GRPC_PORT, over TLS with
// GRPC_SERVER_USE_TLS, its health service answering for "ratelimit" too;
// /healthcheck and /json on HOST:PORT, /metrics and pprof on
// DEBUG_HOST:DEBUG_PORT and, with USE_PROMETHEUS, the metrics on
// PROMETHEUS_ADDR at PROMETHEUS_PATH.
func (e *Settings) Daemon(logger *slog.Logger, hup <-chan os.Signal) (daemon.Settings, error) {
	opt := rls.DropinOptions{Algorithm: e.algorithm, CacheKeyPrefix: e.cacheKeyPrefix, Headers: e.headers, GlobalShadow: e.globalShadow}
	var rules daemon.Rules
	if e.configType == "FILE" {
		rules = &Runtime{Root: e.runtimeRoot, Dir: filepath.Join(e.runtimeRoot, e.runtimeSub, e.runtimeApp),
			IgnoreDot: e.ignoreDot, Options: opt, Limits: e.runtimeLimits, ServeBadAtStart: e.serveBadConfig, Log: logger}
	} else {
		xo, conn, err := e.xdsOptions(opt)
		if err != nil {
			return daemon.Settings{}, err
		}
		rules = &XDS{Conn: conn, Options: xo, ForceStart: e.forceStart, Log: logger}
	}
	storeOpt, err := e.storeOptions()
	if err != nil {
		return daemon.Settings{}, err
	}
	s := daemon.Settings{
		Log:            logger,
		Rules:          rules,
		Store:          storeOpt,
		DetailedLimit:  e.detailedMax,
		GRPC:           net.JoinHostPort(e.grpcHost, strconv.Itoa(e.grpcPort)),
		Workers:        rls.DefaultStreamWorkers,
		Limits:         e.limits,
		MaxConnections: e.maxConns,
		HealthNames:    []string{"ratelimit"},
		HoldWhileEmpty: e.healthyWithConfig,
		// The runtime directory and the TLS files are checked every
		// second, as envoyproxy/ratelimit checks them.
		Poll:       time.Second,
		Hup:        hup,
		DrainDelay: e.drainDelay,
		Drain:      e.drain,
	}
	if e.grpcTLS {
		s.TLS = &rls.TLSFiles{Cert: e.grpcCert, Key: e.grpcKey, ClientCA: e.grpcCA, ClientSAN: e.grpcClientSAN}
		s.TLSNames = "GRPC_SERVER_TLS_CERT, _KEY or GRPC_CLIENT_TLS_CACERT"
	}
	s.HTTP = []daemon.HTTP{
		{Addr: net.JoinHostPort(e.host, strconv.Itoa(e.port)), Handler: func(p daemon.Parts) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("/healthcheck", Healthcheck(p.Ready))
			mux.Handle("/json", rls.AdminHandler(p.Server, p.Metrics, p.Ready))
			return mux
		}},
		{Addr: net.JoinHostPort(e.debugHost, strconv.Itoa(e.debugPort)), Handler: func(p daemon.Parts) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("/metrics", rls.AdminHandler(p.Server, p.Metrics, p.Ready))
			mux.Handle("/", daemon.WithPprof(http.NotFoundHandler()))
			return mux
		}},
	}
	if e.prometheus {
		path := e.promPath
		s.HTTP = append(s.HTTP, daemon.HTTP{Addr: e.prometheusAddr, Handler: func(p daemon.Parts) http.Handler {
			admin := rls.AdminHandler(p.Server, p.Metrics, p.Ready)
			mux := http.NewServeMux()
			mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
				r2 := r.Clone(r.Context())
				r2.URL.Path = "/metrics" // the admin handler's path for them
				admin.ServeHTTP(w, r2)
			})
			return mux
		}})
	}
	return s, nil
}

// Healthcheck is envoyproxy/ratelimit's /healthcheck: 200 "OK" while
// ready (Redis answers, not shutting down, and with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED a domain in force), 500
// otherwise.
func Healthcheck(ready *rls.Readiness) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Ready() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "OK")
	})
}

func algorithmName(a rls.Algorithm) string {
	if a == rls.FixedWindow {
		return "fixed windows (TOKENGATE_ALGORITHM=fixed_window)"
	}
	return "token buckets"
}
