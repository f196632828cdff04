package e2e

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestPrometheusNames pins, for docs/observability.md, the metric names the filter
// defines and the names the host's /stats (proxy.WritePrometheus, what
// tokengate-local serves) prints for them: Envoy >= 1.20 without stats_tags
// strips the "wasmcustom." namespace and turns every character outside
// [A-Za-z0-9_] into '_', with no "envoy_" prefix (with envoy.yaml's
// stats_tags Envoy instead prints tokengate_rule_<counter>{rule="per-ip"};
// this host does not apply tag extraction).
func TestPrometheusNames(t *testing.T) {
	clk := wasmhost.NewFakeClock(t0)
	h, srv := startHost(t, hostOpts(perIPConfig, false, 2, clk, nil))
	// Every per-rule counter, exactly; the plugin-wide counters listed here
	// at least.
	counters := []string{"allowed", "cas_retries", "contention", "descriptor_missing", "fail_open", "rejected", "shadow_rejected",
		"slot_collisions", "slot_takeovers", "store_denied"}
	plugin := []string{"config_rejected", "corrupt_state", "local_state", "panics", "seed_errors"}

	wantRule := map[string]string{} // defined name → Prometheus name
	for _, c := range counters {
		wantRule["tokengate.rule.per-ip."+c] = "tokengate_rule_per_ip_" + c
	}
	wantPlugin := map[string]string{}
	for _, n := range plugin {
		wantPlugin["tokengate."+n] = "tokengate_" + n
	}
	for range 11 {
		mustDo(t, srv.Client(), srv, "/", nil)
	}
	text := proxy.FormatPrometheus(h.Metrics())
	samples, types := parsePrometheus(t, text)

	gotRule := map[string]string{}
	var all []string
	for _, m := range h.Metrics() {
		prom, ok := proxy.PrometheusName(m.Name)
		all = append(all, m.Name+" → "+prom)
		if !ok || m.Type != wasmhost.MetricCounter || types[prom] != "counter" {
			t.Errorf("%s: Prometheus name %q (ok %v), type %s / %q, want a counter", m.Name, prom, ok, m.Type, types[prom])
		}
		if _, ok := samples[prom]; !ok {
			t.Errorf("%s: no sample %s in the exposition", m.Name, prom)
		}
		switch {
		case strings.HasPrefix(m.Name, "tokengate.rule."):
			gotRule[m.Name] = prom
		case !strings.HasPrefix(m.Name, "tokengate.") || strings.Contains(m.Name[len("tokengate."):], "."):
			t.Errorf("unexpected metric name %q", m.Name)
		}
	}
	if !reflect.DeepEqual(gotRule, wantRule) {
		t.Errorf("per-rule metrics:\ngot  %v\nwant %v", gotRule, wantRule)
	}
	for name, prom := range wantPlugin {
		if _, ok := samples[prom]; !ok {
			t.Errorf("plugin-wide %s: no sample %s", name, prom)
		}
	}
	for _, want := range []string{
		"# TYPE tokengate_rule_per_ip_allowed counter\ntokengate_rule_per_ip_allowed 10\n",
		"# TYPE tokengate_rule_per_ip_rejected counter\ntokengate_rule_per_ip_rejected 1\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("exposition lacks %q:\n%s", want, text)
		}
	}
	sort.Strings(all)
	t.Logf("names:\n%s", strings.Join(all, "\n"))
}

// TestRuleNamesCollideInPrometheus pins a naming bug: rule names may contain
// '-' and '_', and the configuration accepts "per-ip" and "per_ip" as two
// distinct rules, but both rules' counters get the same Prometheus name
// (tokengate_rule_per_ip_allowed, ...) in /stats/prometheus (Envoy without
// the stats_tags of envoy.yaml, and this host), so the exposition holds
// duplicate metric families, which Prometheus rejects. The configuration
// should refuse names that differ only by '-' versus '_' (or the metric
// names should not depend on that difference).
func TestRuleNamesCollideInPrometheus(t *testing.T) {
	cfg := `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":5,"burst":10}},` +
		`{"name":"per_ip","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":5,"burst":10}}]}`
	h, err := wasmhost.New(context.Background(), wasmhost.Options{Wasm: loadModule(t), PluginConfig: []byte(cfg), Workers: 2,
		Store: wasmhost.NewSharedData(false), LogSink: func(wasmhost.LogLevel, string) {}})
	if err != nil {
		return // refused: fine
	}
	defer closeHost(t, h)
	seen := map[string]int{}
	for _, line := range strings.Split(proxy.FormatPrometheus(h.Metrics()), "\n") {
		if strings.HasPrefix(line, "# TYPE ") {
			seen[strings.Fields(line)[2]]++
		}
	}
	var dups []string
	for n, k := range seen {
		if k > 1 {
			dups = append(dups, n)
		}
	}
	sort.Strings(dups)
	if len(dups) > 0 {
		t.Errorf("rules \"per-ip\" and \"per_ip\" were both accepted and share %d Prometheus metric families: %q", len(dups), dups)
	}
}
