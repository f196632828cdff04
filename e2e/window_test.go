package e2e

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
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

// windowStart parses the window start stored in a fixed window's value
// ("tokens:window_start[:...]").
func windowStart(t *testing.T, value string) float64 {
	t.Helper()
	_, rest, _ := strings.Cut(value, ":")
	start, _, _ := strings.Cut(rest, ":")
	f, err := strconv.ParseFloat(start, 64)
	if err != nil {
		t.Fatalf("stored value %q: %v", value, err)
	}
	return f
}

// TestFixedWindowRandomSpread: with "random" starts, through the module on
// two workers, 60 keys get 60 different window offsets spread over the
// window (an aligned rule would give them one), each drawn once by the
// worker that created the key and kept when the other worker serves it.
func TestFixedWindowRandomSpread(t *testing.T) {
	const keys, window = 60, 10.0
	for _, mode := range []string{"random", "aligned"} {
		t.Run(mode, func(t *testing.T) {
			cfg := `{"name":"fw","limit_keys":["header:x-key"],"algorithm":"fixed_window",
				"algorithm_config":{"limit":3,"window_seconds":10,"window_start":"` + mode + `"}}`
			clk := wasmhost.NewFakeClock(t0.Add(3500 * time.Millisecond))
			st := wasmhost.NewSharedData(false)
			_, srv := startHost(t, hostOpts(cfg, false, 2, clk, st))
			created := map[string]float64{} // window start by stored key
			for k := range keys {
				key := "k" + strconv.Itoa(k)
				// Round robin: the first request of a key is served by one
				// worker, the second by the other.
				var stored string
				for i := range 2 {
					if resp, _ := get(t, srv, "/", map[string]string{"x-key": key}); resp.StatusCode != 200 {
						t.Fatalf("key %s request %d: %d", key, i, resp.StatusCode)
					}
					for _, e := range st.Snapshot("tb:fw:") {
						if _, seen := created[e.Key]; i == 0 && !seen {
							stored = e.Key
							created[e.Key] = windowStart(t, e.Value)
						} else if i == 1 && e.Key == stored && windowStart(t, e.Value) != created[stored] {
							t.Errorf("key %s: window start %v after the other worker served it, %v when created",
								key, windowStart(t, e.Value), created[stored])
						}
					}
				}
				if len(created) != k+1 {
					t.Fatalf("after key %s, %d stored keys, want %d", key, len(created), k+1)
				}
			}
			offsets := map[int64]bool{}
			lo, hi := window, 0.0
			for _, start := range created {
				off := math.Mod(start, window)
				offsets[int64(math.Round(off*1e6))] = true
				lo, hi = min(lo, off), max(hi, off)
			}
			switch mode {
			case "aligned":
				if len(offsets) != 1 || lo != 0 {
					t.Errorf("aligned: offsets %v, want one, 0", offsets)
				}
			case "random":
				// 60 uniform draws in microseconds: a repeat, or all of them
				// within half the window, would happen far less than once in
				// a billion runs.
				if len(offsets) != keys || hi-lo < window/2 {
					t.Errorf("random: %d distinct offsets of %d keys, from %.3f to %.3f s: not spread over the window", len(offsets), keys, lo, hi)
				}
			}
		})
	}
}

// TestFixedWindowWithTokenBucket: a fixed window and a token bucket on one
// request, through the module, are all-or-nothing: the request one of them
// rejects takes nothing from the other.
func TestFixedWindowWithTokenBucket(t *testing.T) {
	tests := []struct {
		name               string
		limit, burst       int
		sent               int
		statuses           string
		wantWindow, wantTB float64
	}{
		// The window (3) runs out first: the bucket keeps what the fourth
		// and fifth requests would have taken.
		{name: "window rejects", limit: 3, burst: 5, sent: 5, statuses: "22244", wantWindow: 0, wantTB: 2},
		// The bucket (2) runs out first: the window keeps its third token.
		{name: "bucket rejects", limit: 3, burst: 2, sent: 4, statuses: "2244", wantWindow: 1, wantTB: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := `{"rules":[
				{"name":"fw","algorithm":"fixed_window","algorithm_config":{"limit":` + strconv.Itoa(tc.limit) + `,"window_seconds":60}},
				{"name":"tb","algorithm_config":{"rps":0.001,"burst":` + strconv.Itoa(tc.burst) + `}}]}`
			clk := wasmhost.NewFakeClock(t0.Add(time.Second))
			st := wasmhost.NewSharedData(false)
			_, srv := startHost(t, hostOpts(cfg, false, 2, clk, st))
			got := ""
			for range tc.sent {
				resp, _ := get(t, srv, "/", nil)
				got += string(rune('0' + resp.StatusCode/100))
			}
			if got != tc.statuses {
				t.Errorf("statuses %s, want %s", got, tc.statuses)
			}
			for _, want := range []struct {
				key    string
				tokens float64
			}{{"tb:fw:", tc.wantWindow}, {"tb:tb:", tc.wantTB}} {
				v := st.Snapshot(want.key)
				if len(v) != 1 {
					t.Fatalf("stored %+v under %s", v, want.key)
				}
				tokens, _, _ := strings.Cut(v[0].Value, ":")
				if f, err := strconv.ParseFloat(tokens, 64); err != nil || math.Abs(f-want.tokens) > 1e-3 {
					t.Errorf("%s holds %q tokens, want %v: a rejected request took from it", want.key, tokens, want.tokens)
				}
			}
		})
	}
}

// TestFixedWindowMaxKeys: a fixed window with max_keys 4, through the
// module, keeps at most 4 stored keys however many clients come, and
// still limits each client that holds a slot.
func TestFixedWindowMaxKeys(t *testing.T) {
	const cfg = `{"name":"fw","limit_keys":["header:x-key"],"max_keys":4,"algorithm":"fixed_window",
		"algorithm_config":{"limit":2,"window_seconds":60,"window_start":"hash"}}`
	clk := wasmhost.NewFakeClock(t0.Add(time.Second))
	st := wasmhost.NewSharedData(false)
	_, srv := startHost(t, hostOpts(cfg, false, 2, clk, st))
	for k := range 40 {
		get(t, srv, "/", map[string]string{"x-key": "client-" + strconv.Itoa(k)})
		if n := len(st.Snapshot("tb:fw:")); n > 4 {
			t.Fatalf("after %d clients, %d stored keys: over max_keys 4", k+1, n)
		}
	}
	// Sharing a slot can only make a limit stricter: the last client,
	// whether it owns a slot or shares another's, gets at most the one
	// request its limit (2 a window) has left.
	out := ""
	for range 3 {
		resp, _ := get(t, srv, "/", map[string]string{"x-key": "client-39"})
		out += string(rune('0' + resp.StatusCode/100))
	}
	if out != "244" && out != "444" {
		t.Errorf("client-39 after its first request: %s, want at most one more through", out)
	}
}
