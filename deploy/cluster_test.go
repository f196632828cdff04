package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/config"
)

// parseFleetBootstrap parses examples/cluster/envoy.yaml as parseBootstrap
// does envoy.yaml, with the upstream HTTP protocol options its service
// cluster needs.
func parseFleetBootstrap(doc []byte) (*bootstrapv3.Bootstrap, *protoregistry.Types, error) {
	return parseBootstrapOf(doc, append(slices.Clone(envoyTypes), &httpv3.HttpProtocolOptions{})...)
}

// TestFleetEnvoyYAML: the bootstraps of `make cluster`'s proxies
// (examples/cluster/envoy.yaml, and examples/ai-api/envoy.yaml for
// EXAMPLE=ai-api) are valid Envoy bootstraps, their plugin configurations
// parse, and settings.rls.cluster is a cluster of the file that speaks
// HTTP/2, as the filter's gRPC call needs.
func TestFleetEnvoyYAML(t *testing.T) {
	for _, example := range []string{"cluster", "ai-api"} {
		t.Run(example, func(t *testing.T) { testFleetEnvoyYAML(t, example) })
	}
}

func testFleetEnvoyYAML(t *testing.T, example string) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "examples", example, "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bs, types, err := parseFleetBootstrap(doc)
	if err != nil {
		t.Fatalf("examples/%s/envoy.yaml: %v", example, err)
	}
	var cfg *config.Config
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
					t.Fatal(err)
				}
				ws, err := wasmFilters(hcm, types)
				if err != nil || len(ws) != 1 {
					t.Fatalf("want one wasm filter before the router: %v (%d)", err, len(ws))
				}
				sv := &wrapperspb.StringValue{}
				if err := ws[0].GetConfig().GetConfiguration().UnmarshalTo(sv); err != nil {
					t.Fatal(err)
				}
				if cfg, err = config.Parse([]byte(sv.GetValue())); err != nil {
					t.Fatalf("plugin configuration: %v", err)
				}
			}
		}
	}
	if cfg == nil || cfg.Settings.RLS == nil {
		t.Fatal("no plugin configuration with settings.rls")
	}
	found := false
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != cfg.Settings.RLS.Cluster {
			continue
		}
		found = true
		po := &httpv3.HttpProtocolOptions{}
		opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if !ok || opts.UnmarshalTo(po) != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %q does not speak HTTP/2 (explicit_http_config.http2_protocol_options)", c.GetName())
		}
	}
	if !found {
		t.Errorf("settings.rls.cluster %q is not a cluster of the bootstrap", cfg.Settings.RLS.Cluster)
	}
}
