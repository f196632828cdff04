package wasmhost

import "testing"

func TestPrometheusName(t *testing.T) {
	tests := []struct {
		input    string
		expected string
		ok       bool
	}{
		{"tokengate.requests_allowed", "tokengate_requests_allowed", true},
		{"tokengate.rule.api-read.denied", "tokengate_rule_api_read_denied", true},
		{"Already_Fine9", "Already_Fine9", true},
		{"9lives", "", false},
		{"", "", false},
		{"é", "__", true}, // two UTF-8 bytes, each replaced
	}
	for _, tc := range tests {
		t.Run(tc.input, func(t *testing.T) {
			got, ok := PrometheusName(tc.input)
			if got != tc.expected || ok != tc.ok {
				t.Errorf("PrometheusName(%q) = %q, %v; want %q, %v", tc.input, got, ok, tc.expected, tc.ok)
			}
		})
	}
}

func TestWritePrometheus(t *testing.T) {
	got := FormatPrometheus([]Metric{
		{Name: "tokengate.requests_denied", Type: MetricCounter, Value: 3},
		{Name: "tokengate.fail_open", Type: MetricCounter, Value: 0},
		{Name: "tokengate.keys", Type: MetricGauge, Value: 12},
		{Name: "tokengate.attempts", Type: MetricHistogram, Value: 2, Sum: 5},
		{Name: "0bad", Type: MetricCounter, Value: 1},
	})
	want := `# TYPE tokengate_attempts histogram
tokengate_attempts_bucket{le="+Inf"} 2
tokengate_attempts_sum 5
tokengate_attempts_count 2
# TYPE tokengate_fail_open counter
tokengate_fail_open 0
# TYPE tokengate_keys gauge
tokengate_keys 12
# TYPE tokengate_requests_denied counter
tokengate_requests_denied 3
`
	if got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

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
