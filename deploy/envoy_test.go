package deploy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	streamv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	jwtauthnv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	wasmfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/filter"
)

// repoRoot is the repository root, relative to this package's directory
// (where go test runs).
const repoRoot = ".."

// Facts envoy.yaml must state; docs/deploy/envoy.md and the local host rely on them.
const (
	wantVMID       = "tokengate"
	wantRuntime    = "envoy.wasm.runtime.v8"
	wantWasmFile   = "build/tokengate.wasm"
	wantFailPolicy = wasmv3.FailurePolicy_FAIL_OPEN
	wasmFilterName = "envoy.filters.http.wasm"
	routerName     = "envoy.filters.http.router"
	listenerPort   = 10000
	adminPort      = 9901
)

// envoyTypes is every message a typed_config (or the wasm filter's
// configuration) in envoy.yaml may name. The resolver knows nothing else, so
// an @type outside this list fails to parse, as it would fail in an Envoy
// build without that extension.
var envoyTypes = []proto.Message{
	&hcmv3.HttpConnectionManager{},
	&wasmfilterv3.Wasm{},
	&jwtauthnv3.JwtAuthentication{},
	&routerv3.Router{},
	&streamv3.StdoutAccessLog{},
	&wrapperspb.StringValue{},
}

// parseBootstrap parses an Envoy YAML bootstrap the way Envoy does (YAML →
// JSON → proto3 JSON mapping, unknown fields rejected), with envoyTypes the
// only typed_configs it may name, and runs Envoy's generated validation on
// it and on every Any inside it, recursively.
func parseBootstrap(doc []byte) (*bootstrapv3.Bootstrap, *protoregistry.Types, error) {
	return parseBootstrapOf(doc, envoyTypes...)
}

// parseBootstrapOf is parseBootstrap with typed the typed_configs the
// bootstrap may name.
func parseBootstrapOf(doc []byte, typed ...proto.Message) (*bootstrapv3.Bootstrap, *protoregistry.Types, error) {
	types := new(protoregistry.Types)
	for _, m := range typed {
		if err := types.RegisterMessage(m.ProtoReflect().Type()); err != nil {
			return nil, nil, err
		}
	}
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("yaml: %w", err)
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{Resolver: types}).Unmarshal(j, bs); err != nil {
		return nil, nil, fmt.Errorf("protojson: %w", err)
	}
	if err := validateTree(bs, types, "bootstrap"); err != nil {
		return nil, nil, err
	}
	return bs, types, nil
}

// validateTree runs m's ValidateAll (the protoc-gen-validate rules Envoy
// itself enforces), then unpacks every google.protobuf.Any below m and
// validates it the same way: ValidateAll does not look inside an Any.
func validateTree(m proto.Message, types *protoregistry.Types, path string) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return eachAny(m.ProtoReflect(), path, func(a *anypb.Any, at string) error {
		inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{Resolver: types})
		if err != nil {
			return fmt.Errorf("%s: %w", at, err)
		}
		return validateTree(inner, types, at+"("+a.GetTypeUrl()+")")
	})
}

// eachAny calls fn for every Any message reachable from m, without entering
// the Anys themselves.
func eachAny(m protoreflect.Message, path string, fn func(*anypb.Any, string) error) error {
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		a, ok := m.Interface().(*anypb.Any)
		if !ok {
			return fmt.Errorf("%s: Any of type %T", path, m.Interface())
		}
		return fn(a, path)
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		at := path + "." + string(fd.Name())
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				err = eachAny(l.Get(i).Message(), fmt.Sprintf("%s[%d]", at, i), fn)
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				err = eachAny(mv.Message(), fmt.Sprintf("%s[%v]", at, k.Interface()), fn)
				return err == nil
			})
		case !fd.IsList() && !fd.IsMap() && fd.Message() != nil:
			err = eachAny(v.Message(), at, fn)
		}
		return err == nil
	})
	return err
}

// envoyPlugin is what checkEnvoyYAML found in the wasm filter.
type envoyPlugin struct {
	wasm   *wasmfilterv3.Wasm
	config []byte // the plugin configuration: the StringValue's value
	parsed *config.Config
}

// checkEnvoyYAML parses and validates an envoy.yaml and checks everything
// tokengate's documentation promises about it.
func checkEnvoyYAML(doc []byte) (*envoyPlugin, error) {
	bs, types, err := parseBootstrap(doc)
	if err != nil {
		return nil, err
	}
	if got := bs.GetAdmin().GetAddress().GetSocketAddress(); got.GetAddress() != "127.0.0.1" || got.GetPortValue() != adminPort {
		return nil, fmt.Errorf("admin listens on %s:%d, want 127.0.0.1:%d", got.GetAddress(), got.GetPortValue(), adminPort)
	}
	var plugins []*wasmfilterv3.Wasm
	var listeners []string
	for _, l := range bs.GetStaticResources().GetListeners() {
		sa := l.GetAddress().GetSocketAddress()
		listeners = append(listeners, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().MessageIs(hcm) {
					if err := f.GetTypedConfig().UnmarshalTo(hcm); err != nil {
						return nil, err
					}
					ps, err := wasmFilters(hcm, types)
					if err != nil {
						return nil, fmt.Errorf("listener %q: %w", l.GetName(), err)
					}
					plugins = append(plugins, ps...)
				}
			}
		}
	}
	if len(listeners) != 1 || listeners[0] != fmt.Sprintf("0.0.0.0:%d", listenerPort) {
		return nil, fmt.Errorf("listeners %v, want exactly 0.0.0.0:%d", listeners, listenerPort)
	}
	if len(plugins) != 1 {
		return nil, fmt.Errorf("found %d %s filters, want 1", len(plugins), wasmFilterName)
	}
	w := plugins[0]
	pc := w.GetConfig()
	vm := pc.GetVmConfig()
	switch {
	case vm.GetVmId() != wantVMID:
		return nil, fmt.Errorf("vm_config.vm_id %q, want %q", vm.GetVmId(), wantVMID)
	case vm.GetRuntime() != wantRuntime:
		return nil, fmt.Errorf("vm_config.runtime %q, want %q", vm.GetRuntime(), wantRuntime)
	case vm.GetCode().GetLocal().GetFilename() != wantWasmFile:
		return nil, fmt.Errorf("vm_config.code.local.filename %q, want %q", vm.GetCode().GetLocal().GetFilename(), wantWasmFile)
	case pc.GetFailurePolicy() != wantFailPolicy:
		return nil, fmt.Errorf("failure_policy %v, want %v", pc.GetFailurePolicy(), wantFailPolicy)
	case pc.ProtoReflect().Has(pc.ProtoReflect().Descriptor().Fields().ByName("fail_open")):
		return nil, errors.New("deprecated fail_open is set; use failure_policy")
	}
	sv := &wrapperspb.StringValue{}
	if !pc.GetConfiguration().MessageIs(sv) {
		return nil, fmt.Errorf("configuration is a %q, want a google.protobuf.StringValue", pc.GetConfiguration().GetTypeUrl())
	}
	if err := pc.GetConfiguration().UnmarshalTo(sv); err != nil {
		return nil, err
	}
	cfg, err := config.Parse([]byte(sv.GetValue()))
	if err != nil {
		return nil, fmt.Errorf("plugin configuration: %w", err)
	}
	if err := checkStatsTags(bs, cfg); err != nil {
		return nil, err
	}
	return &envoyPlugin{wasm: w, config: []byte(sv.GetValue()), parsed: cfg}, nil
}

// wasmFilters returns the HCM's wasm filters, checking that the router is
// the last filter and comes after them.
func wasmFilters(hcm *hcmv3.HttpConnectionManager, types *protoregistry.Types) ([]*wasmfilterv3.Wasm, error) {
	hf := hcm.GetHttpFilters()
	if len(hf) == 0 || hf[len(hf)-1].GetName() != routerName {
		return nil, fmt.Errorf("the last http filter must be %s", routerName)
	}
	var out []*wasmfilterv3.Wasm
	for _, f := range hf {
		w := &wasmfilterv3.Wasm{}
		isWasm := f.GetTypedConfig().MessageIs(w)
		if isWasm != (f.GetName() == wasmFilterName) {
			return nil, fmt.Errorf("http filter %q has typed_config %q", f.GetName(), f.GetTypedConfig().GetTypeUrl())
		}
		if !isWasm {
			continue
		}
		if err := f.GetTypedConfig().UnmarshalTo(w); err != nil {
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// counters are every per-rule counter the filter defines.
var counters = []string{
	filter.CounterAllowed, filter.CounterRejected, filter.CounterShadowRejected, filter.CounterFailOpen,
	filter.CounterCASRetries, filter.CounterDescriptorMissing, filter.CounterStoreDenied,
	filter.CounterSlotTakeovers, filter.CounterSlotCollisions,
}

// checkStatsTags checks that the "rule" tag extractor turns every per-rule
// counter of cfg into tokengate_rule_<counter>{rule="<rule>"} and leaves the
// plugin-wide counters alone. Envoy evaluates the regex with its own engine;
// the pattern uses only syntax that RE2 and ECMAScript read the same way.
func checkStatsTags(bs *bootstrapv3.Bootstrap, cfg *config.Config) error {
	var re *regexp.Regexp
	for _, ts := range bs.GetStatsConfig().GetStatsTags() {
		if ts.GetTagName() == "rule" {
			var err error
			if re, err = regexp.Compile(ts.GetRegex()); err != nil {
				return fmt.Errorf("stats_tags rule: %w", err)
			}
		}
	}
	if re == nil {
		return errors.New(`stats_config.stats_tags has no "rule" tag`)
	}
	for _, r := range cfg.Rules() {
		for _, c := range counters {
			stat := "wasmcustom." + filter.RuleMetricName(r.Name, c)
			name, tag, ok := extractTag(re, stat)
			if !ok || tag != r.Name {
				return fmt.Errorf("stats tag regex on %q: tag %q (matched %v), want %q", stat, tag, ok, r.Name)
			}
			if got, want := prometheusName(name), "tokengate_rule_"+c; got != want {
				return fmt.Errorf("%q scrapes as %q, want %q", stat, got, want)
			}
		}
	}
	for _, m := range []string{filter.MetricPanics, filter.MetricConfigRejected, filter.MetricCorruptState, filter.MetricSeedErrors} {
		if _, _, ok := extractTag(re, "wasmcustom."+m); ok {
			return fmt.Errorf("stats tag regex matches the plugin-wide %q", m)
		}
	}
	return nil
}

// extractTag applies an Envoy tag-extraction regex: the first group is cut
// out of the name, the second (or else the first) is the tag value.
func extractTag(re *regexp.Regexp, stat string) (name, value string, ok bool) {
	m := re.FindStringSubmatchIndex(stat)
	if len(m) < 4 || m[2] < 0 {
		return stat, "", false
	}
	value = stat[m[2]:m[3]]
	if len(m) >= 6 && m[4] >= 0 {
		value = stat[m[4]:m[5]]
	}
	return stat[:m[2]] + stat[m[3]:], value, true
}

// prometheusName is the name /stats/prometheus prints for a tag-extracted
// stat name in the registered "wasmcustom" namespace: the namespace is
// dropped, no "envoy_" prefix is added, and every character outside
// [a-zA-Z0-9_] becomes '_'.
func prometheusName(tagExtracted string) string {
	n := strings.TrimPrefix(tagExtracted, "wasmcustom.")
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, n)
}

func readEnvoyYAML(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestEnvoyYAML(t *testing.T) {
	p, err := checkEnvoyYAML(readEnvoyYAML(t))
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	// The bundle docs/configuration.md walks through.
	var ids []string
	shadow := map[string]bool{}
	for _, pol := range p.parsed.Policies {
		ids = append(ids, pol.ID)
		shadow[pol.ID] = pol.Shadow
	}
	if got, want := strings.Join(ids, ","), "edge,api,search,canary"; got != want {
		t.Errorf("policies %s, want %s", got, want)
	}
	if !shadow["canary"] {
		t.Error("policy canary is not in shadow mode")
	}
	var names []string
	for _, r := range p.parsed.Rules() {
		names = append(names, r.Name)
	}
	if got, want := strings.Join(names, ","), "per-ip,tier-enterprise,tier-pro,tier-free,api-fallback,search-cost,per-ip-strict"; got != want {
		t.Errorf("rules %s, want %s", got, want)
	}
	for _, r := range p.parsed.Rules() {
		if strings.HasPrefix(r.Name, "tier-") && len(r.Match) != 1 {
			t.Errorf("rule %s: every tier needs its own match, got %d conditions", r.Name, len(r.Match))
		}
	}
	if got := p.parsed.Settings.MaxAttempts; got != 16 {
		t.Errorf("cas_max_attempts %d, want 16", got)
	}
}

func TestEnvoyYAMLStatsTagExtraction(t *testing.T) {
	re := regexp.MustCompile(`^wasmcustom\.tokengate\.rule\.(([A-Za-z0-9_-]+)\.)[a-z_]+$`)
	tests := []struct {
		stat, name, tag, prom string
	}{
		{"wasmcustom.tokengate.rule.per-ip.rejected", "wasmcustom.tokengate.rule.rejected", "per-ip", "tokengate_rule_rejected"},
		{"wasmcustom.tokengate.rule.a_B-9.shadow_rejected", "wasmcustom.tokengate.rule.shadow_rejected", "a_B-9", "tokengate_rule_shadow_rejected"},
	}
	for _, tt := range tests {
		name, tag, ok := extractTag(re, tt.stat)
		if !ok || name != tt.name || tag != tt.tag {
			t.Errorf("extractTag(%q) = %q, %q, %v; want %q, %q", tt.stat, name, tag, ok, tt.name, tt.tag)
		}
		if got := prometheusName(name); got != tt.prom {
			t.Errorf("prometheusName(%q) = %q, want %q", name, got, tt.prom)
		}
	}
	// Without the tag the rule stays in the name, sanitised.
	if got := prometheusName("wasmcustom.tokengate.rule.per-ip.allowed"); got != "tokengate_rule_per_ip_allowed" {
		t.Errorf("untagged name scrapes as %q", got)
	}
}

// TestEnvoyYAMLMutations shows the check has teeth: each edit of the real
// envoy.yaml must be caught, with an error that names the problem.
func TestEnvoyYAMLMutations(t *testing.T) {
	doc := string(readEnvoyYAML(t))
	tests := []struct {
		name        string
		old, new    string
		expectedErr string
	}{
		{
			name: "field name typo",
			old:  "vm_config:", new: "vm_confg:",
			expectedErr: `unknown field "vm_confg"`,
		},
		{
			name: "misspelt @type",
			old:  "envoy.extensions.filters.http.wasm.v3.Wasm\n", new: "envoy.extensions.filters.http.wasm.v3.WasmFilter\n",
			expectedErr: "envoy.extensions.filters.http.wasm.v3.WasmFilter",
		},
		{
			name: "@type of another extension",
			old:  "envoy.extensions.filters.http.router.v3.Router", new: "envoy.extensions.filters.http.buffer.v3.Buffer",
			expectedErr: "envoy.extensions.filters.http.buffer.v3.Buffer",
		},
		{
			name: "wasm filter under the wrong type",
			old:  "\"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n", new: "\"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n",
			expectedErr: `unknown field "config"`,
		},
		{
			name: "unknown failure policy",
			old:  "failure_policy: FAIL_OPEN", new: "failure_policy: FAIL_SOMETIMES",
			expectedErr: "FAIL_SOMETIMES",
		},
		{
			name: "fail closed",
			old:  "failure_policy: FAIL_OPEN", new: "failure_policy: FAIL_CLOSED",
			expectedErr: "failure_policy FAIL_CLOSED, want FAIL_OPEN",
		},
		{
			name: "port out of range (Envoy validation)",
			old:  "port_value: 10000", new: "port_value: 100000",
			expectedErr: "value must be less than or equal to 65535",
		},
		{
			name: "empty stat_prefix (validation inside a typed_config)",
			old:  "stat_prefix: ingress_http", new: `stat_prefix: ""`,
			expectedErr: "StatPrefix",
		},
		{
			name: "wrong vm_id",
			old:  "vm_id: tokengate", new: "vm_id: other",
			expectedErr: `vm_config.vm_id "other"`,
		},
		{
			name: "wrong module path",
			old:  "filename: build/tokengate.wasm", new: "filename: tokengate.wasm",
			expectedErr: `filename "tokengate.wasm"`,
		},
		{
			name: "invalid rule: burst below the rate",
			old:  `"algorithm_config": { "rps": 5, "burst": 10 }`, new: `"algorithm_config": { "rps": 5, "burst": 4 }`,
			expectedErr: "policies[0].spec.rules[0].algorithm_config.burst: must be >= rps (5), got 4",
		},
		{
			name: "invalid rule: unknown mode",
			old:  `"mode": "shadow"`, new: `"mode": "dry-run"`,
			expectedErr: `policies[3].spec.mode: must be "enforce" or "shadow", got "dry-run"`,
		},
		{
			name: "invalid rule: malformed descriptor",
			old:  `"match": { "jwt:plan": "pro" }`, new: `"match": { "jwt:pl.an": "pro" }`,
			expectedErr: `policies[1].spec.rules[1].match.jwt:pl.an: invalid descriptor "jwt:pl.an"`,
		},
		{
			name: "stats tag regex no longer matches the rule names",
			old:  `(([A-Za-z0-9_-]+)\.)`, new: `(([a-z]+)\.)`,
			expectedErr: "stats tag regex",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(doc, tt.old) {
				t.Fatalf("envoy.yaml no longer contains %q; update the test", tt.old)
			}
			mutated := strings.Replace(doc, tt.old, tt.new, 1)
			_, err := checkEnvoyYAML([]byte(mutated))
			if err == nil {
				t.Fatalf("mutation %q → %q: no error", tt.old, tt.new)
			}
			if !strings.Contains(err.Error(), tt.expectedErr) {
				t.Errorf("error %q does not contain %q", err, tt.expectedErr)
			}
		})
	}
}
