package wasmhost

import (
	"fmt"
	"sort"
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
