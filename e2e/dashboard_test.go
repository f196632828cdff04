package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/proxy"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/redistest"
)

// The Grafana dashboard (deploy/grafana/tokengate.json) is checked against
// live scrapes: every metric a panel's PromQL names must be in the metrics
// tokengate-rls serves or in those the module defines, as Envoy's
// /stats/prometheus names them with envoy.yaml's stats_tags.

// dashboardPath is the dashboard, from e2e/.
const dashboardPath = "../deploy/grafana/tokengate.json"

// promqlKeywords are the words of PromQL that are not metric names when
// not followed by '(' (aggregations and functions always are).
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true, "without": true,
	"on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true, "atan2": true,
}

// labelLists are the keywords whose parenthesised list names labels.
var labelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlMetricNames returns the metric names expr uses, roughly but safely:
// identifiers outside label matchers ({...}), range and subquery brackets
// ([...]) and strings, not followed by '(' (a function or an aggregation),
// nor by "by" or "without" (an aggregation's clause), not a keyword, not
// a Grafana variable ($x) and not in the label list of by, without, on,
// ignoring, group_left or group_right.
func promqlMetricNames(expr string) []string {
	var names []string
	isStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isPart := func(c byte) bool { return isStart(c) || c >= '0' && c <= '9' }
	skipTo := func(i int, open, close byte) int { // past the matching close, strings skipped
		depth := 0
		for ; i < len(expr); i++ {
			switch expr[i] {
			case '"', '\'', '`':
				i = skipString(expr, i) - 1
			case open:
				depth++
			case close:
				if depth == 0 {
					return i + 1
				}
				depth--
			}
		}
		return len(expr)
	}
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			i = skipString(expr, i)
		case c == '{':
			i = skipTo(i+1, '{', '}')
		case c == '[':
			i = skipTo(i+1, '[', ']')
		case c == '$':
			i++
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '{' || expr[i] == '}') {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isPart(expr[i]) || expr[i] == '.') {
				i++
			}
		case isStart(c):
			j := i
			for j < len(expr) && isPart(expr[j]) {
				j++
			}
			word := expr[i:j]
			k := j
			for k < len(expr) && (expr[k] == ' ' || expr[k] == '\t' || expr[k] == '\n') {
				k++
			}
			next := k
			for next < len(expr) && isPart(expr[next]) {
				next++
			}
			switch after := strings.ToLower(expr[k:next]); {
			case after == "by" || after == "without":
				// an aggregation with its clause first: sum by (x) (...)
			case labelLists[strings.ToLower(word)] && k < len(expr) && expr[k] == '(':
				j = skipTo(k+1, '(', ')') // a list of labels
			case k < len(expr) && expr[k] == '(':
				// a function or an aggregation: its arguments are read on
			case promqlKeywords[strings.ToLower(word)]:
			default:
				names = append(names, word)
			}
			i = j
		default:
			i++
		}
	}
	return names
}

// skipString returns the index past the string literal starting at i.
func skipString(s string, i int) int {
	q := s[i]
	for i++; i < len(s); i++ {
		switch {
		case s[i] == '\\' && q != '`':
			i++
		case s[i] == q:
			return i + 1
		}
	}
	return len(s)
}

// dashboardExprs returns every panel's PromQL (rows' nested panels too),
// each with the title of its panel.
func dashboardExprs(t testing.TB, dash []byte) map[string][]string {
	t.Helper()
	type panel struct {
		Title   string            `json:"title"`
		Targets []json.RawMessage `json:"targets"`
		Panels  []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	out := map[string][]string{}
	var walk func([]json.RawMessage)
	walk = func(ps []json.RawMessage) {
		for _, raw := range ps {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("dashboard panel: %v", err)
			}
			for _, tr := range p.Targets {
				var target struct {
					Expr string `json:"expr"`
				}
				if err := json.Unmarshal(tr, &target); err != nil {
					t.Fatalf("panel %q: target: %v", p.Title, err)
				}
				if target.Expr == "" {
					t.Errorf("panel %q: a target without a PromQL expression", p.Title)
					continue
				}
				out[p.Title] = append(out[p.Title], target.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// missingMetrics returns "panel: metric" for every metric a panel of dash
// names that scraped lacks, sorted; and the number of names checked.
func missingMetrics(t testing.TB, dash []byte, scraped map[string]bool) ([]string, int) {
	t.Helper()
	var missing []string
	n := 0
	for title, exprs := range dashboardExprs(t, dash) {
		for _, e := range exprs {
			names := promqlMetricNames(e)
			if len(names) == 0 {
				missing = append(missing, title+": names no metric in "+e)
			}
			for _, name := range names {
				n++
				if !scraped[name] {
					missing = append(missing, title+": "+name)
				}
			}
		}
	}
	sort.Strings(missing)
	return slices.Compact(missing), n
}

// scrapeNames adds to names the sample names of a Prometheus text
// exposition (histograms' _bucket, _sum and _count included).
func scrapeNames(names map[string]bool, text string) {
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
}

// envoyRuleTag is envoy.yaml's stats_tags regex for the "rule" tag.
func envoyRuleTag(t testing.TB) *regexp.Regexp {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)tag_name: rule\s+regex: '([^']+)'`).FindSubmatch(b)
	if m == nil {
		t.Fatal("envoy.yaml: no stats_tags regex for the tag rule")
	}
	return regexp.MustCompile(string(m[1]))
}

// envoyPrometheus is the module's metrics as Envoy's /stats/prometheus
// prints them with envoy.yaml's stats_tags: the tag's first capture group
// cut out of wasmcustom.<name>, the namespace dropped, the rest sanitised
// (proxy.PrometheusName), the rule a label.
func envoyPrometheus(t testing.TB, ms []wasmhost.Metric) string {
	tag := envoyRuleTag(t)
	var b strings.Builder
	for _, m := range ms {
		full := "wasmcustom." + m.Name
		label := ""
		if loc := tag.FindStringSubmatchIndex(full); len(loc) >= 6 {
			label = `{rule="` + full[loc[4]:loc[5]] + `"}`
			full = full[:loc[2]] + full[loc[3]:]
		}
		name, ok := proxy.PrometheusName(strings.TrimPrefix(full, "wasmcustom."))
		if !ok {
			continue
		}
		b.WriteString(name + label + " 0\n")
	}
	return b.String()
}

// TestPromQLMetricNames: the rough PromQL reader finds the metric names
// and nothing else (functions, aggregations, label names in matchers and
// in by/without/on lists, keywords, numbers, durations, strings, Grafana
// variables).
func TestPromQLMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (rule, code) (rate(tokengate_rls_decisions_total{rule=~"$rule",code="ok"}[$__rate_interval]))`, []string{"tokengate_rls_decisions_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(x_seconds_bucket[5m])))`, []string{"x_seconds_bucket"}},
		{`sum(rate(a[1m])) / sum without (instance) (rate(b{c="d}"}[1m])) > bool 0.5`, []string{"a", "b"}},
		{`a and on (job) group_left (rule) b offset 5m or c unless d`, []string{"a", "b", "c", "d"}},
		{`sum(increase(q_total{rule=~"$rule"}[1h])) by (rule, threshold)`, []string{"q_total"}},
		{`label_replace(up, "x", "$1", "job", "(.*)") * 1e3`, []string{"up"}},
		{`count(count by (rule) (tokengate_rule_allowed))`, []string{"tokengate_rule_allowed"}},
		{`vector(1)`, nil},
	} {
		if got := promqlMetricNames(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// TestDashboardCheckFindsMissing: the check fails a dashboard whose panel
// names a metric the scrape lacks (and passes the same dashboard when the
// scrape has it), so the live check below can fail.
func TestDashboardCheckFindsMissing(t *testing.T) {
	dash := []byte(`{"panels":[{"type":"row","title":"r","panels":[
	  {"title":"ok","targets":[{"expr":"sum by (rule) (rate(tokengate_rls_decisions_total{code=\"ok\"}[5m]))"}]},
	  {"title":"typo","targets":[{"expr":"rate(tokengate_rls_decision_total[5m])"}]}]}]}`)
	scraped := map[string]bool{}
	scrapeNames(scraped, "# TYPE tokengate_rls_decisions_total counter\ntokengate_rls_decisions_total{rule=\"a\",code=\"ok\"} 3\n")
	missing, n := missingMetrics(t, dash, scraped)
	if want := []string{"typo: tokengate_rls_decision_total"}; !slices.Equal(missing, want) || n != 2 {
		t.Errorf("got %q after %d names, want %q after 2", missing, n, want)
	}
	scraped["tokengate_rls_decision_total"] = true
	if missing, _ := missingMetrics(t, dash, scraped); len(missing) != 0 {
		t.Errorf("with every metric scraped: got %q, want none", missing)
	}
	// The real dashboard against an empty scrape: every name is missing.
	real, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	missing, n = missingMetrics(t, real, map[string]bool{})
	if n == 0 || len(missing) == 0 {
		t.Errorf("the dashboard against no metrics: %d names checked, %d missing", n, len(missing))
	}
}

// dashboardConfig has a local rule, a cluster token bucket, a quota with
// thresholds and an LLM rule settled after the response, so that every
// metric family the dashboard shows has a series; on_error "allow" makes a
// Redis failure a fail-open.
const dashboardConfig = `{"rules":[
  {"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000,"burst":1000}},
  {"name":"api-rate","scope":"cluster","limit_keys":["header:x-api-key"],"match":{"path":"/api"},
   "algorithm_config":{"tokens_per_second":1e-7,"burst":3}},
  {"name":"monthly","scope":"cluster","algorithm":"quota","limit_keys":["header:x-api-key"],"match":{"path":"/api"},
   "algorithm_config":{"limit":4,"period":"month","thresholds":[0.5,0.75]}},
  {"name":"llm","scope":"cluster","limit_keys":["header:x-api-key"],"match":{"path":"/llm"},
   "algorithm_config":{"tokens_per_second":1e-7,"burst":100,"cost_source":"response_json:/usage/total_tokens","pre_charge":1}}],
 "settings":{"rls":{"cluster":"ratelimit","timeout_ms":5000,"on_error":"allow"}}}`

// TestDashboardMetricsExist starts tokengate-rls on a real Redis and the
// built module in the local host, drives admitted, rejected, near-quota,
// settled and failed (Redis killed) traffic, scrapes the service's
// /metrics and the module's metrics as Envoy names them, and checks that
// every metric every panel names is there.
func TestDashboardMetricsExist(t *testing.T) {
	dash, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	redis := redistest.Start(t)
	rls := startTokengateRLS(t, dashboardConfig, redis.Addr, "-redis-timeout", "500ms")
	h, srv := startSettleFleetHost(t, dashboardConfig, rlsBootstrap(rls.Addr), &billingUpstream{})
	c := srv.Client()
	send := func(path string) int {
		t.Helper()
		r := mustDo(t, c, srv, path, map[string]string{"x-api-key": "k"})
		return r.status
	}
	saw429 := false
	for i := 0; i < 6; i++ {
		saw429 = send("/api") == 429 || saw429
	}
	if !saw429 {
		t.Fatal("no request was rejected")
	}
	send("/llm?tokens=40")
	waitFor(t, func() bool { v, _ := h.Metric("tokengate.rls_settle_calls"); return v >= 1 })
	redis.Kill()
	if got := send("/api?k=2"); got != 200 {
		t.Fatalf("with Redis down and on_error allow: status %d, want 200", got)
	}
	waitFor(t, func() bool { v, _ := h.Metric("tokengate.rls_errors"); return v >= 1 })

	scraped := map[string]bool{}
	resp, err := http.Get("http://" + rls.Admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", resp.StatusCode, err)
	}
	scrapeNames(scraped, string(body))
	scrapeNames(scraped, envoyPrometheus(t, h.Metrics()))
	missing, n := missingMetrics(t, dash, scraped)
	for _, m := range missing {
		t.Errorf("dashboard panel %s: not in the live scrape", m)
	}
	if n < 10 {
		t.Errorf("only %d metric names checked: the dashboard's panels were not read", n)
	}
	if t.Failed() {
		names := make([]string, 0, len(scraped))
		for k := range scraped {
			if strings.HasPrefix(k, "tokengate") {
				names = append(names, k)
			}
		}
		sort.Strings(names)
		t.Logf("scraped tokengate metrics:\n%s", strings.Join(names, "\n"))
	}
}
