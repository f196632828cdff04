// Package proxy is the HTTP side of the local host: what Envoy's listener,
// HTTP connection manager, jwt_authn filter and router do around the
// proxy-wasm filter. A Proxy serves HTTP (it implements http.Handler);
// each request becomes a stream of a wasmhost.Host, driven through the
// filter's callbacks in Envoy's order, and goes to the upstream handler
// unless the filter answers it. It also holds the upstreams (EchoHandler,
// ProxyTo) and the admin's Prometheus text (WritePrometheus).
//
// The dependency is one way: proxy uses wasmhost's Stream API, and
// wasmhost, the proxy-wasm ABI host, knows nothing of HTTP serving.
//
//	h, err := wasmhost.New(ctx, wasmhost.Options{Wasm: wasm, PluginConfig: cfg})
//	if err != nil { ... }
//	defer h.Close(ctx)
//	srv := httptest.NewServer(proxy.New(h, proxy.Options{}))
package proxy

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Options configures a Proxy. The zero value serves EchoHandler's answers.
type Options struct {
	// Manager is what Envoy's HTTP connection manager does to requests
	// before the filters see them (path normalisation, the client
	// address, x-forwarded-for, the header size bound); nil serves them
	// as they arrive with the TCP peer as source.address. Outside Kong
	// mode the repeated lines of Envoy's inline headers are merged in
	// any case, as Envoy's header map does.
	Manager *Manager
	// JWTAuthn, if set, is Envoy's jwt_authn filter in front of the module.
	JWTAuthn *JWTAuthn

	// Upstream answers the requests the filter lets through. Nil means
	// EchoHandler(). Use ProxyTo to forward to a URL.
	Upstream http.Handler
	// StreamResponses passes the upstream's response to the client as it
	// arrives, one proxy_on_response_body per piece the upstream writes,
	// and ends the stream without end_of_stream when the client leaves or
	// the upstream aborts (streaming.go). By default the response is
	// buffered and the filter sees the whole body in one callback.
	StreamResponses bool
	// PauseTimeout bounds how long a request paused by the filter waits
	// for proxy_continue_stream or a local reply before the proxy answers
	// 504, like a stream timeout. Zero means 60 s.
	PauseTimeout time.Duration

	// BufferLimit bounds the request body the proxy buffers for the
	// filter, in bytes: a body over it is answered 413, as Envoy answers
	// a filter that buffers more than the connection's buffer limit
	// (the listener's per_connection_buffer_limit_bytes). Zero means
	// DefaultBufferLimit, Envoy's default.
	BufferLimit int
	// StreamIdleTimeout ends a request whose body sends nothing for that
	// long with 408, as Envoy's stream_idle_timeout (the HTTP connection
	// manager's; 5 minutes by default) does. Zero means
	// DefaultStreamIdleTimeout; negative, none.
	StreamIdleTimeout time.Duration
	// RequestTimeout bounds the time to receive the whole request, 408
	// after it, as Envoy's request_timeout; zero (Envoy's default): none.
	RequestTimeout time.Duration
}

// Envoy's defaults for the bounds on a request being received
// (Options.BufferLimit, Options.StreamIdleTimeout).
const (
	DefaultBufferLimit       = 1 << 20
	DefaultStreamIdleTimeout = 5 * time.Minute
)

// Proxy serves HTTP through a Host's filter. It is safe for concurrent
// use.
type Proxy struct {
	host     *wasmhost.Host
	opts     Options
	upstream http.Handler
}

// New returns a Proxy in front of h.
func New(h *wasmhost.Host, opts Options) *Proxy {
	p := &Proxy{host: h, opts: opts, upstream: opts.Upstream}
	if p.upstream == nil {
		p.upstream = EchoHandler()
	}
	return p
}

// Host returns the host the proxy serves through.
func (p *Proxy) Host() *wasmhost.Host { return p.host }

// request is a request as the connection manager and jwt_authn see and
// change it, before the filter's stream opens.
type request struct {
	req        wasmhost.HeaderMap
	remoteAddr string // "ip:port" of the client
	localAddr  string // "ip:port" the client connected to
	protocol   string // "HTTP/1.1"
	head       bool   // the request is HEAD
	// metadata is the dynamic metadata by namespace (jwt_authn's verified
	// payload).
	metadata map[string]map[string]any
}

// maxRequestBody is the default bound on the request body the proxy
// buffers (Options.BufferLimit). Before issue 30 it was 16 MiB, read with
// no idle bound: 16 bodies that never ended held 354 MB.
const maxRequestBody = DefaultBufferLimit

// streamedStatus is what run returns when streamUpstream has answered.
const streamedStatus = -1

// ServeHTTP runs one request through the filter on one worker, in Envoy's
// order: proxy_on_context_create, proxy_on_request_headers as soon as the
// headers are in (end_of_stream false when a body follows), then
// proxy_on_request_body once the headers callback has let the request go
// on; then either the upstream or
// the filter's local reply; proxy_on_response_headers (and _body) on that
// response, letting the filter change it; proxy_on_log, proxy_on_done,
// proxy_on_delete; then the response is written. The worker is locked only
// while the guest runs, so a worker interleaves streams as Envoy's do.
//
// The request body is read only once proxy_on_request_headers has let the
// request go on, at once or, for a request it paused, after
// proxy_continue_stream: while it is held the body stays with the client
// (its writes block, as Envoy's StopAllIterationAndWatermark applies flow
// control), and after the continue the filter gets it in
// proxy_on_request_body, as Envoy delivers the body it buffered to the
// filter that stopped iteration.
//
// Differences from Envoy worth knowing: bodies are buffered whole and each
// body callback sees the whole body with end_of_stream set, unless
// Options.StreamResponses passes responses through as they arrive
// (streaming.go); a Pause without
// a local reply or proxy_continue_stream answers 500 instead of hanging;
// a VM trap answers 503 (Envoy's fail-closed reply) and the worker's VM is
// restarted on its next use.
func (p *Proxy) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if status := codecReply(p.opts.Manager, r); status != 0 {
		http.Error(rw, http.StatusText(status), status)
		return
	}
	s := newRequest(r)
	if !p.host.Kong() {
		s.req = *wasmhost.NewHeaderMap(mergeInline(s.req.Headers()))
	}
	if m := p.opts.Manager; m != nil {
		if status, location := m.apply(s, r); status != 0 {
			if location != "" {
				rw.Header().Set("Location", location)
			}
			http.Error(rw, http.StatusText(status), status)
			return
		}
	}
	if j := p.opts.JWTAuthn; j != nil {
		if status, msg := j.authenticate(s, p.host.WallNow()); status != 0 {
			rw.Header().Set("WWW-Authenticate", `Bearer realm="http://`+r.Host+r.URL.Path+`", error="invalid_token"`)
			http.Error(rw, msg, status)
			return
		}
	}
	st := p.host.NewStream(wasmhost.Downstream{Headers: s.req.Headers(), RemoteAddr: s.remoteAddr,
		LocalAddr: s.localAddr, Protocol: s.protocol, Metadata: s.metadata})
	status, headers, respBody := p.run(st, rw, r)
	if status == streamedStatus {
		return // streamUpstream answered (streaming.go)
	}
	if st.Closed() {
		panic(http.ErrAbortHandler) // proxy_close_stream: reset the stream
	}
	_, _, trailers := st.Response()
	out := rw.Header()
	for _, hd := range headers {
		if strings.HasPrefix(hd.Name, ":") || hd.Name == "content-length" || isHopByHop(hd.Name) {
			continue
		}
		out[textproto.CanonicalMIMEHeaderKey(hd.Name)] = append(out[textproto.CanonicalMIMEHeaderKey(hd.Name)], hd.Value)
	}
	switch {
	case !s.head && len(trailers) > 0:
		// Chunked, so that the trailers can follow the body.
	case !s.head:
		out.Set("Content-Length", strconv.Itoa(len(respBody)))
	default:
		if v, ok := wasmhost.NewHeaderMap(headers).Get("content-length"); ok {
			out.Set("Content-Length", v)
		}
	}
	rw.WriteHeader(status)
	if !s.head {
		_, _ = rw.Write(respBody)
		if len(trailers) > 0 {
			// Chunked for sure: a short body would otherwise get a
			// Content-Length from net/http, and the trailers dropped.
			if f, ok := rw.(http.Flusher); ok {
				f.Flush()
			}
			writeTrailers(rw, trailers)
		}
	}
}

// vmFailed is Envoy's fail-closed answer when the VM traps.
var vmFailed = wasmhost.LocalReply{Status: 503, Details: "wasm_fail_stream", GRPCStatus: 14}

// run executes the stream lifecycle and returns the response to write.
func (p *Proxy) run(st *wasmhost.Stream, rw http.ResponseWriter, r *http.Request) (int, []wasmhost.Header, []byte) {
	failed := func(err error) (int, []wasmhost.Header, []byte) {
		st.Log(wasmhost.LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v; answering 503", st.Worker(), err))
		hs, body := st.Render(vmFailed)
		return 503, hs, body
	}
	abandon := func(err error) (int, []wasmhost.Header, []byte) {
		st.Unlock()
		return failed(err)
	}

	// Request path.
	if err := st.Lock(); err != nil {
		return failed(err)
	}
	if err := st.Create(); err != nil {
		return abandon(err)
	}
	hasBody := r.ContentLength != 0 // -1: chunked, a body may follow
	paused, err := st.OnRequestHeaders(!hasBody)
	if err != nil {
		return abandon(err)
	}
	if paused && !st.Replied() && !st.Closed() && !st.Continued() {
		// Held, as Envoy holds a stream after StopAllIteration: until a
		// later callback (a tick, a callout's report) continues it or
		// replies, the client leaves, or the stream times out.
		if status, hs, b, done := p.hold(st, r); done {
			return status, hs, b
		}
		paused = !st.Continued()
	}
	if !paused && !st.Replied() && !st.Closed() && hasBody {
		body, status, hs, b, done := p.readBody(st, rw, r)
		if done {
			return status, hs, b
		}
		if !st.Replied() && !st.Closed() {
			if paused, err = st.OnRequestBody(body); err != nil {
				return abandon(err)
			}
			if paused && !st.Replied() && !st.Closed() && !st.Continued() {
				// Held until a later callback continues the body or
				// answers (a rate-limit call made for the body's estimate).
				if status, hs, b, done := p.hold(st, r); done {
					return status, hs, b
				}
				paused = !st.Continued()
			}
		}
	}
	st.Unlock()

	// Upstream, or the local reply.
	switch {
	case st.Closed():
	case st.Replied():
		st.UseLocalReply()
	case paused && !st.Continued():
		st.Log(wasmhost.LogError, "the filter paused the request body without a local reply or proxy_continue_stream; "+
			"the local host does not hold bodies; answering 500")
		st.SendLocalReply(wasmhost.LocalReply{Status: 500, GRPCStatus: -1,
			Body: []byte("tokengate-local: the filter paused the request body and never resumed it\n")})
		st.UseLocalReply()
	case p.opts.StreamResponses:
		p.streamUpstream(st, rw, r)
		return streamedStatus, nil, nil
	default:
		st.SetResponse(p.forward(st, r))
	}

	// Response path.
	if err := st.Lock(); err != nil {
		return failed(err)
	}
	if err := st.OnResponse(); err != nil {
		return abandon(err)
	}
	if err := st.Finish(); err != nil {
		st.Unlock()
		return failed(err)
	}
	st.Unlock()

	hs, body, _ := st.Response()
	code := wasmhost.NewHeaderMap(hs)
	statusText, _ := code.Get(":status")
	status, err := strconv.Atoi(statusText)
	if err != nil || status < 100 || status > 999 {
		st.Log(wasmhost.LogError, fmt.Sprintf("response :status %q is not a status code; answering 502", statusText))
		return http.StatusBadGateway, nil, nil
	}
	return status, hs, body
}

// hold waits, with the worker unlocked, until the paused stream st is
// continued, answered or reset from another callback, the client goes
// away, or the pause times out. It returns with the worker locked and done
// false when the request goes on; with done true (and the worker
// unlocked) when hold itself produced the answer.
func (p *Proxy) hold(st *wasmhost.Stream, r *http.Request) (status int, hs []wasmhost.Header, body []byte, done bool) {
	wake := st.WakeUps()
	timeout := p.opts.PauseTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		st.Unlock()
		gone, timedOut := false, false
		select {
		case <-wake:
		case <-r.Context().Done():
			gone = true
		case <-timer.C:
			timedOut = true
		}
		if err := st.Lock(); err != nil {
			return http.StatusServiceUnavailable, nil, nil, true
		}
		if !st.Alive() {
			// The VM trapped and restarted: this stream died with it.
			st.Unlock()
			hs, b := st.Render(vmFailed)
			return 503, hs, b, true
		}
		switch {
		case st.Replied() || st.Closed() || st.Continued():
			return 0, nil, nil, false
		case gone:
			// The client left while held: Envoy ends the stream, and the
			// filter hears of it through proxy_on_done and proxy_on_delete.
			err := st.Finish()
			st.Unlock()
			if err != nil {
				st.Log(wasmhost.LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v", st.Worker(), err))
			}
			return 499, nil, nil, true
		case timedOut:
			st.Log(wasmhost.LogError, "the filter paused the request and neither resumed nor answered it within "+
				timeout.String()+"; answering 504 as a stream timeout")
			st.SendLocalReply(wasmhost.LocalReply{Status: 504, Details: "stream_timeout", GRPCStatus: 4,
				Body: []byte("tokengate-local: the filter paused the request and never resumed it\n")})
			return 0, nil, nil, false
		}
	}
}

// readBody reads the request body, with the worker unlocked, once the
// filter has let the request go on. It returns with the worker locked and
// done false when the request goes on (a body over maxRequestBody becomes
// the proxy's 413 reply, which the response callbacks see); with done
// true (and the worker unlocked) when the client went away or the VM
// restarted meanwhile.
func (p *Proxy) readBody(st *wasmhost.Stream, rw http.ResponseWriter, r *http.Request) (reqBody []byte, status int, hs []wasmhost.Header, body []byte, done bool) {
	st.Unlock()
	limit := p.opts.BufferLimit
	if limit <= 0 {
		limit = DefaultBufferLimit
	}
	b, err := p.readLimited(rw, r, limit)
	if aerr := st.Lock(); aerr != nil {
		return nil, http.StatusServiceUnavailable, nil, nil, true
	}
	if !st.Alive() {
		st.Unlock()
		hs, b := st.Render(vmFailed)
		return nil, 503, hs, b, true
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		st.SendLocalReply(wasmhost.LocalReply{Status: http.StatusRequestEntityTooLarge, Details: "request_payload_too_large", GRPCStatus: -1,
			Body: []byte("tokengate-local: the request body is over " + strconv.Itoa(limit) + " bytes (the buffer limit)\n")})
	case errors.Is(err, errStreamIdle):
		st.SendLocalReply(wasmhost.LocalReply{Status: http.StatusRequestTimeout, Details: "stream_idle_timeout", GRPCStatus: -1,
			Body: []byte("stream timeout")})
	case errors.Is(err, errRequestTimeout):
		st.SendLocalReply(wasmhost.LocalReply{Status: http.StatusRequestTimeout, Details: "request_overall_timeout", GRPCStatus: -1,
			Body: []byte("request timeout")})
	case err != nil:
		// The client went away while sending: Envoy resets the stream, and
		// the filter hears of it through proxy_on_done and proxy_on_delete.
		ferr := st.Finish()
		st.Unlock()
		if ferr != nil {
			st.Log(wasmhost.LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v", st.Worker(), ferr))
		}
		return nil, 499, nil, nil, true
	}
	return b, 0, nil, nil, false
}

// The timeouts readLimited ends a body with.
var (
	errStreamIdle     = errors.New("stream idle timeout")
	errRequestTimeout = errors.New("request timeout")
)

// readLimited reads r's body, at most limit bytes (a larger one is an
// *http.MaxBytesError, as soon as it is known: at once from its
// Content-Length), each read bounded by the stream idle timeout and all
// of them by the request timeout (errStreamIdle, errRequestTimeout), as
// Envoy bounds a stream that stops sending. The memory held is the body
// read so far, never more than limit plus one read.
func (p *Proxy) readLimited(rw http.ResponseWriter, r *http.Request, limit int) ([]byte, error) {
	if r.ContentLength > int64(limit) {
		return nil, &http.MaxBytesError{Limit: int64(limit)}
	}
	idle := p.opts.StreamIdleTimeout
	if idle == 0 {
		idle = DefaultStreamIdleTimeout
	}
	var whole time.Time // the request timeout's deadline
	if p.opts.RequestTimeout > 0 {
		whole = time.Now().Add(p.opts.RequestTimeout)
	}
	rc := http.NewResponseController(rw)
	defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	chunk := make([]byte, 32<<10)
	for {
		var dl time.Time
		byIdle := idle > 0
		if byIdle {
			dl = time.Now().Add(idle)
		}
		if !whole.IsZero() && (dl.IsZero() || whole.Before(dl)) {
			dl, byIdle = whole, false
		}
		_ = rc.SetReadDeadline(dl) // unsupported: no bound, as before
		n, err := r.Body.Read(chunk)
		if buf.Len()+n > limit {
			return nil, &http.MaxBytesError{Limit: int64(limit)}
		}
		buf.Write(chunk[:n])
		switch {
		case err == io.EOF:
			return buf.Bytes(), nil
		case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
			if byIdle {
				return nil, errStreamIdle
			}
			return nil, errRequestTimeout
		case err != nil:
			return nil, err
		}
	}
}

// newRequest converts an incoming request to an Envoy-style request header
// map: pseudo-headers first, then the headers with lower-case names in
// sorted order, plus x-request-id and x-forwarded-proto when absent, as
// Envoy's connection manager adds them before the filters run.
func newRequest(r *http.Request) *request {
	s := &request{
		remoteAddr: r.RemoteAddr,
		protocol:   r.Proto,
		head:       r.Method == http.MethodHead,
	}
	if a, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		s.localAddr = a.String()
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	path := r.RequestURI
	if path == "" || !strings.HasPrefix(path, "/") {
		path = r.URL.RequestURI()
	}
	s.req.Add(":authority", r.Host)
	s.req.Add(":path", path)
	s.req.Add(":method", r.Method)
	s.req.Add(":scheme", scheme)
	names := make([]string, 0, len(r.Header))
	for name := range r.Header {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if isHopByHop(strings.ToLower(name)) {
			continue
		}
		for _, v := range r.Header[name] {
			s.req.Add(name, v)
		}
	}
	if _, ok := s.req.Get("x-forwarded-proto"); !ok {
		s.req.Add("x-forwarded-proto", scheme)
	}
	if _, ok := s.req.Get("x-request-id"); !ok {
		s.req.Add("x-request-id", newRequestID())
	}
	return s
}

// newRequestID returns a random UUID v4, like Envoy's generated
// x-request-id.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	x := hex.EncodeToString(b[:])
	return x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:]
}

// isHopByHop reports whether a lower-case header name is connection-
// specific and so never forwarded.
func isHopByHop(name string) bool {
	switch name {
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer":
		return true
	}
	return false
}

// forward sends the request, as the filter left it, to the upstream and
// returns the response as a header map (":status" first) and body.
func (p *Proxy) forward(st *wasmhost.Stream, r *http.Request) ([]wasmhost.Header, []byte, []wasmhost.Header) {
	out, err := upstreamRequest(r.Context(), st, r)
	if err != nil {
		hs, b := errorResponse(http.StatusBadRequest, "tokengate-local: "+err.Error()+"\n")
		return hs, b, nil
	}
	rec := &recorder{header: make(http.Header)}
	func() {
		defer func() {
			if v := recover(); v != nil {
				st.Log(wasmhost.LogError, fmt.Sprintf("upstream panicked: %v", v))
				rec.status, rec.body = http.StatusBadGateway, *bytes.NewBufferString("tokengate-local: upstream failed\n")
				rec.header, rec.sent = http.Header{"Content-Type": {"text/plain"}}, nil
			}
		}()
		p.upstream.ServeHTTP(rec, out)
	}()
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	// The headers as they were when the upstream wrote them; what it set
	// afterwards under a declared name or http.TrailerPrefix is trailers.
	sent := rec.sent
	if sent == nil {
		sent = rec.header
	}
	trailers := trailersOf(rec.header, declaredTrailers(sent))
	hs := []wasmhost.Header{{Name: ":status", Value: strconv.Itoa(rec.status)}}
	names := make([]string, 0, len(sent))
	for name := range sent {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		lname := strings.ToLower(name)
		if isHopByHop(lname) || lname == "content-length" || strings.HasPrefix(name, http.TrailerPrefix) {
			continue
		}
		for _, v := range sent[name] {
			hs = append(hs, wasmhost.Header{Name: lname, Value: v})
		}
	}
	body := rec.body.Bytes()
	hs = append(hs, wasmhost.Header{Name: "content-length", Value: strconv.Itoa(len(body))})
	return hs, body, trailers
}

func errorResponse(status int, msg string) ([]wasmhost.Header, []byte) {
	return []wasmhost.Header{{Name: ":status", Value: strconv.Itoa(status)}, {Name: "content-type", Value: "text/plain"}}, []byte(msg)
}

// recorder captures the upstream's response.
type recorder struct {
	header http.Header
	// sent is a copy of header when the status was written: the response
	// headers, as opposed to trailers set after the body.
	sent   http.Header
	status int
	body   bytes.Buffer
}

// Header implements http.ResponseWriter.
func (r *recorder) Header() http.Header { return r.header }

// WriteHeader implements http.ResponseWriter; the first status wins.
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
		r.sent = r.header.Clone()
	}
}

// Write implements http.ResponseWriter.
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(p)
}

// Flush implements http.Flusher (a no-op: the response is buffered).
func (r *recorder) Flush() {}
