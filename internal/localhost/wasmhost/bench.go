package wasmhost

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"
)

// This file holds the host's measuring helpers, for benchmarks: running one
// request's guest calls on a chosen worker without HTTP, counting the host
// calls the guest makes, reading the guest's own heap counters, and timing
// the start of one more VM. They add nothing to the request path but one
// counter increment per host call.

// importNames are the env imports in sorted order; a host call's counter is
// its index here.
var importNames = func() []string {
	names := make([]string, 0, len(envImports))
	for name := range envImports {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}()

// importIndex returns the counter index of an env import, or -1.
func importIndex(name string) int {
	i := sort.SearchStrings(importNames, name)
	if i < len(importNames) && importNames[i] == name {
		return i
	}
	return -1
}

var (
	idxGetSharedData = importIndex("proxy_get_shared_data")
	idxSetSharedData = importIndex("proxy_set_shared_data")
)

// count records one call of import i on w. w.mu is held: the guest only
// calls the host from inside a callback.
func (w *worker) count(i int) {
	if w.calls == nil {
		w.calls = make([]uint64, len(importNames))
	}
	w.calls[i]++
}

// totalCalls returns the number of host calls w's guests have made. w.mu
// must be held.
func (w *worker) totalCalls() uint64 {
	var n uint64
	for _, c := range w.calls {
		n += c
	}
	return n
}

func (w *worker) callsOf(i int) uint64 {
	if i < 0 || i >= len(w.calls) {
		return 0
	}
	return w.calls[i]
}

// HostCalls returns how many times the guests of every worker have called
// each env import since the host started, by import name (only imports
// called at least once).
func (h *Host) HostCalls() map[string]uint64 {
	out := make(map[string]uint64)
	for _, w := range h.workers {
		w.mu.Lock()
		for i, c := range w.calls {
			if c > 0 {
				out[importNames[i]] += c
			}
		}
		w.mu.Unlock()
	}
	return out
}

// Exchange is one request for Host.Exchange: what the HTTP proxy
// (internal/localhost/proxy) builds from an *http.Request, given directly.
type Exchange struct {
	// Request is the request header map, lower-case names, pseudo-headers
	// (":authority", ":path", ":method", ":scheme") first.
	Request []Header
	// RemoteAddr is the client's "ip:port" (the source.address property).
	RemoteAddr string
	// Response is the upstream's response header map, ":status" first, used
	// when the filter lets the request through. Nil means ":status: 200".
	Response []Header
}

// ExchangeResult is what Host.Exchange observed.
type ExchangeResult struct {
	// Status is the final response status: the local reply's, or the
	// upstream's.
	Status int
	// LocalReply reports whether the filter answered with
	// proxy_send_local_response.
	LocalReply bool
	// Headers is the final response header map, after the filter.
	Headers []Header
	// HostCalls is the number of env host calls the guest made for this
	// request (proxy_log, header and shared-data calls, metrics, ...);
	// SharedDataGets and SharedDataSets count proxy_get_shared_data and
	// proxy_set_shared_data among them. SharedDataSets is the number of
	// compare-and-swap attempts the request made.
	HostCalls, SharedDataGets, SharedDataSets int
	// HostNanos is the time spent inside host functions (including the
	// guest malloc calls they make) when Options.TimeHostCalls is set.
	HostNanos int64
}

// defaultResponse is the upstream response of an Exchange without one.
var defaultResponse = []Header{{":status", "200"}, {"content-length", "0"}}

// Exchange runs one request through the filter on worker i (0 ≤ i <
// Workers()), without HTTP and without an upstream: the same guest calls as
// the HTTP proxy makes, in the same order (proxy_on_context_create,
// proxy_on_request_headers, then, on the upstream's headers or the local
// reply, proxy_on_response_headers, then proxy_on_log, proxy_on_done,
// proxy_on_delete), holding the worker for the whole sequence so that the
// host-call counts are this request's alone. Request bodies are not
// supported. It is meant for benchmarks and tests that measure the guest.
//
// An error means the VM trapped (the worker restarts on its next use) or
// the filter paused the request without a local reply.
//
// Example:
//
//	res, err := h.Exchange(0, &host.Exchange{
//		Request:    []host.Header{{":authority", "example.com"}, {":path", "/"}, {":method", "GET"}},
//		RemoteAddr: "192.0.2.1:40000",
//	})
func (h *Host) Exchange(i int, ex *Exchange) (ExchangeResult, error) {
	if i < 0 || i >= len(h.workers) {
		return ExchangeResult{}, fmt.Errorf("host: Exchange: worker %d out of range [0, %d)", i, len(h.workers))
	}
	w := h.workers[i]
	s := &stream{remoteAddr: ex.RemoteAddr, protocol: "HTTP/1.1"}
	s.req.h = append(make([]Header, 0, len(ex.Request)), ex.Request...)
	ct, _ := s.req.get("content-type")
	s.grpc = isGRPC(ct)
	m, _ := s.req.get(":method")
	s.head = m == "HEAD"
	resp := ex.Response
	if resp == nil {
		resp = defaultResponse
	}

	if err := w.acquire(); err != nil {
		return ExchangeResult{}, err
	}
	defer w.mu.Unlock()
	calls, gets, sets, nanos := w.totalCalls(), w.callsOf(idxGetSharedData), w.callsOf(idxSetSharedData), w.hostNanos
	fail := func(err error) (ExchangeResult, error) {
		delete(w.streams, s.id)
		return ExchangeResult{}, err
	}
	w.newStream(s)
	if _, err := w.callStream(s, phaseCreate, "proxy_on_context_create", uint64(s.id), uint64(s.root)); err != nil {
		return fail(err)
	}
	action, err := w.callStream(s, phaseRequestHeaders, "proxy_on_request_headers", uint64(s.id), uint64(len(s.req.h)), 1)
	if err != nil {
		return fail(err)
	}
	paused := Action(action) == ActionPause
	s.reqHeld = paused
	switch {
	case s.reset:
	case s.local != nil:
		s.localReply = true
		s.resp.h, s.respBody = buildLocalReply(s.local, s.grpc, s.head)
	case paused && !s.continued:
		return fail(errors.New("host: Exchange: the filter paused the request without a local reply or proxy_continue_stream"))
	default:
		s.resp.h = append(make([]Header, 0, len(resp)+6), resp...)
	}
	if !s.reset {
		if _, err := w.callStream(s, phaseResponseHeaders, "proxy_on_response_headers",
			uint64(s.id), uint64(len(s.resp.h)), boolArg(len(s.respBody) == 0)); err != nil {
			return fail(err)
		}
	}
	if err := w.finish(s); err != nil {
		return ExchangeResult{}, err
	}
	res := ExchangeResult{
		LocalReply:     s.localReply,
		Headers:        s.resp.h,
		HostCalls:      int(w.totalCalls() - calls),
		SharedDataGets: int(w.callsOf(idxGetSharedData) - gets),
		SharedDataSets: int(w.callsOf(idxSetSharedData) - sets),
		HostNanos:      w.hostNanos - nanos,
	}
	res.Status, _ = strconv.Atoi(mustGet(&s.resp, ":status"))
	return res, nil
}

// GuestMemory is a worker VM's memory as the guest and the host see it.
type GuestMemory struct {
	// HeapAllocBytes and HeapAllocObjects are what the guest's Go runtime
	// has allocated on its heap since the VM started, cumulative (the
	// guest's tokengate_debug_heap_alloc_bytes and _objects exports, from
	// runtime/metrics /gc/heap/allocs).
	HeapAllocBytes, HeapAllocObjects uint64
	// RuntimeBytes is all memory the guest's Go runtime has mapped
	// (tokengate_debug_memory_bytes, /memory/classes/total:bytes).
	RuntimeBytes uint64
	// LinearMemoryBytes is the size of the VM's linear memory, which never
	// shrinks: what the VM costs the proxy.
	LinearMemoryBytes uint64
}

// GuestMemory reads worker i's memory figures. It fails if the module lacks
// the tokengate_debug_* exports.
func (h *Host) GuestMemory(i int) (GuestMemory, error) {
	if i < 0 || i >= len(h.workers) {
		return GuestMemory{}, fmt.Errorf("host: GuestMemory: worker %d out of range [0, %d)", i, len(h.workers))
	}
	w := h.workers[i]
	if err := w.acquire(); err != nil {
		return GuestMemory{}, err
	}
	defer w.mu.Unlock()
	var g GuestMemory
	for _, e := range []struct {
		name string
		dst  *uint64
	}{
		{"tokengate_debug_heap_alloc_bytes", &g.HeapAllocBytes},
		{"tokengate_debug_heap_alloc_objects", &g.HeapAllocObjects},
		{"tokengate_debug_memory_bytes", &g.RuntimeBytes},
	} {
		f := w.mod.ExportedFunction(e.name)
		if f == nil {
			return GuestMemory{}, errors.New("host: GuestMemory: the module does not export " + e.name)
		}
		res, err := f.Call(w.ctx)
		if err != nil {
			return GuestMemory{}, fmt.Errorf("host: GuestMemory: %s: %w", e.name, err)
		}
		*e.dst = res[0]
	}
	g.LinearMemoryBytes = uint64(w.mod.Memory().Size())
	return g, nil
}

// StartSpareWorker instantiates one more VM of the compiled module and
// starts it exactly as New starts each worker (_initialize, the root
// context, proxy_on_vm_start, proxy_on_configure), then closes it; the VM
// never serves a request. It returns how long the start took and the VM's
// linear memory once started: what one more Envoy worker thread costs.
func (h *Host) StartSpareWorker() (time.Duration, uint64, error) {
	w := &worker{h: h, index: len(h.workers)}
	t0 := time.Now()
	if err := w.start(); err != nil {
		return 0, 0, err
	}
	d := time.Since(t0)
	size := uint64(w.mod.Memory().Size())
	return d, size, w.mod.Close(w.ctx)
}
