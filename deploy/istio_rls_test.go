package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"
	istionet "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// istioDoc is the Kubernetes envelope of an Istio object; the spec is
// decoded into Istio's own API type.
type istioDoc struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// readIstio parses deploy/istio/rls/<file> strictly: unknown envelope
// fields, and spec fields or enum values Istio's API does not define, fail.
func readIstio(t *testing.T, file, apiVersion, kind string, spec proto.Message) istioDoc {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "istio", "rls", file))
	if err != nil {
		t.Fatal(err)
	}
	var env istioDoc
	if err := yaml.UnmarshalStrict(doc, &env); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if env.APIVersion != apiVersion || env.Kind != kind || env.Metadata.Name == "" || env.Metadata.Namespace == "" {
		t.Fatalf("%s: %s %s %s/%s, want %s %s with a name and a namespace", file, env.APIVersion, env.Kind, env.Metadata.Namespace, env.Metadata.Name, apiVersion, kind)
	}
	if err := protojson.Unmarshal(env.Spec, spec); err != nil {
		t.Fatalf("%s: spec: %v", file, err)
	}
	return env
}

// istioRLSTarget renders the chart with deploy/istio/rls/values.yaml and
// returns the Service's FQDN, Istio's outbound cluster name for its gRPC
// port, and the rules ConfigMap's JSON.
func istioRLSTarget(t *testing.T) (host, cluster string, rules []byte) {
	t.Helper()
	vals, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "istio", "rls", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	r := mustRender(t, string(vals))
	svc := r.services[releaseName]
	if svc == nil {
		t.Fatalf("no Service %s", releaseName)
	}
	host = svc.Name + "." + svc.Namespace + ".svc.cluster.local"
	var port int32
	for _, p := range svc.Spec.Ports {
		if p.Name == "grpc" {
			port = p.Port
			if p.AppProtocol == nil || *p.AppProtocol != "kubernetes.io/h2c" {
				t.Errorf("the Service's grpc port is not HTTP/2 cleartext: appProtocol %v", p.AppProtocol)
			}
		}
	}
	if port == 0 {
		t.Fatal("the Service has no grpc port")
	}
	cluster = "outbound|" + strconv.Itoa(int(port)) + "||" + host
	for _, cm := range r.configMaps {
		rules = []byte(cm.Data["tokengate.json"])
	}
	if rules == nil {
		t.Fatal("no rules ConfigMap")
	}
	return host, cluster, rules
}

func TestIstioRLSDestinationRule(t *testing.T) {
	host, _, _ := istioRLSTarget(t)
	dr := &istionet.DestinationRule{}
	readIstio(t, "destinationrule.yaml", "networking.istio.io/v1", "DestinationRule", dr)
	if dr.Host != host {
		t.Errorf("host %q, want the chart's Service %q", dr.Host, host)
	}
	tp := dr.GetTrafficPolicy()
	if got := tp.GetConnectionPool().GetHttp().GetH2UpgradePolicy(); got != istionet.ConnectionPoolSettings_HTTPSettings_UPGRADE {
		t.Errorf("h2UpgradePolicy %v, want UPGRADE (gRPC needs HTTP/2)", got)
	}
	if tp.GetOutlierDetection() == nil {
		t.Error("no outlierDetection: a failing replica would keep its share of calls")
	}
	if tp.GetTls() != nil && tp.GetTls().GetMode() != istionet.ClientTLSSettings_ISTIO_MUTUAL {
		t.Errorf("tls mode %v: the mesh's mTLS (ISTIO_MUTUAL) or none", tp.GetTls().GetMode())
	}
}

// TestIstioRLSEnvoyFilter: the EnvoyFilter's patches decode into Envoy's
// own types and pass Envoy's validation; the filter calls the chart's
// Service over Istio's cluster, and every descriptor the actions build
// reaches a rule of the chart's configuration.
func TestIstioRLSEnvoyFilter(t *testing.T) {
	_, cluster, rulesJSON := istioRLSTarget(t)
	cfg, err := rls.ParseConfig(rulesJSON)
	if err != nil {
		t.Fatalf("values.yaml's configuration: %v", err)
	}
	ef := &istionet.EnvoyFilter{}
	readIstio(t, "envoyfilter.yaml", "networking.istio.io/v1alpha3", "EnvoyFilter", ef)
	types := new(protoregistry.Types)
	for _, m := range rlsEnvoyTypes {
		if err := types.RegisterMessage(m.ProtoReflect().Type()); err != nil {
			t.Fatal(err)
		}
	}
	// decode decodes patch i's value; whole says it must pass Envoy's
	// validation as a whole (a MERGE patch is a fragment).
	decode := func(i int, into proto.Message, whole bool) {
		t.Helper()
		js, err := protojson.Marshal(ef.ConfigPatches[i].GetPatch().GetValue())
		if err != nil {
			t.Fatal(err)
		}
		if err := (protojson.UnmarshalOptions{Resolver: types}).Unmarshal(js, into); err != nil {
			t.Fatalf("configPatches[%d].patch.value as %T: %v", i, into, err)
		}
		if !whole {
			return
		}
		if err := validateTree(into, types, fmt.Sprintf("configPatches[%d]", i)); err != nil {
			t.Fatal(err)
		}
	}
	var rl *ratelimitfilterv3.RateLimit
	var limits []*routev3.RateLimit
	for i, p := range ef.ConfigPatches {
		switch p.ApplyTo {
		case istionet.EnvoyFilter_HTTP_FILTER:
			if p.GetMatch().GetContext() != istionet.EnvoyFilter_GATEWAY || p.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_INSERT_BEFORE ||
				p.GetMatch().GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != "envoy.filters.http.router" {
				t.Errorf("configPatches[%d]: want the filter inserted before the gateway's router", i)
			}
			f := &hcmv3.HttpFilter{}
			decode(i, f, true)
			if f.Name != "envoy.filters.http.ratelimit" {
				t.Errorf("configPatches[%d] inserts %s", i, f.Name)
				continue
			}
			rl = &ratelimitfilterv3.RateLimit{}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatal(err)
			}
		case istionet.EnvoyFilter_VIRTUAL_HOST:
			vh := &routev3.VirtualHost{}
			decode(i, vh, false)
			if p.GetPatch().GetOperation() != istionet.EnvoyFilter_Patch_MERGE {
				t.Errorf("configPatches[%d]: %v, want MERGE into the gateway's virtual host", i, p.GetPatch().GetOperation())
			}
			for j, lim := range vh.RateLimits {
				if err := validateTree(lim, types, fmt.Sprintf("configPatches[%d].rate_limits[%d]", i, j)); err != nil {
					t.Error(err)
				}
			}
			limits = append(limits, vh.RateLimits...)
		default:
			t.Errorf("configPatches[%d]: unexpected applyTo %v", i, p.ApplyTo)
		}
	}
	if rl == nil {
		t.Fatal("no envoy.filters.http.ratelimit patch")
	}
	if got := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); got != cluster {
		t.Errorf("rate_limit_service cluster %q, want the chart's Service %q", got, cluster)
	}
	if rl.GetFailureModeDeny() {
		t.Error("failure_mode_deny: true would answer 500 whenever Redis fails")
	}
	if len(limits) == 0 {
		t.Fatal("no rate_limits actions")
	}
	for i, lim := range limits {
		entries := sampleDescriptor(t, lim.Actions)
		if rule, _ := cfg.Resolve(rl.Domain, entries); rule == nil {
			t.Errorf("rate_limits[%d]: descriptor %v of domain %q reaches no rule of values.yaml", i, entries, rl.Domain)
		}
	}
}

// TestIstioRLSWasmPlugin: the Wasm filter's configuration is values.yaml's
// (less the service's rls_descriptors), parses, and calls the chart's
// Service by Istio's cluster name.
func TestIstioRLSWasmPlugin(t *testing.T) {
	_, cluster, rulesJSON := istioRLSTarget(t)
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "istio", "rls", "wasmplugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, plugin, err := parseWasmPlugin(doc)
	if err != nil {
		t.Fatalf("wasmplugin.yaml: %v", err)
	}
	fc, err := config.Parse(plugin)
	if err != nil {
		t.Fatalf("wasmplugin.yaml pluginConfig, by the filter's parser: %v", err)
	}
	if got := fc.Settings.RLS.Cluster; got != cluster {
		t.Errorf("settings.rls.cluster %q, want the chart's Service %q", got, cluster)
	}
	var fromPlugin, fromChart map[string]any
	if err := json.Unmarshal(plugin, &fromPlugin); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(rulesJSON, &fromChart); err != nil {
		t.Fatal(err)
	}
	delete(fromChart, "rls_descriptors")
	if !reflect.DeepEqual(fromPlugin, fromChart) {
		t.Errorf("wasmplugin.yaml's pluginConfig and values.yaml's configuration differ:\n%v\n%v", fromPlugin, fromChart)
	}
	cfg, err := rls.ParseConfig(rulesJSON)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, r := range cfg.Rules() {
		names[r.Name] = true
	}
	for _, r := range fc.Rules() {
		if r.Cluster && !names[r.Name] {
			t.Errorf("cluster rule %s is not among the service's rules", r.Name)
		}
	}
}
