package config_test

import (
	"testing"

	"github.com/tokengate/tokengate/bucket"
	"github.com/tokengate/tokengate/config"
)

// TestParseReservation: the effective reservation (Delay.Debt) is
// max_reserved capped by max_delay_ms × rate, and Parse puts it in the
// rule's bucket.Limit as Reserve and MaxDebt, the bucket's own debt.
func TestParseReservation(t *testing.T) {
	tests := []struct {
		name     string
		extra    string
		debt     float64
		expected bucket.Limit
	}{
		{"none", ``, 0, bucket.Limit{Rate: 10, Burst: 10}},
		{"zero", `,"max_reserved":0`, 0, bucket.Limit{Rate: 10, Burst: 10}},
		{"max_reserved", `,"max_reserved":5`, 5, bucket.Limit{Rate: 10, Burst: 10, MaxDebt: 5, Reserve: 5}},
		{"capped by max_delay_ms", `,"max_reserved":5,"max_delay_ms":250`, 2.5, bucket.Limit{Rate: 10, Burst: 10, MaxDebt: 2.5, Reserve: 2.5}},
		{"max_delay_ms above", `,"max_reserved":5,"max_delay_ms":1000`, 5, bucket.Limit{Rate: 10, Burst: 10, MaxDebt: 5, Reserve: 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(`{"name":"g","algorithm_config":{"rps":10,"burst":10` + tc.extra + `}}`))
			if err != nil {
				t.Fatal(err)
			}
			r := cfg.Rules()[0]
			if r.Delay.Debt != tc.debt || r.Limit != tc.expected {
				t.Errorf("got debt %v, limit %+v; want %v, %+v", r.Delay.Debt, r.Limit, tc.debt, tc.expected)
			}
		})
	}
}
