// Command guestcalls profiles the built module by counting calls: it runs
// requests through one worker VM of the local host (internal/localhost/wasmhost, without HTTP)
// with a wazero function listener on every guest function and host import,
// and prints how many times each was called per request, most first.
//
// Call counts are exact and do not depend on the machine, which makes them
// a steady guide to where the guest's time goes: inside the wasm guest a Go
// function call, a map access or a defer costs tens of nanoseconds and an
// allocation hundreds (`go test -run '^$' -bench GuestPrimitives ./bench/`
// prices each construct). For time, use perf with a host built with -tags perfmap (see
// BENCHMARKS.md).
//
// Usage:
//
//	go run ./bench/cmd/guestcalls -config '{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "guestcalls:", err)
		}
		os.Exit(2)
	}
}

// counter is a wazero FunctionListenerFactory counting calls by name.
type counter struct{ calls map[string]uint64 }

func (c *counter) NewFunctionListener(def api.FunctionDefinition) experimental.FunctionListener {
	// The module is built without the wasm name section (-s -w): its
	// functions' debug names are indexes ("$12"), so an export goes by its
	// export name. The host's functions keep theirs ("env.proxy_log").
	name := strings.TrimPrefix(def.DebugName(), ".")
	if ex := def.ExportNames(); strings.HasPrefix(name, "$") && len(ex) > 0 {
		name = ex[0]
	}
	return experimental.FunctionListenerFunc(func(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
		c.calls[name]++
	})
}

// Profile is the outcome of one run: calls per request by function name.
type Profile struct {
	Requests int
	PerReq   map[string]float64
}

// Total returns the calls per request of every function together.
func (p Profile) Total() float64 {
	t := 0.0
	for _, v := range p.PerReq {
		t += v
	}
	return t
}

// Measure runs warm requests, then n counted ones, of path from addr
// through wasm configured with config.
func Measure(wasm, config []byte, path, addr string, n int) (Profile, error) {
	c := &counter{calls: map[string]uint64{}}
	// The listener must be in the context the module is compiled with.
	ctx := experimental.WithFunctionListenerFactory(context.Background(), c)
	h, err := wasmhost.New(ctx, wasmhost.Options{
		Wasm: wasm, PluginConfig: config, Workers: 1, DisableTicks: true,
		LogSink: func(wasmhost.LogLevel, string) {}, MinLogLevel: wasmhost.LogCritical,
	})
	if err != nil {
		return Profile{}, err
	}
	defer h.Close(context.Background())
	ex := &wasmhost.Exchange{RemoteAddr: addr, Request: []wasmhost.Header{
		{Name: ":authority", Value: "api.example.com"}, {Name: ":path", Value: path},
		{Name: ":method", Value: "GET"}, {Name: ":scheme", Value: "http"},
		{Name: "user-agent", Value: "guestcalls/1.0"}, {Name: "x-api-key", Value: "key-0123456789"},
	}}
	for range 20 {
		if _, err := h.Exchange(0, ex); err != nil {
			return Profile{}, err
		}
	}
	clear(c.calls)
	for range n {
		if _, err := h.Exchange(0, ex); err != nil {
			return Profile{}, err
		}
	}
	p := Profile{Requests: n, PerReq: make(map[string]float64, len(c.calls))}
	for name, v := range c.calls {
		p.PerReq[name] = float64(v) / float64(n)
	}
	return p, nil
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("guestcalls", flag.ContinueOnError)
	wasmPath := fs.String("wasm", "build/tokengate.wasm", "the filter module")
	config := fs.String("config", `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}`,
		"plugin configuration (JSON, or @file)")
	path := fs.String("path", "/api/items", "request :path")
	addr := fs.String("addr", "192.0.2.1:40000", "client address (source.address)")
	n := fs.Int("n", 1000, "requests counted")
	top := fs.Int("top", 50, "functions listed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg := []byte(*config)
	if name, ok := strings.CutPrefix(*config, "@"); ok {
		var err error
		if cfg, err = os.ReadFile(name); err != nil {
			return err
		}
	}
	wasm, err := os.ReadFile(*wasmPath)
	if err != nil {
		return err
	}
	p, err := Measure(wasm, cfg, *path, *addr, max(*n, 1))
	if err != nil {
		return err
	}
	names := make([]string, 0, len(p.PerReq))
	for name := range p.PerReq {
		names = append(names, name)
	}
	sort.Slice(names, func(i, j int) bool {
		if p.PerReq[names[i]] != p.PerReq[names[j]] {
			return p.PerReq[names[i]] > p.PerReq[names[j]]
		}
		return names[i] < names[j]
	})
	fmt.Fprintf(stdout, "%d requests; %.1f calls per request into %d functions (guest functions and host imports)\n",
		p.Requests, p.Total(), len(names))
	for i, name := range names {
		if i == *top {
			fmt.Fprintf(stdout, "... %d more\n", len(names)-i)
			break
		}
		fmt.Fprintf(stdout, "%9.2f  %s\n", p.PerReq[name], name)
	}
	return nil
}
