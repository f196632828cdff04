package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	istioext "istio.io/api/extensions/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/tokengate/tokengate/config"
)

// wasmPluginDoc is the Kubernetes envelope of a WasmPlugin; the spec is
// checked against Istio's own API type.
type wasmPluginDoc struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec"`
}

// parseWasmPlugin parses a WasmPlugin manifest strictly: unknown envelope
// fields and any spec field or enum value Istio's API does not define are
// errors. It returns the spec and the plugin configuration as the filter
// receives it (the pluginConfig Struct serialised to JSON).
func parseWasmPlugin(doc []byte) (*istioext.WasmPlugin, []byte, error) {
	var env wasmPluginDoc
	if err := yaml.UnmarshalStrict(doc, &env); err != nil {
		return nil, nil, fmt.Errorf("yaml: %w", err)
	}
	if env.APIVersion != "extensions.istio.io/v1alpha1" || env.Kind != "WasmPlugin" {
		return nil, nil, fmt.Errorf("%s %s, want extensions.istio.io/v1alpha1 WasmPlugin", env.APIVersion, env.Kind)
	}
	if env.Metadata.Name == "" {
		return nil, nil, fmt.Errorf("metadata.name is empty")
	}
	spec := &istioext.WasmPlugin{}
	if err := protojson.Unmarshal(env.Spec, spec); err != nil {
		return nil, nil, fmt.Errorf("spec: %w", err)
	}
	if spec.GetPluginConfig() == nil {
		return nil, nil, fmt.Errorf("spec.pluginConfig is missing")
	}
	cfg, err := protojson.Marshal(spec.GetPluginConfig())
	if err != nil {
		return nil, nil, err
	}
	return spec, cfg, nil
}

func TestIstioWasmPlugin(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "istio", "wasmplugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	spec, pluginCfg, err := parseWasmPlugin(doc)
	if err != nil {
		t.Fatalf("wasmplugin.yaml: %v", err)
	}
	if !strings.HasPrefix(spec.GetUrl(), "oci://") {
		t.Errorf("url %q, want an oci:// image", spec.GetUrl())
	}
	if got := spec.GetImagePullPolicy(); got != istioext.PullPolicy_IfNotPresent {
		t.Errorf("imagePullPolicy %v, want IfNotPresent", got)
	}
	if got := spec.GetPhase(); got != istioext.PluginPhase_AUTHZ {
		t.Errorf("phase %v, want AUTHZ (after authentication, so JWT claims are verified)", got)
	}
	if got := spec.GetFailStrategy(); got != istioext.FailStrategy_FAIL_OPEN {
		t.Errorf("failStrategy %v, want FAIL_OPEN", got)
	}
	if got := spec.GetType(); got != istioext.PluginType_HTTP {
		t.Errorf("type %v, want HTTP", got)
	}
	if len(spec.GetSelector().GetMatchLabels()) == 0 {
		t.Error("selector.matchLabels is empty: the plugin would apply to every workload in the namespace")
	}

	cfg, err := config.Parse(pluginCfg)
	if err != nil {
		t.Fatalf("pluginConfig: %v\n%s", err, pluginCfg)
	}
	envoy, err := checkEnvoyYAML(readEnvoyYAML(t))
	if err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}
	var got, want any
	if err := json.Unmarshal(pluginCfg, &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(envoy.config, &want); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("pluginConfig differs from envoy.yaml's configuration:\ngot  %s\nwant %s", pluginCfg, envoy.config)
	}
	if g, w := ruleNames(cfg), ruleNames(envoy.parsed); g != w {
		t.Errorf("rules %s, envoy.yaml has %s", g, w)
	}
}

func TestIstioWasmPluginMutations(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "istio", "wasmplugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		old, new    string
		expectedErr string
	}{
		{name: "unknown phase", old: "phase: AUTHZ", new: "phase: RATELIMIT", expectedErr: "RATELIMIT"},
		{name: "spec field typo", old: "imagePullPolicy:", new: "imagePullPolicyy:", expectedErr: "imagePullPolicyy"},
		{name: "envelope field typo", old: "metadata:", new: "metdata:", expectedErr: "metdata"},
		{name: "wrong kind", old: "kind: WasmPlugin", new: "kind: EnvoyFilter", expectedErr: "EnvoyFilter"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := string(doc)
			if !strings.Contains(s, tt.old) {
				t.Fatalf("wasmplugin.yaml no longer contains %q; update the test", tt.old)
			}
			_, _, err := parseWasmPlugin([]byte(strings.Replace(s, tt.old, tt.new, 1)))
			if err == nil || !strings.Contains(err.Error(), tt.expectedErr) {
				t.Errorf("error %v, want one containing %q", err, tt.expectedErr)
			}
		})
	}
}

func ruleNames(c *config.Config) string {
	var names []string
	for _, r := range c.Rules() {
		names = append(names, r.Name)
	}
	return strings.Join(names, ",")
}
