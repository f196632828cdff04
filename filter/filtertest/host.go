// Package filtertest is a fake proxy-wasm host for running the filter
// natively in tests, fuzz targets and benchmarks. It keeps the lifetime rule
// of real hosts: header values and properties live in an arena overwritten
// when a callback ends (EndCallback), and views of it are made with unsafe,
// as filter/abi makes them; it is test support, never linked into the
// module. It has shared data in a
// sharedstatetest.Store (Envoy's CAS semantics by default), counters, logs,
// request headers and properties, and the response the filter produced.
package filtertest

import (
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/sharedstate"
	"github.com/tokengate/tokengate/sharedstate/sharedstatetest"
)

// Host is a filter.Host for one request at a time (like one worker VM);
// several Hosts may share one Store to model several workers. Create it
// with New.
type Host struct {
	// Store is the shared data; replace it (e.g. with a
	// sharedstatetest.FaultStore) before the first request to inject faults.
	Store sharedstate.Store
	// Metrics are the counters, shared by Hosts made with NewWorker.
	Metrics *Metrics

	// Request is the current request.
	Request Request
	// Response is what the filter did to the current request.
	Response Response

	mu   sync.Mutex
	logs []Log
	// PanicOn, if set, makes RequestHeader panic for that header name (fault
	// injection).
	PanicOn string

	// arena holds the bytes RequestHeader, Property and PropertyString
	// return, as filter/abi's arena does inside the guest; EndCallback
	// overwrites it.
	arena [][]byte

	callouts // calls.go
	ticks    // calls.go
}

// arenaChunk is the size of one arena chunk.
const arenaChunk = 4096

// hand copies v into the arena and returns the copy: valid until
// EndCallback, like the bytes a real host returns.
func (h *Host) hand(v string) []byte {
	n := len(h.arena)
	if n == 0 || cap(h.arena[n-1])-len(h.arena[n-1]) < len(v) {
		h.arena = append(h.arena, make([]byte, 0, max(arenaChunk, len(v))))
		n++
	}
	c := h.arena[n-1]
	start := len(c)
	c = append(c, v...)
	h.arena[n-1] = c
	return c[start:len(c):len(c)]
}

// view returns b as a string sharing its bytes.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// EndCallback ends a callback: every byte RequestHeader, Property and
// PropertyString returned during it is overwritten, so a filter that kept
// one past its callback (the lifetime rule of filter.Host) reads garbage in
// native, race and fuzz tests, not only in wasm. Do calls it after each
// callback.
func (h *Host) EndCallback() {
	for i, c := range h.arena {
		c = c[:cap(c)]
		for j := range c {
			c[j] = 0xA5
		}
		h.arena[i] = c[:0]
	}
}

// ViewString returns a string sharing b's bytes, as filter/abi does for
// buffers the filter leaves untouched until its next request.
func (h *Host) ViewString(b []byte) string { return view(b) }

// Request is the request a Host presents to the filter.
type Request struct {
	// Headers, with lower-case names; pseudo-headers included.
	Headers [][2]string
	// Properties by path joined with ".", e.g. "source.address".
	Properties map[string]string
	// UpstreamHeaders are the upstream response's headers, seen by
	// proxy_on_response_headers (lower-case names).
	UpstreamHeaders [][2]string
	// BodyChunk is the response body chunk proxy_on_response_body sees
	// (ResponseBody).
	BodyChunk []byte
	// Body is the request body buffered so far, which
	// proxy_on_request_body reads (RequestBody), as Envoy gives a filter
	// that buffers it everything received.
	Body []byte
}

// RequestBody returns up to max bytes of Request.Body from start, copied
// into the arena.
func (h *Host) RequestBody(start, max int) ([]byte, bool) {
	b := h.Request.Body
	if start > len(b) {
		start = len(b)
	}
	end := min(len(b), start+max)
	return h.hand(string(b[start:end])), true
}

// ResponseBody returns up to max bytes of Request.BodyChunk from start,
// copied into the arena: valid until the callback ends, as in filter/abi.
func (h *Host) ResponseBody(start, max int) ([]byte, bool) {
	b := h.Request.BodyChunk
	if start > len(b) {
		start = len(b)
	}
	end := min(len(b), start+max)
	return h.hand(string(b[start:end])), true
}

// Response is what the filter did with a request.
type Response struct {
	// Local is the local reply, if one was sent.
	Local *LocalReply
	// Headers are the response headers the filter set, in order.
	Headers [][2]string
}

// LocalReply is a proxy_send_local_response call.
type LocalReply struct {
	Status     uint32
	Details    string
	Body       string
	Headers    [][2]string
	GRPCStatus int32
}

// Log is one proxy_log call.
type Log struct {
	Level filter.LogLevel
	Msg   string
}

// Metrics is a set of counters, safe for concurrent use.
type Metrics struct {
	mu     sync.Mutex
	names  []string
	values []int64
}

// New returns a Host with an empty store of Envoy's semantics.
func New() *Host {
	return &Host{Store: sharedstatetest.New(sharedstate.Envoy), Metrics: &Metrics{}}
}

// NewWorker returns another Host sharing h's store and metrics, as another
// worker VM of the same Envoy would.
func (h *Host) NewWorker() *Host {
	return &Host{Store: h.Store, Metrics: h.Metrics}
}

// Get implements sharedstate.Store.
func (h *Host) Get(key string) ([]byte, uint32, error) { return h.Store.Get(key) }

// Set implements sharedstate.Store.
func (h *Host) Set(key string, value []byte, cas uint32) error { return h.Store.Set(key, value, cas) }

// Log implements filter.Host.
func (h *Host) Log(level filter.LogLevel, msg string) {
	h.mu.Lock()
	h.logs = append(h.logs, Log{level, strings.Clone(msg)})
	h.mu.Unlock()
}

// Logs returns the messages logged at level or above.
func (h *Host) Logs(min filter.LogLevel) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, l := range h.logs {
		if l.Level >= min {
			out = append(out, l.Level.String()+": "+l.Msg)
		}
	}
	return out
}

// DefineCounter implements filter.Host; defining a name twice returns the
// same id, as Envoy does.
func (h *Host) DefineCounter(name string) (uint32, error) {
	m := h.Metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, n := range m.names {
		if n == name {
			return uint32(i), nil
		}
	}
	m.names = append(m.names, name)
	m.values = append(m.values, 0)
	return uint32(len(m.names) - 1), nil
}

// IncrementCounter implements filter.Host.
func (h *Host) IncrementCounter(id uint32, delta int64) {
	m := h.Metrics
	m.mu.Lock()
	m.values[id] += delta
	m.mu.Unlock()
}

// Counter returns a counter's value by name, and whether it is defined.
func (h *Host) Counter(name string) (int64, bool) {
	m := h.Metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, n := range m.names {
		if n == name {
			return m.values[i], true
		}
	}
	return 0, false
}

// CounterNames returns every defined counter, sorted.
func (h *Host) CounterNames() []string {
	m := h.Metrics
	m.mu.Lock()
	defer m.mu.Unlock()
	out := append([]string(nil), m.names...)
	sort.Strings(out)
	return out
}

// RequestHeader implements filter.Host.
func (h *Host) RequestHeader(name string) (string, bool) {
	if h.PanicOn != "" && name == h.PanicOn {
		panic("injected panic reading " + name)
	}
	for _, kv := range h.Request.Headers {
		if kv[0] == name {
			return view(h.hand(kv[1])), true
		}
	}
	return "", false
}

// RequestHeaderAll implements filter.Host: every line of the header,
// joined with ", ".
func (h *Host) RequestHeaderAll(name string) (string, bool) {
	var vals []string
	for _, kv := range h.Request.Headers {
		if kv[0] == name {
			vals = append(vals, kv[1])
		}
	}
	if len(vals) == 0 {
		return "", false
	}
	return view(h.hand(strings.Join(vals, ", "))), true
}

// Property implements filter.Host.
func (h *Host) Property(path ...string) ([]byte, bool) {
	v, ok := h.Request.Properties[strings.Join(path, ".")]
	if !ok {
		return nil, false
	}
	return h.hand(v), true
}

// PropertyString is Property as a string, as filter/abi offers it.
func (h *Host) PropertyString(path ...string) (string, bool) {
	b, ok := h.Property(path...)
	return view(b), ok
}

// ResponseHeader implements filter.Host: the response headers as the
// filter has left them, the upstream's to begin with.
func (h *Host) ResponseHeader(name string) (string, bool) {
	for _, kv := range h.Response.Headers {
		if kv[0] == name {
			return view(h.hand(kv[1])), true
		}
	}
	return "", false
}

// SetRequestHeader replaces a request header, as filter/abi does over
// proxy_replace_header_map_value.
func (h *Host) SetRequestHeader(name, value string) {
	value = strings.Clone(value) // hosts copy header values
	for i, kv := range h.Request.Headers {
		if kv[0] == name {
			h.Request.Headers[i][1] = value
			return
		}
	}
	h.Request.Headers = append(h.Request.Headers, [2]string{name, value})
}

// SetResponseHeader implements filter.Host.
func (h *Host) SetResponseHeader(name, value string) {
	value = strings.Clone(value) // hosts copy header values
	for i, kv := range h.Response.Headers {
		if kv[0] == name {
			h.Response.Headers[i][1] = value
			return
		}
	}
	h.Response.Headers = append(h.Response.Headers, [2]string{name, value})
}

// AddResponseHeader implements filter.Host: a line is added after any of
// the same name, as Envoy's addCopy does.
func (h *Host) AddResponseHeader(name, value string) {
	h.Response.Headers = append(h.Response.Headers, [2]string{name, strings.Clone(value)})
}

// SendLocalResponse implements filter.Host.
func (h *Host) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error {
	if h.Response.Local != nil {
		return errors.New("local response already sent")
	}
	hs := make([][2]string, len(headers))
	for i, kv := range headers {
		hs[i] = [2]string{strings.Clone(kv[0]), strings.Clone(kv[1])}
	}
	h.Response.Local = &LocalReply{status, strings.Clone(details), string(body), hs, grpcStatus}
	return nil
}

// Result is what one request through Do produced.
type Result struct {
	// RequestAction and ResponseAction are the filter's answers.
	RequestAction, ResponseAction filter.Action
	Response
}

// Status returns the HTTP status the client sees: the local reply's, or 200.
func (r Result) Status() uint32 {
	if r.Local != nil {
		return r.Local.Status
	}
	return 200
}

// Header returns a header of the local reply, or else of the response.
func (r Result) Header(name string) string {
	hs := r.Headers
	if r.Local != nil {
		hs = r.Local.Headers
	}
	for _, kv := range hs {
		if kv[0] == name {
			return kv[1]
		}
	}
	return ""
}

// HeaderNumbersError returns an error naming the first RateLimit or
// Retry-After header that states a number other than a non-negative
// integer (a negative parameter, for the RateLimit lists), or nil.
func (r Result) HeaderNumbersError() error {
	for _, name := range []string{"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset", "retry-after"} {
		if v := r.Header(name); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err != nil || n < 0 {
				return errors.New(name + ": " + strconv.Quote(v) + ", want a non-negative integer")
			}
		}
	}
	for _, name := range []string{"ratelimit", "ratelimit-policy"} {
		if v := r.Header(name); strings.Contains(v, "=-") {
			return errors.New(name + ": " + strconv.Quote(v) + " has a negative parameter")
		}
	}
	return nil
}

// Do runs one request through the plugin's lifecycle, like a host would:
// request headers, then (unless a local reply was sent) response headers.
func (h *Host) Do(p *filter.Plugin, req Request) Result {
	h.Request, h.Response = req, Response{}
	s := p.NewStream()
	res := Result{RequestAction: s.OnRequestHeaders(len(req.Headers), true)}
	h.EndCallback()
	if h.Response.Local == nil {
		h.Response.Headers = append(h.Response.Headers, req.UpstreamHeaders...)
		res.ResponseAction = s.OnResponseHeaders(len(req.UpstreamHeaders), false)
		h.EndCallback()
	}
	res.Response = h.Response
	return res
}

// Get is a request with method GET, the given path and client address
// ("ip:port"), and extra headers as name, value pairs.
func Get(path, addr string, headers ...string) Request {
	r := Request{
		Headers:    [][2]string{{":method", "GET"}, {":path", path}, {":authority", "example.com"}, {":scheme", "http"}},
		Properties: map[string]string{"source.address": addr},
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Headers = append(r.Headers, [2]string{strings.ToLower(headers[i]), headers[i+1]})
	}
	return r
}
