package bench

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
	"github.com/tokengate/tokengate/internal/testsupport/wasmbuild"
)

// The configurations of benchmark 3. Every rule admits everything the
// benchmark sends (rate and burst 10^6, refilled by the real clock), except
// reject's, whose one token is gone after the first request and comes back
// once every 1000 s.
const (
	// passthroughConfig has one per-IP rule in a policy whose selector
	// never matches the benchmark's path: the filter reads :path and lets
	// the request through.
	passthroughConfig = `{"bundle_version":1,"policies":[{"id":"api","spec":{"selector":{"pathPrefix":"/api/"},
		"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}]}}]}`
	perIPConfig = `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}`
	fourConfig  = `{"rules":[
		{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}},
		{"name":"per-key","limit_keys":["header:x-api-key"],"algorithm_config":{"rps":1000000,"burst":1000000}},
		{"name":"per-route","limit_keys":["method","path"],"algorithm_config":{"rps":1000000,"burst":1000000}},
		{"name":"global","algorithm_config":{"rps":1000000,"burst":1000000}}]}`
	rejectConfig = `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":1}}`
	// hotKeyConfig is one bucket shared by every request (benchmark 5).
	hotKeyConfig = `{"name":"global","algorithm_config":{"rps":1000000000,"burst":1000000000}}`
)

// module returns the module built from this tree (or $TOKENGATE_WASM; see
// internal/testsupport/wasmbuild). The benchmarks fail, never skip, without it.
func module(tb testing.TB) []byte {
	tb.Helper()
	wasm, err := wasmbuild.Module()
	if err != nil {
		tb.Fatal(err)
	}
	return wasm
}

func TestMain(m *testing.M) {
	code := m.Run()
	wasmbuild.Cleanup()
	os.Exit(code)
}

// newHost starts the module with config on workers VMs; logs are dropped,
// as Envoy drops the filter's debug lines at its default level.
func newHost(tb testing.TB, config string, workers int) *wasmhost.Host {
	tb.Helper()
	return newHostOpts(tb, config, workers, false)
}

func newHostOpts(tb testing.TB, config string, workers int, timeHostCalls bool) *wasmhost.Host {
	tb.Helper()
	h, err := wasmhost.New(context.Background(), wasmhost.Options{
		TimeHostCalls: timeHostCalls,
		Wasm:          module(tb),
		PluginConfig:  []byte(config),
		Workers:       workers,
		LogSink:       func(wasmhost.LogLevel, string) {},
		MinLogLevel:   wasmhost.LogCritical,
		MaxLogs:       16,
		DisableTicks:  true,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.Close(context.Background()) })
	return h
}

// request returns the request of the benchmarks: a GET of path with an API
// key, as a client library sends it.
func request(path string) []wasmhost.Header {
	h := func(name, value string) wasmhost.Header { return wasmhost.Header{Name: name, Value: value} }
	return []wasmhost.Header{
		h(":authority", "api.example.com"), h(":path", path), h(":method", "GET"), h(":scheme", "http"),
		h("accept", "*/*"), h("user-agent", "bench/1.0"), h("x-api-key", "key-0123456789"),
		h("x-forwarded-proto", "http"), h("x-request-id", "6f1c1d52-8a38-4c1e-9a43-2b7f0c2b5a8e"),
	}
}

// ips returns n distinct "a.b.c.d:port" client addresses.
func ips(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":40000"
	}
	return out
}

// guestCase is one request case of benchmark 3.
type guestCase struct {
	name, config, path string
	addrs              []string
	wantStatus         int
	nop                bool // the module that does nothing (nopModule), not the filter
}

// guestCases are benchmark 3's cases: the no-filter row and (a) to (e).
func guestCases() []guestCase {
	addrs := ips(100_000)
	return []guestCase{
		{"o-no-filter", "", "/api/items", addrs[:1], 200, true},
		{"a-passthrough", passthroughConfig, "/static/app.js", addrs[:1], 200, false},
		{"b-one-rule", perIPConfig, "/api/items", addrs[:1], 200, false},
		{"c-four-rules", fourConfig, "/api/items", addrs[:1], 200, false},
		{"d-rejected", rejectConfig, "/api/items", addrs[:1], 429, false},
		{"e-100000-ips", perIPConfig, "/api/items", addrs, 200, false},
	}
}

// start starts c's module on one worker VM and warms it up: the buckets
// are seeded (and reject's one token spent), so that the loop measures the
// steady state.
func (c guestCase) start(b *testing.B, timeHostCalls bool) (*wasmhost.Host, *wasmhost.Exchange) {
	b.Helper()
	wasm := nopModule()
	if !c.nop {
		wasm = module(b)
	}
	h, err := wasmhost.New(context.Background(), wasmhost.Options{
		TimeHostCalls: timeHostCalls,
		Wasm:          wasm,
		PluginConfig:  []byte(c.config),
		Workers:       1,
		LogSink:       func(wasmhost.LogLevel, string) {},
		MinLogLevel:   wasmhost.LogCritical,
		MaxLogs:       16,
		DisableTicks:  true,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Close(context.Background()) })
	ex := &wasmhost.Exchange{Request: request(c.path)}
	for _, a := range c.addrs[:min(len(c.addrs), 2)] {
		ex.RemoteAddr = a
		if _, err := h.Exchange(0, ex); err != nil {
			b.Fatal(err)
		}
	}
	return h, ex
}

// BenchmarkGuestRequest is benchmark 3: one request's whole sequence of
// guest calls (context create, request headers, response headers, log,
// done, delete) in one worker VM of the built module, without HTTP. ns/op
// is per request and includes the host's side of every call. It also
// reports host calls per request and the guest's heap allocation per
// request (bytes and objects, read from the guest's own counters). The
// no-filter row runs a module that does nothing through the same host.
func BenchmarkGuestRequest(b *testing.B) {
	for _, c := range guestCases() {
		b.Run(c.name, func(b *testing.B) {
			h, ex := c.start(b, false)
			var before wasmhost.GuestMemory
			var err error
			if !c.nop {
				if before, err = h.GuestMemory(0); err != nil {
					b.Fatal(err)
				}
			}
			calls := 0
			i := 0
			for b.Loop() {
				ex.RemoteAddr = c.addrs[i%len(c.addrs)]
				i++
				res, err := h.Exchange(0, ex)
				if err != nil {
					b.Fatal(err)
				}
				if res.Status != c.wantStatus {
					b.Fatalf("request %d: got status %d, want %d", i, res.Status, c.wantStatus)
				}
				calls += res.HostCalls
			}
			n := float64(i)
			b.ReportMetric(float64(calls)/n, "hostcalls/op")
			if c.nop {
				return
			}
			after, err := h.GuestMemory(0)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(after.HeapAllocBytes-before.HeapAllocBytes)/n, "guestB/op")
			b.ReportMetric(float64(after.HeapAllocObjects-before.HeapAllocObjects)/n, "guestallocs/op")
		})
	}
}

// BenchmarkHostShare splits benchmark 3's cases into the time spent inside
// the host's functions (hostfn-ns/op: the work of the host, here wazero
// and internal/localhost/wasmhost, including the guest malloc calls it makes to
// return values) and the rest (guest-ns/op: the guest's code and the cost
// of entering it), with two clock reads added per host call. The
// no-filter row's guest-ns/op is what entering a module that does nothing
// costs.
func BenchmarkHostShare(b *testing.B) {
	for _, c := range guestCases() {
		b.Run(c.name, func(b *testing.B) {
			h, ex := c.start(b, true)
			var hostNanos int64
			n := 0
			start := time.Now()
			for b.Loop() {
				ex.RemoteAddr = c.addrs[n%len(c.addrs)]
				res, err := h.Exchange(0, ex)
				if err != nil {
					b.Fatal(err)
				}
				hostNanos += res.HostNanos
				n++
			}
			total := time.Since(start).Nanoseconds()
			b.ReportMetric(float64(hostNanos)/float64(n), "hostfn-ns/op")
			b.ReportMetric(float64(total-hostNanos)/float64(n), "guest-ns/op")
		})
	}
}

// BenchmarkGuestMemory runs b.N requests (run it with -benchtime
// 1000000x) through one VM, cycling over 100,000 client IPs with every
// tenth request rejected by a second rule, and reports the VM's linear
// memory and the guest runtime's mapped memory at the start and the end:
// flat means the steady state leaks nothing.
func BenchmarkGuestMemory(b *testing.B) {
	const cfg = `{"rules":[
		{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}},
		{"name":"probe","limit_keys":["header:x-probe"],"algorithm_config":{"rps":0.001,"burst":1}}]}`
	h := newHost(b, cfg, 1)
	addrs := ips(100_000)
	allowed := &wasmhost.Exchange{Request: request("/api/items")}
	rejected := &wasmhost.Exchange{Request: append(request("/api/items"), wasmhost.Header{Name: "x-probe", Value: "p"})}
	start, err := h.GuestMemory(0)
	if err != nil {
		b.Fatal(err)
	}
	i := 0
	for b.Loop() {
		ex := allowed
		if i%10 == 9 {
			ex = rejected
		}
		ex.RemoteAddr = addrs[i%len(addrs)]
		i++
		if _, err := h.Exchange(0, ex); err != nil {
			b.Fatal(err)
		}
	}
	end, err := h.GuestMemory(0)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(start.LinearMemoryBytes)/(1<<20), "linmem-start-MiB")
	b.ReportMetric(float64(end.LinearMemoryBytes)/(1<<20), "linmem-end-MiB")
	b.ReportMetric(float64(start.RuntimeBytes)/(1<<20), "goruntime-start-MiB")
	b.ReportMetric(float64(end.RuntimeBytes)/(1<<20), "goruntime-end-MiB")
	b.ReportMetric(float64(end.HeapAllocBytes-start.HeapAllocBytes)/float64(i), "guestB/op")
}

// BenchmarkContention is benchmark 5: 8 worker VMs, one goroutine each,
// sending b.N requests in all (run it with -benchtime 100000x) that take
// from one hot bucket. It reports the compare-and-swap attempts per request
// (proxy_set_shared_data calls, counted by the host; mean and 99th
// percentile) and the requests that failed open.
func BenchmarkContention(b *testing.B) {
	const workers = 8
	h := newHost(b, hotKeyConfig, workers)
	per := make([][]int, workers)
	ex := func() *wasmhost.Exchange {
		return &wasmhost.Exchange{Request: request("/api/items"), RemoteAddr: "192.0.2.1:40000"}
	}
	if _, err := h.Exchange(0, ex()); err != nil { // seed the key
		b.Fatal(err)
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		n := b.N / workers
		if w < b.N%workers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := ex()
			sets := make([]int, 0, n)
			for range n {
				res, err := h.Exchange(w, e)
				if err != nil {
					errs <- err
					return
				}
				sets = append(sets, res.SharedDataSets)
			}
			per[w] = sets
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	all := slices.Concat(per...)
	slices.Sort(all)
	sum := 0
	for _, s := range all {
		sum += s
	}
	failOpen, _ := h.Metric("tokengate.rule.global.fail_open")
	retries, _ := h.Metric("tokengate.rule.global.cas_retries")
	b.ReportMetric(float64(sum)/float64(len(all)), "cas-attempts-mean")
	b.ReportMetric(float64(all[(len(all)*99)/100]), "cas-attempts-p99")
	b.ReportMetric(float64(all[len(all)-1]), "cas-attempts-max")
	b.ReportMetric(float64(retries), "cas-retries")
	b.ReportMetric(float64(failOpen), "fail-open")
}

// BenchmarkInstantiateWorker is part of benchmark 7: the time to
// instantiate and start one more worker VM (the module is already
// compiled), and that VM's linear memory once started.
func BenchmarkInstantiateWorker(b *testing.B) {
	h := newHost(b, perIPConfig, 1)
	var size uint64
	for b.Loop() {
		_, s, err := h.StartSpareWorker()
		if err != nil {
			b.Fatal(err)
		}
		size = s
	}
	b.ReportMetric(float64(size)/(1<<20), "linmem-MiB")
}
