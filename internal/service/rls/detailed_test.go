package rls_test

import (
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokengate/tokengate/internal/service/rls"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// scrape parses the Prometheus text of m into series -> value, the series
// written as in the text (`name{label="v",...}`).
func scrape(t *testing.T, m *rls.Metrics) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range strings.Split(m.String(), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// detailedConfig is a drop-in domain with detailed_metric on a per-value
// limit, on a nested shadow limit, and off on a third limit.
func detailedConfig(t *testing.T) *rls.Config {
	t.Helper()
	minute := rlsv3.RateLimitResponse_RateLimit_MINUTE
	cfg, err := rls.NewDropinConfig([]*rls.Domain{{Name: "edge", Descriptors: []*rls.Descriptor{
		{Key: "user", RateLimit: &rls.RateLimit{RequestsPerUnit: 2, Unit: minute, DetailedMetric: true}},
		{Key: "path", RateLimit: &rls.RateLimit{RequestsPerUnit: 5, Unit: minute}},
		{Key: "tenant", Value: "acme", Descriptors: []*rls.Descriptor{
			{Key: "plan", RateLimit: &rls.RateLimit{RequestsPerUnit: 1, Unit: minute, Shadow: true, DetailedMetric: true}},
		}},
	}}}, rls.DropinOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func dropinAsk(t *testing.T, c rlsv3.RateLimitServiceClient, hits uint32, kv ...string) {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	req := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	if _, err := c.ShouldRateLimit(t.Context(), req); err != nil {
		t.Fatal(err)
	}
}

// TestDetailedMetric: a descriptor whose limit has detailed_metric is
// counted in series named by its values (envoyproxy/ratelimit's detailed
// stat key), beside its rule's; a limit without it has no such series.
// Before, detailed_metric was accepted and nothing was emitted.
func TestDetailedMetric(t *testing.T) {
	redis := redistest.Start(t)
	cfg := detailedConfig(t)
	m := rls.NewMetrics(cfg)
	c := serveClient(t, rls.NewServer(cfg, readyStore(t, redis.Addr), m))

	for range 3 {
		dropinAsk(t, c, 0, "user", "alice") // 2 ok, then over
	}
	dropinAsk(t, c, 2, "user", "bob") // 2 hits in one call
	dropinAsk(t, c, 0, "path", "/x")
	for range 2 {
		dropinAsk(t, c, 0, "tenant", "acme", "plan", "gold") // ok, then shadow over
	}

	got := scrape(t, m)
	series := func(name, rule, desc, code string) string {
		return name + `{code="` + code + `",descriptor="` + desc + `",rule="` + rule + `"}`
	}
	for _, w := range []struct {
		series string
		want   float64
	}{
		{series("tokengate_rls_detailed_decisions_total", "edge.user", "edge.user_alice", "ok"), 2},
		{series("tokengate_rls_detailed_decisions_total", "edge.user", "edge.user_alice", "over_limit"), 1},
		{series("tokengate_rls_detailed_hits_total", "edge.user", "edge.user_alice", "ok"), 2},
		{series("tokengate_rls_detailed_decisions_total", "edge.user", "edge.user_bob", "ok"), 1},
		{series("tokengate_rls_detailed_hits_total", "edge.user", "edge.user_bob", "ok"), 2},
		{series("tokengate_rls_detailed_decisions_total", "edge.user", "edge.user_bob", "over_limit"), 0},
		{series("tokengate_rls_detailed_decisions_total", "edge.tenant_acme.plan", "edge.tenant_acme.plan_gold", "ok"), 1},
		{series("tokengate_rls_detailed_decisions_total", "edge.tenant_acme.plan", "edge.tenant_acme.plan_gold", "shadow_over_limit"), 1},
		{`tokengate_rls_decisions_total{code="ok",rule="edge.user"}`, 3},
		{`tokengate_rls_decisions_total{code="over_limit",rule="edge.user"}`, 1},
		{`tokengate_rls_decisions_total{code="ok",rule="edge.path"}`, 1},
		{"tokengate_rls_detailed_descriptors", 3},
		{"tokengate_rls_detailed_overflow_total", 0},
	} {
		if v, ok := got[w.series]; !ok || v != w.want {
			t.Errorf("%s: got %v (present %v), want %v", w.series, v, ok, w.want)
		}
	}
	for s := range got {
		if strings.Contains(s, "edge.path_") {
			t.Errorf("a limit without detailed_metric has a detailed series: %s", s)
		}
	}
}

// TestDetailedMetricCap: a client spraying 10,000 distinct values over a
// detailed_metric limit gets series for the first cap descriptors only;
// the others are counted, all of them, in the rule's overflow series, and
// the number of series stays bounded.
func TestDetailedMetricCap(t *testing.T) {
	const capN, spray = 50, 10000
	redis := redistest.Start(t)
	cfg := detailedConfig(t)
	m := rls.NewMetrics(cfg)
	m.SetDetailedLimit(capN)
	c := serveClient(t, rls.NewServer(cfg, readyStore(t, redis.Addr), m))

	for i := range spray {
		dropinAsk(t, c, 0, "user", "u"+strconv.Itoa(i))
	}
	got := scrape(t, m)
	descs := map[string]bool{}
	var total float64
	for s, v := range got {
		if !strings.HasPrefix(s, "tokengate_rls_detailed_decisions_total{") {
			continue
		}
		_, d, _ := strings.Cut(s, `descriptor="`)
		d, _, _ = strings.Cut(d, `"`)
		descs[d] = true
		total += v
	}
	if len(descs) != capN+1 || !descs[rls.DetailedOverflow] {
		t.Errorf("%d descriptors with series (overflow %v), want %d and the overflow", len(descs), descs[rls.DetailedOverflow], capN)
	}
	if total != spray {
		t.Errorf("detailed decisions %v in all, want %d: every decision is counted", total, spray)
	}
	if v := got[`tokengate_rls_detailed_decisions_total{code="ok",descriptor="`+rls.DetailedOverflow+`",rule="edge.user"}`]; v != spray-capN {
		t.Errorf("overflow series %v, want %d", v, spray-capN)
	}
	if v := got["tokengate_rls_detailed_overflow_total"]; v != spray-capN {
		t.Errorf("tokengate_rls_detailed_overflow_total %v, want %d", v, spray-capN)
	}
	if v := got["tokengate_rls_detailed_descriptors"]; v != capN {
		t.Errorf("tokengate_rls_detailed_descriptors %v, want %d", v, capN)
	}
}
