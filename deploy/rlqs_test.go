package deploy

import (
	"os"
	"path/filepath"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/rlscontract"
)

// rlqsEnvoyTypes are the typed_configs deploy/rlqs/envoy.yaml may name.
var rlqsEnvoyTypes = []proto.Message{
	&hcmv3.HttpConnectionManager{},
	&rlqsfilterv3.RateLimitQuotaFilterConfig{},
	&rlqsfilterv3.RateLimitQuotaBucketSettings{},
	&matcherv3.HttpRequestHeaderMatchInput{},
	&routerv3.Router{},
	&httpv3.HttpProtocolOptions{},
}

func parseRLQSBootstrap(doc []byte) (*bootstrapv3.Bootstrap, *protoregistry.Types, error) {
	return parseBootstrapOf(doc, rlqsEnvoyTypes...)
}

// TestRLQSBootstrap parses deploy/rlqs/envoy.yaml with go-control-plane's
// types and Envoy's validation, and checks what docs/rlqs.md relies on: the
// filter asks the tokengate_rls cluster (HTTP/2) in a domain; the bucket id
// names a rule of deploy/rlqs/tokengate.json under rlscontract.RuleKey; the
// reporting interval is whole seconds; both fallbacks deny all.
func TestRLQSBootstrap(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "rlqs", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bs, _, err := parseRLQSBootstrap(doc)
	if err != nil {
		t.Fatalf("deploy/rlqs/envoy.yaml: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "rlqs", "tokengate.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rls.ParseConfig(data)
	if err != nil {
		t.Fatalf("deploy/rlqs/tokengate.json: %v", err)
	}
	rules := map[string]bool{}
	for _, r := range cfg.Rules() {
		rules[r.Name] = true
	}

	hcm := &hcmv3.HttpConnectionManager{}
	if err := bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(hcm); err != nil {
		t.Fatal(err)
	}
	var fc *rlqsfilterv3.RateLimitQuotaFilterConfig
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == "envoy.filters.http.rate_limit_quota" {
			fc = &rlqsfilterv3.RateLimitQuotaFilterConfig{}
			if err := f.GetTypedConfig().UnmarshalTo(fc); err != nil {
				t.Fatal(err)
			}
		}
	}
	if fc == nil {
		t.Fatal("no envoy.filters.http.rate_limit_quota filter")
	}
	if fc.GetDomain() == "" {
		t.Error("the filter names no domain")
	}
	cluster := fc.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	found := false
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != cluster {
			continue
		}
		found = true
		po := &httpv3.HttpProtocolOptions{}
		if err := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(po); err != nil || po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %q is not HTTP/2 (gRPC): %v", cluster, err)
		}
	}
	if !found {
		t.Errorf("rlqs_server names cluster %q, which the bootstrap lacks", cluster)
	}

	action := fc.GetBucketMatchers().GetOnNoMatch().GetAction().GetTypedConfig()
	if action == nil {
		t.Fatal("bucket_matchers has no on_no_match action")
	}
	msg, err := action.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	bset, ok := msg.(*rlqsfilterv3.RateLimitQuotaBucketSettings)
	if !ok {
		t.Fatalf("on_no_match action is a %T, want RateLimitQuotaBucketSettings", msg)
	}
	b := bset.GetBucketIdBuilder().GetBucketIdBuilder()
	if rule := b[rlscontract.RuleKey].GetStringValue(); !rules[rule] {
		t.Errorf("bucket id %s = %q: not a rule of deploy/rlqs/tokengate.json", rlscontract.RuleKey, rule)
	}
	if d := bset.GetReportingInterval().AsDuration(); d <= 0 || d%1e9 != 0 {
		t.Errorf("reporting_interval %v: want whole seconds (Envoy reports elapsed time in whole seconds)", d)
	}
	if r := bset.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule(); r != typev3.RateLimitStrategy_DENY_ALL || bset.GetNoAssignmentBehavior().GetFallbackRateLimit() == nil {
		t.Errorf("no_assignment_behavior: %v, want DENY_ALL", bset.GetNoAssignmentBehavior())
	}
	if r := bset.GetExpiredAssignmentBehavior().GetFallbackRateLimit(); r == nil || r.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Errorf("expired_assignment_behavior: %v, want DENY_ALL", bset.GetExpiredAssignmentBehavior())
	}
}
