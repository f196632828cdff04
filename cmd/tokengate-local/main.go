// Command tokengate-local serves HTTP through the tokengate filter on a local
// proxy-wasm host (wazero), with the plugin configuration of envoy.yaml, so
// a configuration can be tried without Envoy. It is what `make run` starts.
//
//	tokengate-local [-wasm build/tokengate.wasm] [-envoy envoy.yaml | -config rules.json]
//	                [-listen 127.0.0.1:10000] [-admin 127.0.0.1:10001] [-workers N]
//	                [-upstream URL] [-kong] [-log-level info]
//	tokengate-local -check FILE [-wasm build/tokengate.wasm] [-kong]
//
// Requests to -listen go through the filter to an embedded echo upstream (or
// -upstream). The admin listener serves /stats and /stats/prometheus (the
// filter's metrics in Prometheus text format), /shared_data (the shared-data
// store) and /ready. SIGINT or SIGTERM shuts down cleanly.
//
// -check validates FILE without serving and exits 0 or 1: a plugin
// configuration (JSON), an Envoy bootstrap (every wasm filter in it) or
// Istio WasmPlugin resources, each given to the real module, so the
// messages are the filter's own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/envoyconf"
	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "tokengate-local:", err)
		}
		os.Exit(1)
	}
}

// settings are the parsed flags.
type settings struct {
	wasm, envoy, config, plugin string
	check                       string
	listen, admin, upstream     string
	workers                     int
	bufferLimit                 int
	kong, noFilter, stream      bool
	showIdentities              bool
	logLevel                    string
}

func parseFlags(args []string, stderr io.Writer) (settings, error) {
	var s settings
	fs := flag.NewFlagSet("tokengate-local", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.wasm, "wasm", "build/tokengate.wasm", "the filter module (`make build` writes it)")
	fs.StringVar(&s.envoy, "envoy", "envoy.yaml", "Envoy bootstrap to take the wasm filter's configuration from")
	fs.StringVar(&s.config, "config", "", "plugin configuration JSON file to use instead of -envoy")
	fs.StringVar(&s.check, "check", "", "validate this file (plugin JSON, envoy.yaml or Istio WasmPlugin) with the module, print the result and exit")
	fs.StringVar(&s.plugin, "plugin", "", "config.name of the wasm filter in -envoy, when it has several")
	fs.StringVar(&s.listen, "listen", "127.0.0.1:10000", "address to serve HTTP through the filter on")
	fs.StringVar(&s.admin, "admin", "127.0.0.1:10001", "admin address (/stats, /shared_data, /ready); empty to disable")
	fs.BoolVar(&s.showIdentities, "show-identities", false, "show API keys, subjects, addresses and the slot seed in /shared_data (redacted by default)")
	fs.IntVar(&s.workers, "workers", 0, "worker VMs (default: number of CPUs, at least 2)")
	fs.IntVar(&s.bufferLimit, "buffer-limit", 0, "bytes of a request body the host buffers for the filter, more answered 413, as Envoy's per_connection_buffer_limit_bytes (default 1048576, Envoy's)")
	fs.StringVar(&s.upstream, "upstream", "", "forward allowed requests to this URL instead of the embedded echo upstream, or \"cluster\": to the route's cluster in -envoy")
	fs.BoolVar(&s.stream, "stream", false, "pass upstream responses through as they arrive, one proxy_on_response_body per piece, as Envoy does (default: buffered)")
	fs.BoolVar(&s.noFilter, "no-filter", false, "serve the upstream without the module (a baseline for benchmarks)")
	fs.BoolVar(&s.kong, "kong", false, "emulate Kong ngx_wasm_module (CAS semantics, properties) instead of Envoy")
	fs.StringVar(&s.logLevel, "log-level", "info", "lowest filter log level printed: trace, debug, info, warning, error, critical")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	return s, nil
}

func parseLevel(s string) (wasmhost.LogLevel, error) {
	for l := wasmhost.LogTrace; l <= wasmhost.LogCritical; l++ {
		if s == l.String() || (s == "warn" && l == wasmhost.LogWarn) {
			return l, nil
		}
	}
	return 0, fmt.Errorf("-log-level: unknown level %q", s)
}

// local is what the flags and the configuration source say of the local
// host: the proxy-wasm ABI host that runs the module, and the HTTP proxy
// in front of it (the connection manager, jwt_authn, the upstream).
type local struct {
	host  wasmhost.Options
	proxy proxy.Options
}

// loadPlugin returns the options the configuration source describes and a
// one-line description of where they came from.
func loadPlugin(s settings) (local, string, error) {
	var lo local
	opts := &lo.host
	if s.config != "" {
		cfg, err := os.ReadFile(s.config)
		if err != nil {
			return lo, "", err
		}
		opts.PluginConfig = cfg
		opts.PluginName = s.plugin
		return lo, s.config, nil
	}
	doc, err := os.ReadFile(s.envoy)
	if err != nil {
		return lo, "", fmt.Errorf("%w (or pass -config file.json)", err)
	}
	p, err := envoyconf.Find(doc, s.plugin)
	if err != nil {
		return lo, "", fmt.Errorf("%s: %w", s.envoy, err)
	}
	opts.PluginConfig, opts.VMConfig = p.Configuration, p.VMConfiguration
	opts.PluginName, opts.RootID, opts.VMID = p.Name, p.RootID, p.VMID
	routeUpstream := ""
	clusters, err := envoyconf.Clusters(doc)
	if err != nil {
		return lo, "", fmt.Errorf("%s: %w", s.envoy, err)
	}
	opts.Clusters = map[string]wasmhost.Cluster{}
	for name, c := range clusters {
		opts.Clusters[name] = wasmhost.Cluster{Address: c.Address, HTTP2: c.HTTP2}
	}
	if s.upstream == "cluster" {
		name, ok := envoyconf.RouteCluster(p)
		c, found := clusters[name]
		if !ok || !found {
			return lo, "", fmt.Errorf("%s: -upstream cluster: the route's cluster %q has no socket_address endpoint", s.envoy, name)
		}
		lo.proxy.Upstream = proxy.ProxyTo(&url.URL{Scheme: "http", Host: c.Address})
		routeUpstream = ", proxying to cluster " + name + " at " + c.Address
	}
	if p.Manager != nil {
		m, err := envoyconf.ConnectionManager(p.ManagerPath, p.Manager)
		if err != nil {
			return lo, "", fmt.Errorf("%s: %w", s.envoy, err)
		}
		lo.proxy.Manager = &proxy.Manager{
			NormalizePath: m.NormalizePath, MergeSlashes: m.MergeSlashes, EscapedSlashes: m.EscapedSlashes,
			UseRemoteAddress: m.UseRemoteAddress, XFFNumTrustedHops: m.XFFNumTrustedHops, SkipXFFAppend: m.SkipXFFAppend,
			MaxHeadersKB: m.MaxHeadersKB, MaxHeadersCount: m.MaxHeadersCount,
		}
		// Envoy's stream_idle_timeout: left out, its default; 0s, none.
		if d := m.StreamIdleTimeout; d != nil {
			lo.proxy.StreamIdleTimeout = *d
			if *d == 0 {
				lo.proxy.StreamIdleTimeout = -1
			}
		}
		lo.proxy.RequestTimeout = m.RequestTimeout
		j, err := envoyconf.JWTAuthnBefore(p)
		if err != nil {
			return lo, "", fmt.Errorf("%s: %w", s.envoy, err)
		}
		if lo.proxy.JWTAuthn, err = jwtAuthn(j); err != nil {
			return lo, "", fmt.Errorf("%s: %w", s.envoy, err)
		}
	}
	return lo, s.envoy + " (" + p.Path + ")" + routeUpstream, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	s, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	level, err := parseLevel(s.logLevel)
	if err != nil {
		return err
	}
	if s.check != "" {
		wasm, err := os.ReadFile(s.wasm)
		if err != nil {
			return fmt.Errorf("%w (run `make build` first)", err)
		}
		return check(ctx, s.check, wasm, s.kong, stdout)
	}
	lo, source, upstream, err := hostOptions(s, level, stderr)
	if err != nil {
		return err
	}
	h, err := wasmhost.New(ctx, lo.host)
	if err != nil {
		return err
	}
	defer h.Close(context.Background())
	return serve(ctx, s, h, lo, source, upstream, stdout)
}

// hostOptions builds the local host's options from the flags: the plugin
// and its configuration, the module, and the upstream (described for the
// start-up lines).
func hostOptions(s settings, level wasmhost.LogLevel, stderr io.Writer) (lo local, source, upstream string, err error) {
	lo, source, err = loadPlugin(s)
	if err != nil {
		return lo, "", "", err
	}
	opts := &lo.host
	opts.Wasm, err = os.ReadFile(s.wasm)
	if err != nil {
		return lo, "", "", fmt.Errorf("%w (run `make build` first)", err)
	}
	opts.Workers, opts.Kong, opts.MinLogLevel = s.workers, s.kong, level
	lo.proxy.StreamResponses = s.stream
	if s.bufferLimit < 0 {
		return lo, "", "", fmt.Errorf("-buffer-limit: want a number of bytes (0: Envoy's default), got %d", s.bufferLimit)
	}
	lo.proxy.BufferLimit = s.bufferLimit
	opts.LogSink = func(l wasmhost.LogLevel, msg string) { fmt.Fprintf(stderr, "[%s] %s\n", l, msg) }
	upstream = "embedded echo"
	switch {
	case s.upstream == "cluster" && lo.proxy.Upstream == nil:
		return lo, "", "", errors.New("-upstream cluster needs -envoy: the route's cluster comes from the bootstrap")
	case s.upstream == "cluster":
		upstream = "the route's cluster"
	case s.upstream != "":
		u, err := url.Parse(s.upstream)
		if err != nil || u.Scheme == "" || u.Host == "" {
			return lo, "", "", fmt.Errorf("-upstream: want an absolute URL like http://127.0.0.1:8080, got %q", s.upstream)
		}
		lo.proxy.Upstream, upstream = proxy.ProxyTo(u), u.String()
	}
	return lo, source, upstream, nil
}

// serve listens on the flags' addresses (the proxy, and the admin listener
// with -admin) until ctx is done or a server fails, then shuts down.
func serve(ctx context.Context, s settings, h *wasmhost.Host, lo local, source, upstream string, stdout io.Writer) error {
	opts := lo.host
	ln, err := net.Listen("tcp", s.listen)
	if err != nil {
		return err
	}
	var handler http.Handler = proxy.New(h, lo.proxy)
	if s.noFilter {
		// The same server and upstream without the module: what the
		// module costs is the difference.
		handler = lo.proxy.Upstream
		if handler == nil {
			handler = proxy.EchoHandler()
		}
		upstream += " (-no-filter: requests skip the module)"
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()

	mode := "Envoy"
	if s.kong {
		mode = "Kong ngx_wasm_module"
	}
	name := opts.PluginName
	if name == "" {
		name = "tokengate"
	}
	fmt.Fprintf(stdout, "tokengate-local: plugin %q from %s\n", name, source)
	fmt.Fprintf(stdout, "  rules: %s\n", describeRules(opts.PluginConfig))
	fmt.Fprintf(stdout, "  %d worker VMs, %s semantics, upstream: %s\n", h.Workers(), mode, upstream)
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())

	if s.admin != "" {
		aln, err := net.Listen("tcp", s.admin)
		if err != nil {
			_ = srv.Close()
			return fmt.Errorf("-admin: %w", err)
		}
		asrv := &http.Server{Handler: adminHandler(h, s.showIdentities), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, asrv)
		go func() { errc <- asrv.Serve(aln) }()
		fmt.Fprintf(stdout, "metrics: http://%s/stats (Prometheus text), shared data: http://%s/shared_data\n", aln.Addr(), aln.Addr())
	}
	fmt.Fprintln(stdout, "Ctrl-C to stop.")

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	fmt.Fprintln(stdout, "tokengate-local: shutting down")
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(shutCtx); err != nil && serveErr == nil {
			serveErr = err
		}
	}
	if err := h.Close(shutCtx); err != nil && serveErr == nil {
		serveErr = err
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}

func describeRules(cfg []byte) string {
	names, err := ruleNames(cfg)
	if err != nil {
		return err.Error()
	}
	if len(names) == 0 {
		return "(no named rules)"
	}
	return fmt.Sprintf("%d: %s", len(names), strings.Join(names, ", "))
}

// jwtAuthn turns envoy.yaml's jwt_authn filter into the host's model of it.
func jwtAuthn(j *envoyconf.JWTAuthn) (*proxy.JWTAuthn, error) {
	if j == nil {
		return nil, nil
	}
	out := &proxy.JWTAuthn{Providers: map[string]*proxy.JWTProvider{}}
	for name, p := range j.Providers {
		keys, err := proxy.ParseJWKS(p.JWKS)
		if err != nil {
			return nil, fmt.Errorf("jwt_authn provider %q: %w", name, err)
		}
		out.Providers[name] = &proxy.JWTProvider{Issuer: p.Issuer, Audiences: p.Audiences, Keys: keys,
			PayloadInMetadata: p.PayloadInMetadata, Forward: p.Forward}
	}
	for _, r := range j.Rules {
		out.Rules = append(out.Rules, proxy.JWTRule{Prefix: r.Prefix, Providers: r.Providers, AllowMissing: r.AllowMissing})
	}
	return out, nil
}
