package e2e

import (
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/wasmhost"
)

// TestFixedWindowThroughTheModule runs a fixed window (3 a 10-second
// window, capacity 5, aligned) through the built module on two workers:
// the capacity, then 429s until the window start, then the limit.
func TestFixedWindowThroughTheModule(t *testing.T) {
	const cfg = `{"name":"fw","limit_keys":["header:x-key"],"algorithm":"fixed_window",
		"algorithm_config":{"limit":3,"window_seconds":10,"capacity":5}}`
	clk := wasmhost.NewFakeClock(t0.Add(2 * time.Second)) // t0 is a multiple of 10 s
	_, srv := startHost(t, hostOpts(cfg, false, 2, clk, nil))
	send := func(n int) string {
		out := ""
		for range n {
			resp, _ := get(t, srv, "/", map[string]string{"x-key": "k"})
			out += string(rune('0' + resp.StatusCode/100))
		}
		return out
	}
	if got := send(6); got != "222224" {
		t.Fatalf("new key: %s, want the capacity 5 then 429", got)
	}
	clk.Advance(7900 * time.Millisecond) // 9.9 s into the window
	if got := send(1); got != "4" {
		t.Errorf("before the window start: %s", got)
	}
	clk.Advance(100 * time.Millisecond)
	if got := send(4); got != "2224" {
		t.Errorf("at the window start: %s, want the limit 3", got)
	}
}
