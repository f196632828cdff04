package deploy

import (
	"os"
	"path/filepath"
	"testing"

	dynmodv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/dynamic_modules/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokengate/tokengate/config"
)

// TestDynamicModuleBootstrap: deploy/dynmod/envoy.yaml parses into
// go-control-plane's Bootstrap with Envoy's own validation (every
// typed_config too); its tokengate filter is the dynamic-modules filter,
// loading libtokengate.so by name with do_not_close (a Go runtime cannot be
// unloaded), and its filter_config is a StringValue holding a configuration
// tokengate's parser accepts, whose cluster rule names a cluster the
// bootstrap defines.
func TestDynamicModuleBootstrap(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "dynmod", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bs, types, err := parseBootstrapOf(doc, &hcmv3.HttpConnectionManager{}, &dynmodv3.DynamicModuleFilter{},
		&routerv3.Router{}, &wrapperspb.StringValue{})
	if err != nil {
		t.Fatal(err)
	}
	lis := bs.GetStaticResources().GetListeners()
	if len(lis) != 1 || len(lis[0].GetFilterChains()) != 1 {
		t.Fatalf("want one listener with one filter chain, got %d listeners", len(lis))
	}
	hcm := &hcmv3.HttpConnectionManager{}
	if err := anypb.UnmarshalTo(lis[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), hcm, proto.UnmarshalOptions{Resolver: types}); err != nil {
		t.Fatal(err)
	}
	hf := hcm.GetHttpFilters()
	if len(hf) != 2 || hf[1].GetName() != routerName {
		t.Fatalf("http_filters %v, want tokengate then the router", hf)
	}
	f := &dynmodv3.DynamicModuleFilter{}
	if err := anypb.UnmarshalTo(hf[0].GetTypedConfig(), f, proto.UnmarshalOptions{Resolver: types}); err != nil {
		t.Fatalf("the first filter is not a DynamicModuleFilter: %v", err)
	}
	mc := f.GetDynamicModuleConfig()
	if mc.GetName() != "tokengate" || !mc.GetDoNotClose() || mc.GetLoadGlobally() {
		t.Errorf("dynamic_module_config %v, want name tokengate (libtokengate.so), do_not_close, not load_globally", mc)
	}
	if f.GetFilterName() != "tokengate" {
		t.Errorf("filter_name %q, want tokengate", f.GetFilterName())
	}
	sv := &wrapperspb.StringValue{}
	if err := anypb.UnmarshalTo(f.GetFilterConfig(), sv, proto.UnmarshalOptions{}); err != nil {
		t.Fatalf("filter_config is not a StringValue (the module is given its value unwrapped): %v", err)
	}
	cfg, err := config.Parse([]byte(sv.GetValue()))
	if err != nil {
		t.Fatalf("tokengate refuses filter_config: %v", err)
	}
	clusters := map[string]bool{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = true
	}
	if rls := cfg.Settings.RLS; rls == nil || !clusters[rls.Cluster] || rls.Protocol != config.RLSProtocolJSON {
		t.Errorf("settings.rls %+v: want the JSON protocol to a cluster the bootstrap defines (%v)", rls, clusters)
	}
}
