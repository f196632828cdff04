package wasmhost

import "testing"

func TestRegistryTypeConflict(t *testing.T) {
	r := newRegistry()
	a, err := r.define(MetricCounter, "x")
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.define(MetricCounter, "x")
	if err != nil || a != b {
		t.Fatalf("second define of the same counter: got %p, %v; want the same metric", b, err)
	}
	if _, err := r.define(MetricGauge, "x"); err == nil || err.Error() != `metric "x" already defined as a counter, not a gauge` {
		t.Fatalf("got %v, want a type conflict error", err)
	}
}
