package e2e

import (
	"context"
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// TestGuestSteadyStateAllocations counts what the built module allocates
// on its Go heap per request once warm, read from the guest's own counters
// (the tokengate_debug_heap_alloc_* exports): nothing, allowed or rejected.
// Every value the host returns lives in the binding's arena, and the
// shared-data keys and the reply's header values are views of reused
// buffers.
//
// The clock is a fake one that stands still: what is counted is per
// request. On the real clock the verdict depended on the machine's speed:
// once a second of the clock has passed the module makes one more
// shared-data read (and allocates 2 objects, 32 bytes), so a machine slow
// enough to spend more than a second on the 2,000 requests failed.
func TestGuestSteadyStateAllocations(t *testing.T) {
	const rule = `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}`
	cases := []struct {
		name, config  string
		addrs         int
		status        int
		wantHostCalls int
	}{
		// An admitted request: the clock, the client address, a get and
		// a set of its bucket, a counter, and five response headers (the
		// upstream's RateLimit lines are not read: ours are added).
		{"one rule", rule, 1, 200, 9},
		{"four rules", `{"rules":[` + rule + `,
			{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1000000,"burst":1000000}},
			{"name":"per-route","limit_keys":["method","path"],"algorithm_config":{"rps":1000000,"burst":1000000}},
			{"name":"global","algorithm_config":{"rps":1000000,"burst":1000000}}]}`, 1, 200, 21},
		{"many clients", rule, 5000, 200, -1},
		{"rejected", `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":1}}`, 1, 429, 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := wasmhost.NewFakeClock(t0)
			h, err := wasmhost.New(context.Background(), wasmhost.Options{
				Wasm: loadModule(t), PluginConfig: []byte(c.config), Workers: 1, Walltime: clk.Walltime, Nanotime: clk.Nanotime,
				LogSink: func(wasmhost.LogLevel, string) {}, MinLogLevel: wasmhost.LogCritical, DisableTicks: true,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close(context.Background())
			ex := &wasmhost.Exchange{Request: []wasmhost.Header{
				{Name: ":authority", Value: "api.example.com"}, {Name: ":path", Value: "/api/items"},
				{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
				{Name: "x-api-key", Value: "key-0123456789"},
			}}
			addr := func(i int) string {
				i %= c.addrs
				return "10.1." + strconv.Itoa(i>>8) + "." + strconv.Itoa(i&255) + ":40000"
			}
			run := func(i int) wasmhost.ExchangeResult {
				ex.RemoteAddr = addr(i)
				res, err := h.Exchange(0, ex)
				if err != nil {
					t.Fatal(err)
				}
				return res
			}
			// Warm up: every client's slot exists and the scratch buffers
			// have grown to their size.
			for i := range c.addrs + 100 {
				run(i)
			}
			before, err := h.GuestMemory(0)
			if err != nil {
				t.Fatal(err)
			}
			const n = 2000
			for i := range n {
				res := run(i)
				if res.Status != c.status {
					t.Fatalf("request %d: status %d, want %d", i, res.Status, c.status)
				}
				if c.wantHostCalls >= 0 && res.HostCalls != c.wantHostCalls {
					t.Fatalf("request %d: %d host calls, want %d", i, res.HostCalls, c.wantHostCalls)
				}
			}
			after, err := h.GuestMemory(0)
			if err != nil {
				t.Fatal(err)
			}
			if objs := after.HeapAllocObjects - before.HeapAllocObjects; objs != 0 {
				t.Errorf("%d requests allocated %d objects (%d bytes) on the guest heap; want none",
					n, objs, after.HeapAllocBytes-before.HeapAllocBytes)
			}
		})
	}
}
