package wasmhost

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// Metric is a snapshot of one metric the filter defined.
type Metric struct {
	// Name is the name the filter passed to proxy_define_metric.
	Name string
	// Type is the metric kind.
	Type MetricType
	// Value is the counter or gauge value; for a histogram, the number of
	// recorded values.
	Value uint64
	// Sum is the sum of a histogram's recorded values; 0 otherwise.
	Sum uint64
}

// metric is one process-wide stat, shared by every worker VM that defines
// the same name, like an Envoy stat in the wasm stats scope.
type metric struct {
	name  string
	typ   MetricType
	value atomic.Uint64 // counter, gauge; histogram count
	sum   atomic.Uint64 // histogram only
}

// registry holds the host's metrics by name.
type registry struct {
	mu      sync.Mutex
	metrics map[string]*metric
}

func newRegistry() *registry {
	return &registry{metrics: make(map[string]*metric)}
}

// define returns the metric called name, creating it with type t. A name
// already defined with another type is an error.
func (r *registry) define(t MetricType, name string) (*metric, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.metrics[name]; ok {
		if m.typ != t {
			return nil, fmt.Errorf("metric %q already defined as a %s, not a %s", name, m.typ, t)
		}
		return m, nil
	}
	m := &metric{name: name, typ: t}
	r.metrics[name] = m
	return m, nil
}

func (r *registry) get(name string) (*metric, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m, ok := r.metrics[name]
	return m, ok
}

// snapshot returns every metric sorted by name.
func (r *registry) snapshot() []Metric {
	r.mu.Lock()
	out := make([]Metric, 0, len(r.metrics))
	for _, m := range r.metrics {
		out = append(out, Metric{Name: m.name, Type: m.typ, Value: m.value.Load(), Sum: m.sum.Load()})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Metric IDs encode the metric type in their two low bits, as Envoy's
// Wasm::kMetricTypeMask and kMetricIdIncrement do; IDs are per VM.
const (
	metricTypeMask    = 0x3
	metricIDIncrement = 0x4
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
func WritePrometheus(w io.Writer, metrics []Metric) error {
	sorted := append([]Metric(nil), metrics...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	bw := bufio.NewWriter(w)
	for _, m := range sorted {
		name, ok := PrometheusName(m.Name)
		if !ok {
			continue
		}
		fmt.Fprintf(bw, "# TYPE %s %s\n", name, m.Type)
		switch m.Type {
		case MetricHistogram:
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
func FormatPrometheus(metrics []Metric) string {
	var b strings.Builder
	_ = WritePrometheus(&b, metrics) // a strings.Builder never fails
	return b.String()
}
