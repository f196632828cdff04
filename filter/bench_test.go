package filter_test

import (
	"strconv"
	"testing"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/filter/filtertest"
	"github.com/tokengate/tokengate/sharedstate"
)

// benchEpoch is the benchmarks' clock start, 2025-01-15T11:20:00Z.
const benchEpoch = 1736940000.0

// BenchmarkStream runs the filter's whole request path natively against the
// fake host: the same Go code as the guest, without the wasm VM or the ABI,
// so its profile (go test -cpuprofile) shows where the guest spends its
// time. bench.BenchmarkGuestRequest measures the built module.
func BenchmarkStream(b *testing.B) {
	const rule = `"algorithm_config":{"rps":1000000,"burst":1000000}`
	cases := []struct {
		name, config, path string
		ips                int
		want               uint32
	}{
		{"a-passthrough", `{"bundle_version":1,"policies":[{"id":"api","spec":{"selector":{"pathPrefix":"/api/"},
			"rules":[{"name":"per-ip","limit_keys":["ip:address"],` + rule + `}]}}]}`, "/static/app.js", 1, 200},
		{"b-one-rule", `{"name":"per-ip","limit_keys":["ip:address"],` + rule + `}`, "/api/items", 1, 200},
		{"c-four-rules", `{"rules":[{"name":"per-ip","limit_keys":["ip:address"],` + rule + `},
			{"name":"per-key","limit_keys":["header:x-api-key"],` + rule + `},
			{"name":"per-route","limit_keys":["method","path"],` + rule + `},
			{"name":"global",` + rule + `}]}`, "/api/items", 1, 200},
		{"d-rejected", `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":1}}`, "/api/items", 1, 429},
		{"e-100000-ips", `{"name":"per-ip","limit_keys":["ip:address"],` + rule + `}`, "/api/items", 100000, 200},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			h := filtertest.New()
			p := filter.NewPlugin(h)
			now := benchEpoch
			p.Clock = func() float64 { return now }
			if !p.OnConfigure([]byte(c.config)) {
				b.Fatalf("configuration refused: %q", h.Logs(filter.LogError))
			}
			reqs := make([]filtertest.Request, c.ips)
			for i := range reqs {
				reqs[i] = filtertest.Get(c.path, "10."+strconv.Itoa(i>>16&255)+"."+strconv.Itoa(i>>8&255)+"."+strconv.Itoa(i&255)+":40000",
					"x-api-key", "key-0123456789")
			}
			h.Do(p, reqs[0])
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				now += 1e-6
				res := h.Do(p, reqs[i%len(reqs)])
				i++
				if res.Status() != c.want {
					b.Fatalf("request %d: got %d, want %d", i, res.Status(), c.want)
				}
			}
		})
	}
}

// zeroHost is a filter.Host that does next to nothing: one stored value,
// constant headers and address, no metrics, no copies. It also has the
// optional byte-slice methods filter/abi provides.
type zeroHost struct {
	key  string
	val  []byte
	cas  uint32
	hdrs [][2]string
}

func (h *zeroHost) Get(key string) ([]byte, uint32, error) {
	if key != h.key {
		return nil, 0, sharedstate.ErrNotFound
	}
	return h.val, h.cas, nil
}

func (h *zeroHost) Set(key string, value []byte, cas uint32) error {
	if h.key != key {
		h.key = key
	}
	h.val = append(h.val[:0], value...)
	h.cas++
	return nil
}

func (h *zeroHost) Log(filter.LogLevel, string)             {}
func (h *zeroHost) LogBytes(filter.LogLevel, []byte)        {}
func (h *zeroHost) DefineCounter(string) (uint32, error)    { return 1, nil }
func (h *zeroHost) IncrementCounter(uint32, int64)          {}
func (h *zeroHost) Property(...string) ([]byte, bool)       { return []byte("10.0.0.1:40000"), true }
func (h *zeroHost) PropertyString(...string) (string, bool) { return "10.0.0.1:40000", true }
func (h *zeroHost) SetResponseHeader(string, string)        {}
func (h *zeroHost) SetResponseHeaderBytes(string, []byte)   {}
func (h *zeroHost) AddResponseHeader(string, string)        {}
func (h *zeroHost) AddResponseHeaderBytes(string, []byte)   {}
func (h *zeroHost) ResponseHeader(string) (string, bool)    { return "", false }

func (h *zeroHost) SendLocalResponse(uint32, string, []byte, [][2]string, int32) error { return nil }

func (h *zeroHost) RequestHeader(name string) (string, bool) {
	for _, kv := range h.hdrs {
		if kv[0] == name {
			return kv[1], true
		}
	}
	return "", false
}

func (h *zeroHost) RequestHeaderAll(name string) (string, bool) { return h.RequestHeader(name) }

// BenchmarkZeroCostHost is the filter's own code per request, request and
// response headers, against a host that costs nothing: what the guest
// spends apart from the ABI. bench/run.sh also runs it compiled to wasm
// (GOOS=wasip1) in wazero, to show what Go-on-wasm costs compared with
// native code.
func BenchmarkZeroCostHost(b *testing.B) {
	for _, c := range []struct{ name, config, path string }{
		{"a-passthrough", `{"bundle_version":1,"policies":[{"id":"api","spec":{"selector":{"pathPrefix":"/api/"},
			"rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}]}}]}`, "/static/app.js"},
		{"b-one-rule", `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}`, "/api/items"},
		{"d-rejected", `{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":0.001,"burst":1}}`, "/api/items"},
	} {
		b.Run(c.name, func(b *testing.B) {
			h := &zeroHost{hdrs: [][2]string{{":path", c.path}, {":method", "GET"}, {":authority", "api.example.com"}}}
			p := filter.NewPlugin(h)
			now := benchEpoch
			p.Clock = func() float64 { return now }
			if !p.OnConfigure([]byte(c.config)) {
				b.Fatal("configuration refused")
			}
			b.ReportAllocs()
			for b.Loop() {
				now += 1e-6
				s := p.NewStream()
				if s.OnRequestHeaders(len(h.hdrs), true) == filter.Continue {
					s.OnResponseHeaders(1, false)
				}
				s.Release()
			}
		})
	}
}
