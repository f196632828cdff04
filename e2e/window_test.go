package e2e

import (
	"math"
	"strconv"
	"strings"
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

// TestFixedWindowStartModesThroughTheModule: for each start mode, through
// the built module on two workers, a drained key is refused until the
// window start the module stored and gets the limit (3) just after it,
// whichever worker serves it; after idle windows the rollover stops at the
// capacity (5).
func TestFixedWindowStartModesThroughTheModule(t *testing.T) {
	for _, mode := range []string{"aligned", "hash", "random"} {
		t.Run(mode, func(t *testing.T) {
			cfg := `{"name":"fw","limit_keys":["header:x-key"],"algorithm":"fixed_window",
				"algorithm_config":{"limit":3,"window_seconds":10,"capacity":5,"window_start":"` + mode + `"}}`
			clk := wasmhost.NewFakeClock(t0.Add(3500 * time.Millisecond))
			st := wasmhost.NewSharedData(false)
			_, srv := startHost(t, hostOpts(cfg, false, 2, clk, st))
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
			entries := st.Snapshot("tb:fw:")
			if len(entries) != 1 {
				t.Fatalf("stored %+v, want one fw key", entries)
			}
			_, last, _ := strings.Cut(entries[0].Value, ":")
			last, _, _ = strings.Cut(last, ":")
			startSec, err := strconv.ParseFloat(last, 64)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Unix(0, int64(math.Round(startSec*1e6))*1e3)
			if mode == "aligned" && !start.Equal(t0) {
				t.Errorf("aligned window start %v, want %v", start, t0)
			}
			if now := clk.Now(); start.After(now) || !start.After(now.Add(-10*time.Second)) {
				t.Fatalf("stored window start %v does not hold now %v", start, now)
			}
			clk.Set(start.Add(10*time.Second - time.Millisecond))
			if got := send(2); got != "44" {
				t.Errorf("1 ms before the next window: %s, want 429s", got)
			}
			clk.Set(start.Add(10*time.Second + time.Millisecond))
			if got := send(4); got != "2224" {
				t.Errorf("just after the window start: %s, want the limit, 3", got)
			}
			clk.Set(start.Add(90*time.Second + time.Millisecond))
			if got := send(6); got != "222224" {
				t.Errorf("after idle windows: %s, want the capacity 5, not more", got)
			}
		})
	}
}
