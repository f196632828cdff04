package deploy

import (
	"os"
	"path/filepath"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/rlscontract"
)

// rlsEnvoyTypes are the typed_configs deploy/rls/envoy.yaml may name.
var rlsEnvoyTypes = []proto.Message{
	&hcmv3.HttpConnectionManager{},
	&ratelimitfilterv3.RateLimit{},
	&routerv3.Router{},
	&httpv3.HttpProtocolOptions{},
}

func parseRLSBootstrap(doc []byte) (*bootstrapv3.Bootstrap, error) {
	bs, _, err := parseBootstrapOf(doc, rlsEnvoyTypes...)
	return bs, err
}

// sampleDescriptor returns the descriptor Envoy's ratelimit filter builds
// from actions for a request that satisfies them all (every header
// present, every header_value_match matching), with made-up request
// values; an action the test does not know fails it.
func sampleDescriptor(t *testing.T, actions []*routev3.RateLimit_Action) []rls.Entry {
	t.Helper()
	var out []rls.Entry
	for i, a := range actions {
		switch x := a.ActionSpecifier.(type) {
		case *routev3.RateLimit_Action_RemoteAddress_:
			out = append(out, rls.Entry{Key: "remote_address", Value: "192.0.2.1"})
		case *routev3.RateLimit_Action_GenericKey_:
			k := x.GenericKey.GetDescriptorKey()
			if k == "" {
				k = "generic_key"
			}
			out = append(out, rls.Entry{Key: k, Value: x.GenericKey.GetDescriptorValue()})
		case *routev3.RateLimit_Action_HeaderValueMatch_:
			k := x.HeaderValueMatch.GetDescriptorKey()
			if k == "" {
				k = "header_match"
			}
			out = append(out, rls.Entry{Key: k, Value: x.HeaderValueMatch.GetDescriptorValue()})
		case *routev3.RateLimit_Action_RequestHeaders_:
			out = append(out, rls.Entry{Key: x.RequestHeaders.GetDescriptorKey(), Value: "sample-" + x.RequestHeaders.GetHeaderName()})
		case *routev3.RateLimit_Action_DestinationCluster_:
			out = append(out, rls.Entry{Key: "destination_cluster", Value: "upstream"})
		default:
			t.Fatalf("action %d: %T: teach sampleDescriptor what Envoy sends for it", i, x)
		}
	}
	return out
}

func TestRLSEnvoyYAML(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "rls", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bs, err := parseRLSBootstrap(doc)
	if err != nil {
		t.Fatalf("deploy/rls/envoy.yaml: %v", err)
	}
	cfgJSON, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "rls", "tokengate.json"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse(cfgJSON); err != nil {
		t.Fatalf("deploy/rls/tokengate.json, by the filter's parser: %v", err)
	}
	cfg, err := rls.ParseConfig(cfgJSON)
	if err != nil {
		t.Fatalf("deploy/rls/tokengate.json: %v", err)
	}
	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.Name] = c
	}
	unpack := func(a *anypb.Any, m proto.Message) {
		t.Helper()
		if err := a.UnmarshalTo(m); err != nil {
			t.Fatal(err)
		}
	}
	var hcm hcmv3.HttpConnectionManager
	unpack(bs.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig(), &hcm)
	var rl *ratelimitfilterv3.RateLimit
	for _, f := range hcm.HttpFilters {
		if f.Name == "envoy.filters.http.ratelimit" {
			rl = new(ratelimitfilterv3.RateLimit)
			unpack(f.GetTypedConfig(), rl)
		}
	}
	if rl == nil {
		t.Fatal("no envoy.filters.http.ratelimit filter")
	}
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("rate_limit_service.transport_api_version: %v, want V3", svc.GetTransportApiVersion())
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c := clusters[name]
	if c == nil {
		t.Fatalf("rate_limit_service names cluster %q, which envoy.yaml does not define", name)
	}
	opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	var po httpv3.HttpProtocolOptions
	if opts == nil || opts.UnmarshalTo(&po) != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster %q: gRPC needs explicit HTTP/2 protocol options", name)
	}
	if name != cfg.File.Settings.RLS.Cluster {
		t.Errorf("tokengate.json settings.rls.cluster %q, envoy.yaml's service cluster %q: one file should configure both", cfg.File.Settings.RLS.Cluster, name)
	}
	// Every rate_limits entry builds a descriptor that reaches a rule.
	var n int
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.Routes {
			for i, lim := range r.GetRoute().GetRateLimits() {
				entries := sampleDescriptor(t, lim.Actions)
				rule, key := cfg.Resolve(rl.Domain, entries)
				if rule == nil {
					t.Errorf("route %q rate_limits[%d]: descriptor %v of domain %q reaches no rule of tokengate.json", r.GetMatch().GetPrefix(), i, entries, rl.Domain)
					continue
				}
				t.Logf("rate_limits[%d]: %v -> rule %s, key %s", i, entries, rule.Name, key)
				n++
			}
		}
	}
	if n == 0 {
		t.Fatal("envoy.yaml has no rate_limits actions")
	}
	// The filter's own descriptors reach the cluster rule too.
	if r, _ := cfg.Resolve("tokengate", []rls.Entry{{Key: rlscontract.RuleKey, Value: "fleet-per-ip"}, {Key: rlscontract.CompositeKey, Value: "192.0.2.1"}}); r == nil {
		t.Error("the filter's descriptor for fleet-per-ip reaches no rule")
	}
}
