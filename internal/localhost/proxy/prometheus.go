package proxy

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// PrometheusName returns the name Envoy's /stats/prometheus gives a wasm
// custom metric: Envoy defines it as "wasmcustom.<name>", strips the
// registered "wasmcustom" namespace on output and replaces every character
// outside [a-zA-Z0-9_] with '_'. It reports false for a name Envoy leaves
// out of the output (empty, or starting with a digit after sanitising).
//
// Envoy before custom stat namespaces (≤ 1.19) printed
// "envoy_wasmcustom_<name>" instead; Envoy ≥ 1.33, which tokengate
// requires, prints the bare sanitised name.
func PrometheusName(name string) (string, bool) {
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] >= '0' && b[0] <= '9' {
		return "", false
	}
	return string(b), true
}

// WritePrometheus writes metrics in the Prometheus text exposition format
// (version 0.0.4) the way Envoy's /stats/prometheus does for wasm custom
// metrics: counters and gauges as "# TYPE name counter|gauge" then
// "name value"; a histogram as its _count and _sum and a single +Inf bucket
// (the host does not keep bucket boundaries). Metrics are written in name
// order; names PrometheusName rejects are skipped.
func WritePrometheus(w io.Writer, metrics []wasmhost.Metric) error {
	sorted := append([]wasmhost.Metric(nil), metrics...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	bw := bufio.NewWriter(w)
	for _, m := range sorted {
		name, ok := PrometheusName(m.Name)
		if !ok {
			continue
		}
		fmt.Fprintf(bw, "# TYPE %s %s\n", name, m.Type)
		switch m.Type {
		case wasmhost.MetricHistogram:
			fmt.Fprintf(bw, "%s_bucket{le=\"+Inf\"} %d\n", name, m.Value)
			fmt.Fprintf(bw, "%s_sum %d\n", name, m.Sum)
			fmt.Fprintf(bw, "%s_count %d\n", name, m.Value)
		default:
			fmt.Fprintf(bw, "%s %d\n", name, m.Value)
		}
	}
	return bw.Flush()
}

// FormatPrometheus returns WritePrometheus's output as a string.
func FormatPrometheus(metrics []wasmhost.Metric) string {
	var b strings.Builder
	_ = WritePrometheus(&b, metrics) // a strings.Builder never fails
	return b.String()
}
