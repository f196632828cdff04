package wasmhost

import (
	"fmt"
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

	req, resp         HeaderMap
	reqBody, respBody []byte
	// respTrailers are the upstream's response trailers (trailers.go).
	respTrailers HeaderMap
	// reqHeld: on_request_headers returned Pause, so Envoy still holds the
	// request headers (readable and writable) in later callbacks.
	reqHeld bool

	local      *LocalReply
	continued  bool          // proxy_continue_stream was called
	wake       chan struct{} // signalled when a paused stream may go on
	reset      bool          // proxy_close_stream was called
	localReply bool          // the response callbacks are running on a local reply

	remoteAddr string // "ip:port" of the client
	localAddr  string // "ip:port" the client connected to
	protocol   string // "HTTP/1.1"
	grpc       bool   // the request is gRPC; see isGRPC
	head       bool   // the request is HEAD

	props map[string][]byte // set with proxy_set_property
	// metadata is the dynamic metadata by namespace (jwt_authn's verified
	// payload); see MetadataProperty.
	metadata map[string]map[string]any
}

// LocalReply is a local reply: what proxy_send_local_response asked for,
// or one the host sends itself (a stream timeout, a body too large).
type LocalReply struct {
	Status     uint32
	Details    string
	Body       []byte
	Headers    []Header
	GRPCStatus int32 // -1 = none
}

// Downstream is a request as Envoy's connection manager hands it to the
// filter chain.
type Downstream struct {
	// Headers is the request header map: lower-case names, the
	// pseudo-headers (":authority", ":path", ":method", ":scheme") first.
	Headers []Header
	// RemoteAddr and LocalAddr are the client's "ip:port" and the one it
	// connected to (source.address, destination.address).
	RemoteAddr, LocalAddr string
	// Protocol is request.protocol, e.g. "HTTP/1.1".
	Protocol string
	// Metadata is the dynamic metadata by namespace, read through the
	// "metadata" properties (MetadataProperty).
	Metadata map[string]map[string]any
}

// Stream is one HTTP stream context in one worker VM, driven in Envoy's
// order by what serves the requests (internal/localhost/proxy serves HTTP
// with it): Create, OnRequestHeaders, maybe OnRequestBody, then the
// upstream's response or the local reply (SetResponse or UseLocalReply),
// OnResponse or the streamed callbacks (OnResponseHeaders,
// OnResponseBody, OnResponseTrailers), and Finish.
//
// The methods that call into the guest, and those that read or change the
// stream's state, need the worker's lock, taken with Lock and given back
// with Unlock: the worker runs one callback at a time, and between them
// other streams of the worker and its ticks run. A callback that traps
// drops the stream (the VM restarts on its next Lock) and returns the
// error.
type Stream struct {
	w *worker
	s *stream
}

// NewStream makes a stream for req on the next worker, round-robin. It
// does not call the guest.
func (h *Host) NewStream(req Downstream) *Stream {
	s := &stream{
		remoteAddr: req.RemoteAddr,
		localAddr:  req.LocalAddr,
		protocol:   req.Protocol,
		metadata:   req.Metadata,
	}
	s.req.h = append(make([]Header, 0, len(req.Headers)+4), req.Headers...)
	ct, _ := s.req.get("content-type")
	s.grpc = isGRPC(ct)
	m, _ := s.req.get(":method")
	s.head = m == "HEAD"
	w := h.workers[int(h.next.Add(1)-1)%len(h.workers)]
	return &Stream{w: w, s: s}
}

// Lock takes the worker's lock, restarting its VM first if it trapped
// (Envoy's FAIL_RELOAD). On error the lock is not held.
func (st *Stream) Lock() error { return st.w.acquire() }

// Unlock gives the worker's lock back.
func (st *Stream) Unlock() { st.w.mu.Unlock() }

// Worker is the index of the stream's worker.
func (st *Stream) Worker() int { return st.w.index }

// Log records a line from the host about this stream.
func (st *Stream) Log(level LogLevel, msg string) { st.w.h.hostLog(st.w, level, msg) }

// Alive reports whether the stream still lives in its worker's VM: false
// once the VM trapped and restarted (the stream died with it) or the
// stream was dropped.
func (st *Stream) Alive() bool { return st.w.streams[st.s.id] == st.s }

// fail drops the stream after a trap and returns err.
func (st *Stream) fail(err error) error {
	delete(st.w.streams, st.s.id)
	return err
}

// Create registers the stream under the current root context and runs
// proxy_on_context_create.
func (st *Stream) Create() error {
	w, s := st.w, st.s
	w.newStream(s)
	if _, err := w.callStream(s, phaseCreate, "proxy_on_context_create", uint64(s.id), uint64(s.root)); err != nil {
		return st.fail(err)
	}
	return nil
}

// OnRequestHeaders runs proxy_on_request_headers, end_of_stream false when
// a body follows, and reports whether the filter paused the request.
func (st *Stream) OnRequestHeaders(endOfStream bool) (paused bool, err error) {
	w, s := st.w, st.s
	action, err := w.callStream(s, phaseRequestHeaders, "proxy_on_request_headers",
		uint64(s.id), uint64(len(s.req.h)), boolArg(endOfStream))
	if err != nil {
		return false, st.fail(err)
	}
	s.reqHeld = Action(action) == ActionPause
	return s.reqHeld, nil
}

// OnRequestBody gives the filter the whole request body, end_of_stream
// set, in proxy_on_request_body, and reports whether it paused.
func (st *Stream) OnRequestBody(body []byte) (paused bool, err error) {
	w, s := st.w, st.s
	s.reqBody = body
	// The body is a new chance to pause: Envoy's decodeData may return
	// StopIterationAndBuffer after decodeHeaders went on, and a later
	// callback (a callout's answer) continues it with proxy_continue_stream.
	s.continued = false
	action, err := w.callStream(s, phaseRequestBody, "proxy_on_request_body", uint64(s.id), uint64(len(s.reqBody)), 1)
	if err != nil {
		return false, st.fail(err)
	}
	return Action(action) == ActionPause, nil
}

// WakeUps returns the channel that is signalled when a paused stream may
// go on: proxy_continue_stream, a local reply or proxy_close_stream from a
// later callback, or its VM restarted.
func (st *Stream) WakeUps() <-chan struct{} {
	if st.s.wake == nil {
		st.s.wake = make(chan struct{}, 1)
	}
	return st.s.wake
}

// Continued reports whether the filter called proxy_continue_stream.
func (st *Stream) Continued() bool { return st.s.continued }

// Closed reports whether the filter called proxy_close_stream: the stream
// is to be reset.
func (st *Stream) Closed() bool { return st.s.reset }

// Replied reports whether a local reply was sent (by the filter or with
// SendLocalReply).
func (st *Stream) Replied() bool { return st.s.local != nil }

// SendLocalReply makes lr the stream's local reply, as the host's own
// answer (a stream timeout, a body too large).
func (st *Stream) SendLocalReply(lr LocalReply) { st.s.local = &lr }

// UseLocalReply makes the local reply the response, before the response
// callbacks run on it.
func (st *Stream) UseLocalReply() {
	s := st.s
	s.localReply = true
	s.resp.h, s.respBody = buildLocalReply(s.local, s.grpc, s.head)
}

// Render is lr as a response to this stream's request: see
// buildLocalReply.
func (st *Stream) Render(lr LocalReply) ([]Header, []byte) {
	return buildLocalReply(&lr, st.s.grpc, st.s.head)
}

// Request returns the request header map and body as the filter left
// them.
func (st *Stream) Request() ([]Header, []byte) { return st.s.req.h, st.s.reqBody }

// SetResponse makes the upstream's response the stream's: the header map
// (":status" first), the body and the trailers.
func (st *Stream) SetResponse(hs []Header, body []byte, trailers []Header) {
	st.s.resp.h, st.s.respBody, st.s.respTrailers.h = hs, body, trailers
}

// Response returns the response as the filter left it.
func (st *Stream) Response() (hs []Header, body []byte, trailers []Header) {
	return st.s.resp.h, st.s.respBody, st.s.respTrailers.h
}

// OnResponse runs the response's callbacks on a whole response: headers,
// then the body and the trailers, unless a local reply sent meanwhile
// replaces the response, as it does in Envoy.
func (st *Stream) OnResponse() error {
	if err := st.w.responseCallbacks(st.s); err != nil {
		return st.fail(err)
	}
	return nil
}

// OnResponseHeaders runs proxy_on_response_headers on the headers of a
// response that streams (end_of_stream false). If the filter sends a
// local reply meanwhile, the reply becomes the response and replaced is
// true: the upstream's body is then dropped.
func (st *Stream) OnResponseHeaders(hs []Header) (replaced bool, err error) {
	w, s := st.w, st.s
	s.resp.h = hs
	first := s.local
	if _, err := w.callStream(s, phaseResponseHeaders, "proxy_on_response_headers", uint64(s.id), uint64(len(s.resp.h)), 0); err != nil {
		return false, st.fail(err)
	}
	if s.local != first {
		st.UseLocalReply()
		return true, nil
	}
	return false, nil
}

// OnResponseBody runs proxy_on_response_body on one piece of a response
// that streams; RESPONSE_BODY is that piece.
func (st *Stream) OnResponseBody(p []byte, endOfStream bool) error {
	w, s := st.w, st.s
	s.respBody = append(s.respBody[:0], p...)
	if _, err := w.callStream(s, phaseResponseBody, "proxy_on_response_body", uint64(s.id), uint64(len(p)), boolArg(endOfStream)); err != nil {
		return st.fail(err)
	}
	return nil
}

// OnResponseTrailers runs proxy_on_response_trailers on the upstream's
// trailers, which end the stream instead of an end_of_stream body
// callback.
func (st *Stream) OnResponseTrailers(ts []Header) error {
	st.s.respTrailers.h = ts
	if err := st.w.responseTrailers(st.s); err != nil {
		return st.fail(err)
	}
	return nil
}

// Finish runs proxy_on_log, proxy_on_done and proxy_on_delete and forgets
// the stream.
func (st *Stream) Finish() error { return st.w.finish(st.s) }

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

func mustGet(m *HeaderMap, name string) string {
	v, _ := m.get(name)
	return v
}

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// buildLocalReply turns a local reply into response headers and body the
// way Envoy's Http::Utility::prepareLocalReply does: ":status" and the
// filter's headers; for a gRPC request a trailers-only response (HTTP 200,
// content-type application/grpc, grpc-status unless the filter set one —
// the filter's grpc_status or one mapped from the HTTP status — and the body
// percent-encoded into grpc-message); otherwise content-length and, if the
// filter set none, content-type text/plain for a non-empty body.
func buildLocalReply(lr *LocalReply, grpc, head bool) ([]Header, []byte) {
	m := HeaderMap{h: []Header{{":status", strconv.FormatUint(uint64(lr.Status), 10)}}}
	for _, hd := range lr.Headers {
		m.add(hd.Name, hd.Value)
	}
	body := lr.Body
	if grpc {
		m.replace(":status", "200")
		m.replace("content-type", "application/grpc")
		if _, ok := m.get("grpc-status"); !ok {
			code := int(lr.GRPCStatus)
			if code < 0 || code > 16 {
				code = httpToGRPCStatus(int(lr.Status))
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

// Kong reports whether the host runs in Kong mode (Options.Kong).
func (h *Host) Kong() bool { return h.opts.Kong }

// WallNow is the host's wall clock: Options.Walltime if set, else the
// real one; what the guest reads as the time.
func (h *Host) WallNow() time.Time { return h.wallNow() }
