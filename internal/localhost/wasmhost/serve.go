package wasmhost

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
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// phase is the stream callback that is running, which decides what the
// header-map and buffer host calls may touch (Envoy drops its pointer to a
// map once the callback that owns it returns Continue).
type phase int

const (
	phaseCreate phase = iota
	phaseRequestHeaders
	phaseRequestBody
	phaseResponseHeaders
	phaseResponseBody
	phaseResponseTrailers
	phaseLog
	phaseDone
)

// stream is one HTTP request's context in a worker VM.
type stream struct {
	id    uint32
	root  uint32 // the root context it was created under (roots.go)
	phase phase

	req, resp         headerMap
	reqBody, respBody []byte
	// respTrailers are the upstream's response trailers (trailers.go).
	respTrailers headerMap
	// reqHeld: on_request_headers returned Pause, so Envoy still holds the
	// request headers (readable and writable) in later callbacks.
	reqHeld bool

	local      *localReply
	continued  bool          // proxy_continue_stream was called
	wake       chan struct{} // signalled when a paused stream may go on
	reset      bool          // proxy_close_stream was called
	localReply bool          // the response callbacks are running on a local reply

	remoteAddr string // "ip:port" of the client
	localAddr  string // "ip:port" the client connected to
	protocol   string // "HTTP/1.1"
	grpc       bool   // the request is gRPC; see isGRPC
	head       bool   // the request is HEAD

	// rw is the client's response writer, for Options.StreamResponses.
	rw http.ResponseWriter

	props map[string][]byte // set with proxy_set_property
	// metadata is the dynamic metadata by namespace (jwt_authn's verified
	// payload); see metadataProperty.
	metadata map[string]map[string]any
}

// localReply is what proxy_send_local_response asked for.
type localReply struct {
	status     uint32
	details    string
	body       []byte
	headers    []Header
	grpcStatus int32 // -1 = none
}

// maxRequestBody bounds the request body the host buffers.
const maxRequestBody = 16 << 20

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
// (stream.go); a Pause without
// a local reply or proxy_continue_stream answers 500 instead of hanging;
// a VM trap answers 503 (Envoy's fail-closed reply) and the worker's VM is
// restarted on its next use.
func (h *Host) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if status := codecReply(h.opts.Manager, r); status != 0 {
		http.Error(rw, http.StatusText(status), status)
		return
	}
	s := newStream(r, nil)
	if !h.opts.Kong {
		mergeInline(&s.req)
	}
	if m := h.opts.Manager; m != nil {
		if status, location := m.apply(s, r); status != 0 {
			if location != "" {
				rw.Header().Set("Location", location)
			}
			http.Error(rw, http.StatusText(status), status)
			return
		}
	}
	if j := h.opts.JWTAuthn; j != nil {
		if status, msg := j.authenticate(s, h.wallNow()); status != 0 {
			rw.Header().Set("WWW-Authenticate", `Bearer realm="http://`+r.Host+r.URL.Path+`", error="invalid_token"`)
			http.Error(rw, msg, status)
			return
		}
	}
	w := h.workers[int(h.next.Add(1)-1)%len(h.workers)]
	s.rw = rw
	status, headers, respBody := h.run(w, s, r)
	if status == streamedStatus {
		return // streamUpstream answered (stream.go)
	}
	if s.reset {
		panic(http.ErrAbortHandler) // proxy_close_stream: reset the stream
	}
	out := rw.Header()
	for _, hd := range headers {
		if strings.HasPrefix(hd.Name, ":") || hd.Name == "content-length" || isHopByHop(hd.Name) {
			continue
		}
		out[textproto.CanonicalMIMEHeaderKey(hd.Name)] = append(out[textproto.CanonicalMIMEHeaderKey(hd.Name)], hd.Value)
	}
	trailers := s.respTrailers.h
	switch {
	case !s.head && len(trailers) > 0:
		// Chunked, so that the trailers can follow the body.
	case !s.head:
		out.Set("Content-Length", strconv.Itoa(len(respBody)))
	default:
		if v, ok := (&headerMap{h: headers}).get("content-length"); ok {
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

// run executes the stream lifecycle and returns the response to write.
func (h *Host) run(w *worker, s *stream, r *http.Request) (int, []Header, []byte) {
	failed := func(err error) (int, []Header, []byte) {
		h.hostLog(w, LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v; answering 503", w.index, err))
		hs, body := buildLocalReply(&localReply{status: 503, details: "wasm_fail_stream", grpcStatus: 14}, s.grpc, s.head)
		return 503, hs, body
	}

	// Request path.
	if err := w.acquire(); err != nil {
		return failed(err)
	}
	w.newStream(s)
	if _, err := w.callStream(s, phaseCreate, "proxy_on_context_create", uint64(s.id), uint64(s.root)); err != nil {
		return w.abandon(s, failed, err)
	}
	hasBody := r.ContentLength != 0 // -1: chunked, a body may follow
	action, err := w.callStream(s, phaseRequestHeaders, "proxy_on_request_headers",
		uint64(s.id), uint64(len(s.req.h)), boolArg(!hasBody))
	if err != nil {
		return w.abandon(s, failed, err)
	}
	paused := Action(action) == ActionPause
	s.reqHeld = paused
	if paused && s.local == nil && !s.reset && !s.continued {
		// Held, as Envoy holds a stream after StopAllIteration: until a
		// later callback (a tick, a callout's report) continues it or
		// replies, the client leaves, or the stream times out.
		if st, hs, b, done := h.hold(w, s, r); done {
			return st, hs, b
		}
		paused = !s.continued
	}
	if !paused && s.local == nil && !s.reset && hasBody {
		if st, hs, b, done := h.readBody(w, s, r); done {
			return st, hs, b
		}
	}
	if !paused && s.local == nil && !s.reset && hasBody {
		action, err = w.callStream(s, phaseRequestBody, "proxy_on_request_body",
			uint64(s.id), uint64(len(s.reqBody)), 1)
		if err != nil {
			return w.abandon(s, failed, err)
		}
		paused = Action(action) == ActionPause
	}
	w.mu.Unlock()

	// Upstream, or the local reply.
	switch {
	case s.reset:
	case s.local != nil:
		s.localReply = true
		s.resp.h, s.respBody = buildLocalReply(s.local, s.grpc, s.head)
	case paused && !s.continued:
		h.hostLog(w, LogError, "the filter paused the request body without a local reply or proxy_continue_stream; "+
			"the local host does not hold bodies; answering 500")
		s.localReply = true
		s.resp.h, s.respBody = buildLocalReply(&localReply{status: 500, grpcStatus: -1,
			body: []byte("tokengate-local: the filter paused the request body and never resumed it\n")}, s.grpc, s.head)
	case h.opts.StreamResponses:
		h.streamUpstream(w, s, r)
		return streamedStatus, nil, nil
	default:
		s.resp.h, s.respBody = h.forward(s, r)
	}

	// Response path.
	if err := w.acquire(); err != nil {
		return failed(err)
	}
	if err := w.responseCallbacks(s); err != nil {
		return w.abandon(s, failed, err)
	}
	if err := w.finish(s); err != nil {
		return failed(err)
	}
	w.mu.Unlock()

	status, err := strconv.Atoi(mustGet(&s.resp, ":status"))
	if err != nil || status < 100 || status > 999 {
		h.hostLog(w, LogError, fmt.Sprintf("response :status %q is not a status code; answering 502", mustGet(&s.resp, ":status")))
		return http.StatusBadGateway, nil, nil
	}
	return status, s.resp.h, s.respBody
}

// responseCallbacks runs the response's callbacks on the filter (w.mu
// held): headers, then the body and the trailers unless a local reply sent
// meanwhile replaces the response, as it does in Envoy.
func (w *worker) responseCallbacks(s *stream) error {
	if s.reset {
		return nil
	}
	first := s.local
	trailers := len(s.respTrailers.h) > 0
	eos := len(s.respBody) == 0 && !trailers
	if _, err := w.callStream(s, phaseResponseHeaders, "proxy_on_response_headers",
		uint64(s.id), uint64(len(s.resp.h)), boolArg(eos)); err != nil {
		return err
	}
	if len(s.respBody) > 0 && s.local == first && !s.reset {
		if _, err := w.callStream(s, phaseResponseBody, "proxy_on_response_body",
			uint64(s.id), uint64(len(s.respBody)), boolArg(!trailers)); err != nil {
			return err
		}
	}
	if trailers && s.local == first && !s.reset {
		// Trailers end the response (trailers.go).
		if err := w.responseTrailers(s); err != nil {
			return err
		}
	}
	if s.local != first {
		// A local reply sent while processing the upstream response
		// replaces it; the response callbacks do not run again.
		s.resp.h, s.respBody = buildLocalReply(s.local, s.grpc, s.head)
		s.respTrailers.h = nil
	}
	return nil
}

// hold waits, with w.mu released, until the paused stream s is continued,
// answered or reset from another callback, the client goes away, or the
// pause times out. It returns with w.mu held and done false when the
// request goes on; with done true (and w.mu released) when hold itself
// produced the answer.
func (h *Host) hold(w *worker, s *stream, r *http.Request) (status int, hs []Header, body []byte, done bool) {
	s.wake = make(chan struct{}, 1)
	timeout := h.opts.PauseTimeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		w.mu.Unlock()
		gone, timedOut := false, false
		select {
		case <-s.wake:
		case <-r.Context().Done():
			gone = true
		case <-timer.C:
			timedOut = true
		}
		if err := w.acquire(); err != nil {
			return http.StatusServiceUnavailable, nil, nil, true
		}
		if w.streams[s.id] != s {
			// The VM trapped and restarted: this stream died with it.
			w.mu.Unlock()
			hs, b := buildLocalReply(&localReply{status: 503, details: "wasm_fail_stream", grpcStatus: 14}, s.grpc, s.head)
			return 503, hs, b, true
		}
		switch {
		case s.local != nil || s.reset || s.continued:
			return 0, nil, nil, false
		case gone:
			// The client left while held: Envoy ends the stream, and the
			// filter hears of it through proxy_on_done and proxy_on_delete.
			err := w.finish(s)
			w.mu.Unlock()
			if err != nil {
				h.hostLog(w, LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v", w.index, err))
			}
			return 499, nil, nil, true
		case timedOut:
			h.hostLog(w, LogError, "the filter paused the request and neither resumed nor answered it within "+
				timeout.String()+"; answering 504 as a stream timeout")
			s.local = &localReply{status: 504, details: "stream_timeout", grpcStatus: 4,
				body: []byte("tokengate-local: the filter paused the request and never resumed it\n")}
			return 0, nil, nil, false
		}
	}
}

// readBody reads the request body, with w.mu released, once the filter
// has let the request go on. It returns with w.mu held and done false when
// the request goes on (a body over maxRequestBody becomes the host's 413
// reply, which the response callbacks see); with done true (and w.mu
// released) when the client went away or the VM restarted meanwhile.
func (h *Host) readBody(w *worker, s *stream, r *http.Request) (status int, hs []Header, body []byte, done bool) {
	w.mu.Unlock()
	b, err := io.ReadAll(http.MaxBytesReader(s.rw, r.Body, maxRequestBody))
	if aerr := w.acquire(); aerr != nil {
		return http.StatusServiceUnavailable, nil, nil, true
	}
	if w.streams[s.id] != s {
		w.mu.Unlock()
		hs, b := buildLocalReply(&localReply{status: 503, details: "wasm_fail_stream", grpcStatus: 14}, s.grpc, s.head)
		return 503, hs, b, true
	}
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		s.local = &localReply{status: http.StatusRequestEntityTooLarge, details: "request_payload_too_large", grpcStatus: -1,
			body: []byte("tokengate-local: the request body is over " + strconv.Itoa(maxRequestBody) + " bytes\n")}
	case err != nil:
		// The client went away while sending: Envoy resets the stream, and
		// the filter hears of it through proxy_on_done and proxy_on_delete.
		ferr := w.finish(s)
		w.mu.Unlock()
		if ferr != nil {
			h.hostLog(w, LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v", w.index, ferr))
		}
		return 499, nil, nil, true
	}
	s.reqBody = b
	return 0, nil, nil, false
}

// finish runs proxy_on_log, proxy_on_done and proxy_on_delete and forgets
// the stream. w.mu must be held; it stays held.
func (w *worker) finish(s *stream) error {
	defer w.endStream(s)
	if _, err := w.callStream(s, phaseLog, "proxy_on_log", uint64(s.id)); err != nil {
		return err
	}
	if _, err := w.callStream(s, phaseDone, "proxy_on_done", uint64(s.id)); err != nil {
		return err
	}
	_, err := w.callStream(s, phaseDone, "proxy_on_delete", uint64(s.id))
	return err
}

// abandon drops a stream whose VM trapped, unlocks the worker and answers
// with fail.
func (w *worker) abandon(s *stream, fail func(error) (int, []Header, []byte), err error) (int, []Header, []byte) {
	delete(w.streams, s.id)
	w.mu.Unlock()
	return fail(err)
}

func mustGet(m *headerMap, name string) string {
	v, _ := m.get(name)
	return v
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// newStream converts an incoming request to an Envoy-style request header
// map: pseudo-headers first, then the headers with lower-case names in
// sorted order, plus x-request-id and x-forwarded-proto when absent, as
// Envoy's connection manager adds them before the filters run.
func newStream(r *http.Request, body []byte) *stream {
	s := &stream{
		reqBody:    body,
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
	s.req.h = append(s.req.h,
		Header{":authority", r.Host},
		Header{":path", path},
		Header{":method", r.Method},
		Header{":scheme", scheme})
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
			s.req.add(name, v)
		}
	}
	if _, ok := s.req.get("x-forwarded-proto"); !ok {
		s.req.add("x-forwarded-proto", scheme)
	}
	if _, ok := s.req.get("x-request-id"); !ok {
		s.req.add("x-request-id", newRequestID())
	}
	ct, _ := s.req.get("content-type")
	s.grpc = isGRPC(ct)
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
func (h *Host) forward(s *stream, r *http.Request) ([]Header, []byte) {
	method, _ := s.req.get(":method")
	path, _ := s.req.get(":path")
	authority, _ := s.req.get(":authority")
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return errorResponse(http.StatusBadRequest, "tokengate-local: bad :path "+strconv.Quote(path)+"\n")
	}
	out, err := http.NewRequestWithContext(r.Context(), method, u.String(), bytes.NewReader(s.reqBody))
	if err != nil {
		return errorResponse(http.StatusBadRequest, "tokengate-local: "+err.Error()+"\n")
	}
	out.URL = u
	out.Host = authority
	out.RequestURI = path
	out.RemoteAddr = r.RemoteAddr
	out.Proto, out.ProtoMajor, out.ProtoMinor = r.Proto, r.ProtoMajor, r.ProtoMinor
	out.ContentLength = int64(len(s.reqBody))
	for _, hd := range s.req.h {
		if strings.HasPrefix(hd.Name, ":") {
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(hd.Name)
		out.Header[k] = append(out.Header[k], hd.Value)
	}
	rec := &recorder{header: make(http.Header)}
	func() {
		defer func() {
			if p := recover(); p != nil {
				h.hostLog(nil, LogError, fmt.Sprintf("upstream panicked: %v", p))
				rec.status, rec.body = http.StatusBadGateway, *bytes.NewBufferString("tokengate-local: upstream failed\n")
				rec.header, rec.sent = http.Header{"Content-Type": {"text/plain"}}, nil
			}
		}()
		h.upstream.ServeHTTP(rec, out)
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
	s.respTrailers.h = trailersOf(rec.header, declaredTrailers(sent))
	hs := []Header{{":status", strconv.Itoa(rec.status)}}
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
			hs = append(hs, Header{lname, v})
		}
	}
	body := rec.body.Bytes()
	hs = append(hs, Header{"content-length", strconv.Itoa(len(body))})
	return hs, body
}

func errorResponse(status int, msg string) ([]Header, []byte) {
	return []Header{{":status", strconv.Itoa(status)}, {"content-type", "text/plain"}}, []byte(msg)
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

// buildLocalReply turns a local reply into response headers and body the
// way Envoy's Http::Utility::prepareLocalReply does: ":status" and the
// filter's headers; for a gRPC request a trailers-only response (HTTP 200,
// content-type application/grpc, grpc-status unless the filter set one —
// the filter's grpc_status or one mapped from the HTTP status — and the body
// percent-encoded into grpc-message); otherwise content-length and, if the
// filter set none, content-type text/plain for a non-empty body.
func buildLocalReply(lr *localReply, grpc, head bool) ([]Header, []byte) {
	m := headerMap{h: []Header{{":status", strconv.FormatUint(uint64(lr.status), 10)}}}
	for _, hd := range lr.headers {
		m.add(hd.Name, hd.Value)
	}
	body := lr.body
	if grpc {
		m.replace(":status", "200")
		m.replace("content-type", "application/grpc")
		if _, ok := m.get("grpc-status"); !ok {
			code := int(lr.grpcStatus)
			if code < 0 || code > 16 {
				code = httpToGRPCStatus(int(lr.status))
			}
			m.replace("grpc-status", strconv.Itoa(code))
		}
		if len(body) > 0 && !head {
			m.replace("grpc-message", percentEncode(string(body)))
		}
		m.remove("content-length")
		return m.h, nil
	}
	if len(body) > 0 {
		m.replace("content-length", strconv.Itoa(len(body)))
		if _, ok := m.get("content-type"); !ok {
			m.add("content-type", "text/plain")
		}
	} else {
		m.remove("content-length")
		m.remove("content-type")
	}
	if head {
		body = nil
	}
	return m.h, append([]byte(nil), body...)
}

// httpToGRPCStatus is Envoy's Grpc::Utility::httpToGrpcStatus.
func httpToGRPCStatus(status int) int {
	switch status {
	case 400:
		return 13 // INTERNAL
	case 401:
		return 16 // UNAUTHENTICATED
	case 403:
		return 7 // PERMISSION_DENIED
	case 404:
		return 12 // UNIMPLEMENTED
	case 429, 502, 503, 504:
		return 14 // UNAVAILABLE
	}
	return 2 // UNKNOWN
}

// percentEncode is Envoy's PercentEncoding::encode for grpc-message: bytes
// below ' ', from '~' up, and '%' become %XX.
func percentEncode(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < ' ' || c >= '~' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// isGRPC is Envoy's Grpc::Common::hasGrpcContentType, case-insensitive:
// "application/grpc" followed by nothing, '+' or ';'. gRPC-Web is not
// gRPC to the local reply path.
func isGRPC(ct string) bool {
	const g = "application/grpc"
	if len(ct) < len(g) || !strings.EqualFold(ct[:len(g)], g) {
		return false
	}
	return len(ct) == len(g) || ct[len(g)] == '+' || ct[len(g)] == ';'
}
