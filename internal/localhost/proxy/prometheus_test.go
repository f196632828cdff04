package proxy

import (
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

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
	got := FormatPrometheus([]wasmhost.Metric{
		{Name: "tokengate.requests_denied", Type: wasmhost.MetricCounter, Value: 3},
		{Name: "tokengate.fail_open", Type: wasmhost.MetricCounter, Value: 0},
		{Name: "tokengate.keys", Type: wasmhost.MetricGauge, Value: 12},
		{Name: "tokengate.attempts", Type: wasmhost.MetricHistogram, Value: 2, Sum: 5},
		{Name: "0bad", Type: wasmhost.MetricCounter, Value: 1},
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
