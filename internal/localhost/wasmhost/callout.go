package wasmhost

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// Cluster is an upstream the filter can call out to, as one of Envoy's
// STATIC clusters with one socket_address endpoint.
type Cluster struct {
	// Address is "host:port".
	Address string
	// HTTP2 reports whether the cluster speaks HTTP/2 (prior knowledge,
	// Envoy's http2_protocol_options): gRPC calls need it.
	HTTP2 bool
}

// gRPC status codes the host itself reports.
const (
	grpcOK               = 0
	grpcCancelled        = 1
	grpcUnknown          = 2
	grpcDeadlineExceeded = 4
	grpcInternal         = 13
	grpcUnavailable      = 14
)

// callout is one proxy_http_call or proxy_grpc_call in flight.
type callout struct {
	id     uint32
	grpc   bool
	cancel context.CancelFunc
}

// calloutResult is what the guest may read during the callback that
// reports a callout: the response's headers, body and trailers, or the gRPC
// message and status.
type calloutResult struct {
	headers, trailers HeaderMap
	body              []byte
	grpcStatus        uint32
	grpcMessage       string
}

// calloutState is a worker's callouts: the calls in flight and the result
// visible during the current report callback. Guarded by worker.mu.
type calloutState struct {
	nextID  uint32
	pending map[uint32]*callout
	current *calloutResult
}

// transports returns the HTTP client for a cluster: HTTP/1.1, or HTTP/2
// without TLS (prior knowledge) for HTTP/2 clusters.
func (h *Host) client(c Cluster) *http.Client {
	h.clientsOnce.Do(func() {
		h1 := &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, MaxIdleConnsPerHost: 64}
		h2 := &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, MaxIdleConnsPerHost: 64}
		var p http.Protocols
		p.SetUnencryptedHTTP2(true)
		h2.Protocols = &p
		h.h1Client, h.h2Client = &http.Client{Transport: h1}, &http.Client{Transport: h2}
	})
	if c.HTTP2 {
		return h.h2Client
	}
	return h.h1Client
}

// startCallout registers a call and runs do in the background; do's result
// is reported to the guest by report unless the call was cancelled first.
func (h *Host) startCallout(w *worker, grpc bool, timeout time.Duration,
	do func(ctx context.Context) *calloutResult, report func(w *worker, id uint32, r *calloutResult)) uint32 {
	cs := &w.callouts
	if cs.pending == nil {
		cs.pending = map[uint32]*callout{}
	}
	cs.nextID++
	id := cs.nextID
	ctx, cancel := context.WithTimeout(h.calloutCtx, timeout)
	c := &callout{id: id, grpc: grpc, cancel: cancel}
	cs.pending[id] = c
	h.calloutsWG.Add(1)
	go func() {
		defer h.calloutsWG.Done()
		defer cancel()
		r := do(ctx)
		if err := w.acquire(); err != nil {
			return
		}
		defer w.mu.Unlock()
		if cs.pending[id] != c {
			return // cancelled, or the VM restarted
		}
		delete(cs.pending, id)
		cs.current = r
		defer func() { cs.current = nil }()
		report(w, id, r)
	}()
	return id
}

// calloutTimeout is the deadline of a call with timeout 0: Envoy applies
// none; the local host bounds it so that tests end.
const calloutTimeout = time.Minute

func callTimeout(ms uint32) time.Duration {
	if ms == 0 {
		return calloutTimeout
	}
	return time.Duration(ms) * time.Millisecond
}

// httpCall is proxy_http_call(upstream, ulen, headers, hlen, body, blen,
// trailers, tlen, timeout_ms, *id). As Envoy: an unknown cluster or a
// request without :method, :path or :authority is BAD_ARGUMENT; a call that
// fails (no connection, timeout, reset) is reported with 0 headers.
func (h *Host) httpCall(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	upstream, ok1 := readString(mem, p[0], p[1])
	rawHeaders, ok2 := readBytes(mem, p[2], p[3])
	body, ok3 := readBytes(mem, p[4], p[5])
	if _, ok := mem.Read(uint32(p[6]), uint32(p[7])); !ok || !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	hs, err := DecodeHeaders(rawHeaders)
	if err != nil {
		return StatusBadArgument
	}
	m := HeaderMap{h: hs}
	method, _ := m.get(":method")
	path, _ := m.get(":path")
	authority, _ := m.get(":authority")
	if method == "" || path == "" || authority == "" {
		h.hostLog(w, LogError, "proxy_http_call: the request needs :method, :path and :authority")
		return StatusBadArgument
	}
	cl, ok := h.opts.Clusters[upstream]
	if !ok {
		h.hostLog(w, LogError, "proxy_http_call: no cluster "+strconv.Quote(upstream))
		return StatusBadArgument
	}
	do := func(ctx context.Context) *calloutResult {
		req, err := http.NewRequestWithContext(ctx, method, "http://"+cl.Address+path, bytes.NewReader(body))
		if err != nil {
			return nil
		}
		req.Host = authority
		for _, hd := range hs {
			if !strings.HasPrefix(hd.Name, ":") {
				req.Header.Add(hd.Name, hd.Value)
			}
		}
		return roundTrip(h.client(cl), req)
	}
	root := uint64(w.curRoot) // the caller's root context hears the answer
	id := h.startCallout(w, false, callTimeout(uint32(p[8])), do, func(w *worker, id uint32, r *calloutResult) {
		if r == nil {
			_, _ = w.callRoot("proxy_on_http_call_response", root, uint64(id), 0, 0, 0)
			return
		}
		_, _ = w.callRoot("proxy_on_http_call_response", root, uint64(id),
			uint64(len(r.headers.h)), uint64(len(r.body)), uint64(len(r.trailers.h)))
	})
	if !mem.WriteUint32Le(uint32(p[9]), id) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// maxCalloutBody bounds the body of a callout's answer the host reads.
const maxCalloutBody = 16 << 20

// roundTrip sends req and returns the whole response with Envoy-style
// lower-case headers (":status" first), or nil if it failed.
func roundTrip(c *http.Client, req *http.Request) *calloutResult {
	resp, err := c.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxCalloutBody))
	if err != nil {
		return nil
	}
	r := &calloutResult{body: body}
	r.headers.add(":status", strconv.Itoa(resp.StatusCode))
	for k, vs := range resp.Header {
		for _, v := range vs {
			r.headers.add(strings.ToLower(k), v)
		}
	}
	for k, vs := range resp.Trailer {
		for _, v := range vs {
			r.trailers.add(strings.ToLower(k), v)
		}
	}
	return r
}

// grpcCall is proxy_grpc_call(upstream, ulen, service, slen, method, mlen,
// initial_metadata, mdlen, message, msglen, timeout_ms, *id): a unary call.
// As Envoy: an unknown cluster is PARSE_FAILURE at once; the call reports
// exactly once, proxy_on_grpc_receive on success, proxy_on_grpc_close with
// the status on any failure (timeout, no connection, non-OK status, a
// cluster that does not speak HTTP/2).
func (h *Host) grpcCall(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	upstream, ok1 := readString(mem, p[0], p[1])
	service, ok2 := readString(mem, p[2], p[3])
	method, ok3 := readString(mem, p[4], p[5])
	rawMD, ok4 := readBytes(mem, p[6], p[7])
	msg, ok5 := readBytes(mem, p[8], p[9])
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return StatusInvalidMemoryAccess
	}
	var md []Header
	if len(rawMD) > 0 {
		var err error
		if md, err = DecodeHeaders(rawMD); err != nil {
			return StatusBadArgument
		}
	}
	cl, ok := h.opts.Clusters[upstream]
	if !ok {
		h.hostLog(w, LogError, "proxy_grpc_call: no cluster "+strconv.Quote(upstream))
		return StatusParseFailure
	}
	timeout := callTimeout(uint32(p[10]))
	do := func(ctx context.Context) *calloutResult {
		if !cl.HTTP2 {
			return &calloutResult{grpcStatus: grpcInternal, grpcMessage: "cluster " + upstream + " has no HTTP/2 protocol options"}
		}
		frame := make([]byte, 5+len(msg))
		binary.BigEndian.PutUint32(frame[1:5], uint32(len(msg)))
		copy(frame[5:], msg)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+cl.Address+"/"+service+"/"+method, bytes.NewReader(frame))
		if err != nil {
			return &calloutResult{grpcStatus: grpcInternal, grpcMessage: err.Error()}
		}
		req.Host = upstream
		for _, hd := range md {
			req.Header.Add(hd.Name, hd.Value)
		}
		req.Header.Set("content-type", "application/grpc")
		req.Header.Set("te", "trailers")
		req.Header.Set("grpc-timeout", strconv.FormatInt(timeout.Milliseconds(), 10)+"m")
		r := roundTrip(h.client(cl), req)
		switch {
		case r == nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
			return &calloutResult{grpcStatus: grpcDeadlineExceeded, grpcMessage: "deadline exceeded"}
		case r == nil:
			return &calloutResult{grpcStatus: grpcUnavailable, grpcMessage: "upstream connect error or disconnect/reset before headers"}
		}
		return grpcResult(r)
	}
	root := uint64(w.curRoot) // the caller's root context hears the answer
	id := h.startCallout(w, true, timeout, do, func(w *worker, id uint32, r *calloutResult) {
		if r.grpcStatus == grpcOK {
			_, _ = w.callRoot("proxy_on_grpc_receive", root, uint64(id), uint64(len(r.body)))
			return
		}
		_, _ = w.callRoot("proxy_on_grpc_close", root, uint64(id), uint64(r.grpcStatus))
	})
	if !mem.WriteUint32Le(uint32(p[11]), id) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// grpcResult turns an HTTP/2 response into a unary gRPC result: the status
// from the trailers (or the headers of a trailers-only response) and the
// one length-prefixed message of the body.
func grpcResult(r *calloutResult) *calloutResult {
	status, _ := r.headers.get(":status")
	code, ok := r.trailers.get("grpc-status")
	msg, _ := r.trailers.get("grpc-message")
	if !ok {
		code, ok = r.headers.get("grpc-status")
		msg, _ = r.headers.get("grpc-message")
	}
	out := &calloutResult{headers: r.headers, trailers: r.trailers}
	switch {
	case status != "200":
		out.grpcStatus, out.grpcMessage = grpcUnavailable, "http status "+status
	case !ok:
		out.grpcStatus, out.grpcMessage = grpcUnknown, "no grpc-status"
	default:
		n, err := strconv.ParseUint(code, 10, 32)
		if err != nil {
			n = grpcUnknown
		}
		out.grpcStatus, out.grpcMessage = uint32(n), msg
	}
	if out.grpcStatus != grpcOK {
		return out
	}
	b := r.body
	if len(b) < 5 || b[0] != 0 || int(binary.BigEndian.Uint32(b[1:5])) != len(b)-5 {
		out.grpcStatus, out.grpcMessage = grpcInternal, "response is not one uncompressed gRPC message"
		return out
	}
	out.body = b[5:]
	return out
}

// grpcCancel is proxy_grpc_cancel(id) and proxy_grpc_close(id): the call is
// dropped and never reported. An unknown id is NOT_FOUND.
func (h *Host) grpcCancel(_ context.Context, w *worker, _ api.Memory, p []uint64) Status {
	id := uint32(p[0])
	c, ok := w.callouts.pending[id]
	if !ok || !c.grpc {
		return StatusNotFound
	}
	delete(w.callouts.pending, id)
	c.cancel()
	return StatusOK
}

// getStatus is proxy_get_status(*code, **msg, *len): the gRPC status of the
// call being reported.
func (h *Host) getStatus(ctx context.Context, w *worker, mem api.Memory, p []uint64) Status {
	r := w.callouts.current
	if r == nil {
		return StatusNotFound
	}
	if !mem.WriteUint32Le(uint32(p[0]), r.grpcStatus) {
		return StatusInvalidMemoryAccess
	}
	return w.copyOut(ctx, mem, []byte(r.grpcMessage), p[1], p[2])
}

// dropCallouts cancels every call in flight (the VM is going away).
func (w *worker) dropCallouts() {
	for id, c := range w.callouts.pending {
		c.cancel()
		delete(w.callouts.pending, id)
	}
}

// calloutGroup is embedded in Host: the clients and the lifetime of the
// background calls.
type calloutGroup struct {
	clientsOnce        sync.Once
	h1Client, h2Client *http.Client
	calloutCtx         context.Context
	stopCallouts       context.CancelFunc
	calloutsWG         sync.WaitGroup
}
