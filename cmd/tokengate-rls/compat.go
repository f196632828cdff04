package main

// The drop-in for envoyproxy/ratelimit (docs/dropin.md): started as
// "ratelimit" (the image's /bin/ratelimit, the command Envoy Gateway and
// Istio's sample run), tokengate-rls reads that project's environment
// instead of flags, its YAML runtime directory or its xDS source, and
// serves its listeners, health check and answers.

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// isRatelimit reports whether the program was started under
// envoyproxy/ratelimit's name.
func isRatelimit(arg0 string) bool { return filepath.Base(arg0) == "ratelimit" }

// runRatelimit is run for the drop-in: the service's lifecycle
// (daemon.Run) with the settings the environment gives.
func runRatelimit(ctx context.Context, get func(string) (string, bool), logw io.Writer, listening chan<- [2]string) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

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
	s, err := e.settings(logger, hup)
	if err != nil {
		return err
	}
	s.Serving = func(sv daemon.Serving) {
		logger.Info("envoyproxy/ratelimit drop-in serving", "domains", len(sv.Config.Domains()), "config_type", e.configType,
			"algorithm", algorithmName(e.algorithm), "grpc", sv.GRPC, "tls", s.TLS != nil, "http", sv.HTTP[0],
			"redis_type", e.redisType, "redis", e.redisURL, "redis_timeout", e.redisTimeout)
		if listening != nil {
			listening <- [2]string{sv.GRPC, sv.HTTP[0]}
		}
	}
	return daemon.Run(ctx, s)
}

// settings are the service's, from the environment: the rules of the
// runtime directory or of xDS; gRPC on GRPC_HOST:GRPC_PORT, over TLS with
// GRPC_SERVER_USE_TLS, its health service answering for "ratelimit" too;
// /healthcheck and /json on HOST:PORT, /metrics and pprof on
// DEBUG_HOST:DEBUG_PORT and, with USE_PROMETHEUS, the metrics on
// PROMETHEUS_ADDR at PROMETHEUS_PATH.
func (e *ratelimitEnv) settings(logger *slog.Logger, hup <-chan os.Signal) (daemon.Settings, error) {
	opt := rls.DropinOptions{Algorithm: e.algorithm, CacheKeyPrefix: e.cacheKeyPrefix, Headers: e.headers, GlobalShadow: e.globalShadow}
	var rules daemon.Rules
	if e.configType == "FILE" {
		rules = &dropin.Runtime{Root: e.runtimeRoot, Dir: filepath.Join(e.runtimeRoot, e.runtimeSub, e.runtimeApp),
			IgnoreDot: e.ignoreDot, Options: opt, ServeBadAtStart: e.serveBadConfig, Log: logger}
	} else {
		xo, conn, err := e.xdsOptions(opt)
		if err != nil {
			return daemon.Settings{}, err
		}
		rules = &dropin.XDS{Conn: conn, Options: xo, ForceStart: e.forceStart, Log: logger}
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
			mux.Handle("/healthcheck", healthcheck(p.Ready))
			mux.Handle("/json", rls.AdminHandler(p.Server, p.Metrics, p.Ready))
			return mux
		}},
		{Addr: net.JoinHostPort(e.debugHost, strconv.Itoa(e.debugPort)), Handler: func(p daemon.Parts) http.Handler {
			mux := http.NewServeMux()
			mux.Handle("/metrics", rls.AdminHandler(p.Server, p.Metrics, p.Ready))
			mux.Handle("/", withPprof(http.NotFoundHandler()))
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

func algorithmName(a rls.Algorithm) string {
	if a == rls.FixedWindow {
		return "fixed windows (TOKENGATE_ALGORITHM=fixed_window)"
	}
	return "token buckets"
}
