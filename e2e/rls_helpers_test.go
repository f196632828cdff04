package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/envoyconf"
	"github.com/tokengate/tokengate/internal/envoyrl"
	"github.com/tokengate/tokengate/internal/wasmhost"
)

// rlsBootstrap is the part of an envoy.yaml the local host reads for
// callouts: a STATIC cluster named "ratelimit" with HTTP/2 (prior
// knowledge), as Envoy needs for gRPC, at addr.
func rlsBootstrap(addr string) string {
	host, port, _ := strings.Cut(addr, ":")
	return `static_resources:
  clusters:
  - name: ratelimit
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {}
    load_assignment:
      cluster_name: ratelimit
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {address: ` + host + `, port_value: ` + port + `}
`
}

// startClusterHost runs the real module with cfg and the clusters of the
// bootstrap, through envoyconf as tokengate-local does with -envoy.
func startClusterHost(t testing.TB, cfg, bootstrap string, workers int) (*wasmhost.Host, *httptest.Server) {
	t.Helper()
	cls, err := envoyconf.Clusters([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]wasmhost.Cluster{}
	for name, c := range cls {
		clusters[name] = wasmhost.Cluster{Address: c.Address, HTTP2: c.HTTP2}
	}
	if _, ok := clusters["ratelimit"]; !ok || !clusters["ratelimit"].HTTP2 {
		t.Fatalf("bootstrap: no HTTP/2 cluster ratelimit in %v", clusters)
	}
	return startHost(t, wasmhost.Options{PluginConfig: []byte(cfg), Clusters: clusters, Workers: workers})
}

// envoyRatelimit returns the envoyproxy/ratelimit binary (tools/ratelimit.sh
// installs it the first time). When it cannot be installed (no network for
// the module proxy) the test is skipped, unless $TOKENGATE_REQUIRE_REDIS is
// set, as .ci/run does.
func envoyRatelimit(t testing.TB) string {
	t.Helper()
	bin, err := envoyrl.Install()
	if err != nil {
		if os.Getenv("TOKENGATE_REQUIRE_REDIS") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	return bin
}

// startEnvoyRatelimit starts envoyproxy/ratelimit on redisAddr with the
// domain configuration yaml, stopped when the test ends.
func startEnvoyRatelimit(t testing.TB, redisAddr, yaml string, headers bool) *envoyrl.Server {
	t.Helper()
	srv, err := envoyrl.Start(envoyRatelimit(t), envoyrl.Options{Redis: redisAddr, Config: yaml, ResponseHeaders: headers})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	return srv
}

// getKey sends GET / with x-api-key: key and returns the response (body
// read and closed).
func getKey(t testing.TB, srv *httptest.Server, key string) (*http.Response, string) {
	t.Helper()
	return get(t, srv, "/", map[string]string{"x-api-key": key})
}

// getURL sends GET url with header and returns the response (body read and
// closed).
func getURL(t testing.TB, url string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}
