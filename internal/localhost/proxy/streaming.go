package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// Streaming responses (Options.StreamResponses)
//
// With StreamResponses the upstream's response goes to the client as it
// arrives, the way Envoy passes a response through a filter that answers
// Continue: proxy_on_response_headers when the upstream sends its headers,
// then proxy_on_response_body once for every piece the upstream writes
// (end_of_stream 0), each written and flushed to the client before the
// next, and a last proxy_on_response_body(0, end_of_stream 1) when the
// upstream finishes, or proxy_on_response_trailers when it ends with
// trailers (trailers.go). proxy_get_buffer_bytes(RESPONSE_BODY) sees the
// current piece only. If the client goes away, or the upstream aborts
// after its headers, the stream ends without end_of_stream: proxy_on_log,
// proxy_on_done and proxy_on_delete run, and an aborted upstream resets
// the client's stream. A local reply the filter sends while handling the
// response headers replaces the response, as without streaming.

// streamWriter is the http.ResponseWriter the upstream writes to.
type streamWriter struct {
	p   *Proxy
	st  *wasmhost.Stream
	rw  http.ResponseWriter
	ctx context.Context
	// head: the request is HEAD, so no body goes to the client.
	head bool

	header      http.Header
	wroteHeader bool
	replaced    bool // the filter sent a local reply: the upstream's body is dropped
	gone        bool // the client went away
	headSent    bool // the status and headers went to the client
	failed      error
	// declared are the trailer names the upstream announced in its
	// "Trailer" header (trailers.go).
	declared []string
}

var errClientGone = errors.New("tokengate-local: the client went away")

func (sw *streamWriter) Header() http.Header { return sw.header }

func (sw *streamWriter) WriteHeader(code int) {
	if sw.wroteHeader {
		return
	}
	sw.wroteHeader = true
	st := sw.st
	sw.declared = declaredTrailers(sw.header)
	hs := []wasmhost.Header{{Name: ":status", Value: strconv.Itoa(code)}}
	names := make([]string, 0, len(sw.header))
	for name := range sw.header {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		lname := strings.ToLower(name)
		if isHopByHop(lname) {
			continue
		}
		for _, v := range sw.header[name] {
			hs = append(hs, wasmhost.Header{Name: lname, Value: v})
		}
	}
	if err := st.Lock(); err != nil {
		sw.failed = err
		return
	}
	replaced, err := st.OnResponseHeaders(hs)
	st.Unlock()
	if err != nil {
		sw.failed = err
		return
	}
	sw.replaced = replaced
	resp, body, _ := st.Response()
	sw.writeHead(resp)
	if sw.replaced && !sw.head {
		_, _ = sw.rw.Write(body)
	}
	sw.flush()
}

// writeHead writes status and headers to the client.
func (sw *streamWriter) writeHead(hs []wasmhost.Header) {
	out := sw.rw.Header()
	status := http.StatusOK
	for _, hd := range hs {
		if hd.Name == ":status" {
			status, _ = strconv.Atoi(hd.Value)
			continue
		}
		if strings.HasPrefix(hd.Name, ":") || isHopByHop(hd.Name) {
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(hd.Name)
		out[k] = append(out[k], hd.Value)
	}
	sw.rw.WriteHeader(status)
	sw.headSent = true
}

func (sw *streamWriter) flush() {
	if f, ok := sw.rw.(http.Flusher); ok {
		f.Flush()
	}
}

// Flush implements http.Flusher.
func (sw *streamWriter) Flush() {
	if !sw.wroteHeader {
		sw.WriteHeader(http.StatusOK)
	}
	sw.flush()
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	if !sw.wroteHeader {
		sw.WriteHeader(http.StatusOK)
	}
	switch {
	case sw.failed != nil:
		return 0, sw.failed
	case sw.gone:
		return 0, errClientGone
	case sw.replaced || len(p) == 0:
		return len(p), nil
	}
	if err := sw.body(p, false); err != nil {
		return 0, err
	}
	if sw.head {
		return len(p), nil
	}
	if _, err := sw.rw.Write(p); err != nil {
		sw.gone = true
		return 0, errClientGone
	}
	sw.flush()
	if sw.ctx.Err() != nil {
		sw.gone = true
		return len(p), errClientGone
	}
	return len(p), nil
}

// body runs proxy_on_response_body on one piece.
func (sw *streamWriter) body(p []byte, eos bool) error {
	return sw.locked(func() error { return sw.st.OnResponseBody(p, eos) })
}

// locked runs f with the worker's lock; if f fails, the stream is gone
// and the writer fails with it.
func (sw *streamWriter) locked(f func() error) error {
	if err := sw.st.Lock(); err != nil {
		sw.failed = err
		return err
	}
	err := f()
	sw.st.Unlock()
	if err != nil {
		sw.failed = err
	}
	return err
}

// trailers runs proxy_on_response_trailers on the upstream's trailers,
// which end the stream instead of an end_of_stream body callback.
func (sw *streamWriter) trailers(ts []wasmhost.Header) error {
	return sw.locked(func() error { return sw.st.OnResponseTrailers(ts) })
}

// streamUpstream sends the request to the upstream and streams its
// response to the client through the filter; run has unlocked the worker.
func (p *Proxy) streamUpstream(st *wasmhost.Stream, rw http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sw := &streamWriter{p: p, st: st, rw: rw, ctx: ctx, head: r.Method == http.MethodHead, header: make(http.Header)}
	out, err := upstreamRequest(ctx, st, r)
	aborted := false
	if err != nil {
		hs, b := errorResponse(http.StatusBadRequest, "tokengate-local: "+err.Error()+"\n")
		sw.header = http.Header{}
		for _, hd := range hs[1:] {
			sw.header.Set(hd.Name, hd.Value)
		}
		sw.WriteHeader(http.StatusBadRequest)
		_, _ = sw.Write(b)
	} else {
		func() {
			defer func() {
				if v := recover(); v != nil {
					aborted = true
					if v != http.ErrAbortHandler {
						st.Log(wasmhost.LogError, fmt.Sprintf("upstream panicked: %v", v))
					}
				}
			}()
			p.upstream.ServeHTTP(sw, out)
		}()
	}
	if !aborted && !sw.wroteHeader && sw.failed == nil {
		sw.WriteHeader(http.StatusOK)
	}
	if sw.failed != nil {
		// The VM trapped (it restarts on its next use): Envoy's
		// fail-closed answer if the client has no headers yet, else a
		// reset.
		st.Log(wasmhost.LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v", st.Worker(), sw.failed))
		if !sw.headSent {
			sw.rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		panic(http.ErrAbortHandler)
	}
	ended := !aborted && !sw.gone && sw.ctx.Err() == nil
	if ended && !sw.replaced {
		if ts := trailersOf(sw.header, sw.declared); len(ts) > 0 {
			// Trailers end the stream: no end_of_stream body callback,
			// as in Envoy (trailers.go).
			if err := sw.trailers(ts); err != nil {
				panic(http.ErrAbortHandler)
			}
			if !sw.head {
				_, _, ts := st.Response()
				writeTrailers(sw.rw, ts)
			}
		} else if err := sw.body(nil, true); err != nil {
			panic(http.ErrAbortHandler)
		}
	}
	if err := st.Lock(); err != nil {
		panic(http.ErrAbortHandler)
	}
	err = st.Finish()
	st.Unlock()
	if err != nil {
		st.Log(wasmhost.LogCritical, fmt.Sprintf("worker %d: wasm VM failed: %v", st.Worker(), err))
	}
	if !ended {
		if !sw.headSent {
			sw.rw.WriteHeader(http.StatusBadGateway)
			return
		}
		panic(http.ErrAbortHandler) // reset the client's stream
	}
}

// upstreamRequest is the request the upstream gets, as the filter left it.
func upstreamRequest(ctx context.Context, st *wasmhost.Stream, r *http.Request) (*http.Request, error) {
	reqHeaders, reqBody := st.Request()
	req := wasmhost.NewHeaderMap(reqHeaders)
	method, _ := req.Get(":method")
	path, _ := req.Get(":path")
	authority, _ := req.Get(":authority")
	u, err := url.ParseRequestURI(path)
	if err != nil {
		return nil, fmt.Errorf("bad :path %q", path)
	}
	out, err := http.NewRequestWithContext(ctx, method, u.String(), bytes.NewReader(reqBody))
	if err != nil {
		return nil, err
	}
	out.URL = u
	out.Host = authority
	out.RequestURI = path
	out.RemoteAddr = r.RemoteAddr
	out.Proto, out.ProtoMajor, out.ProtoMinor = r.Proto, r.ProtoMajor, r.ProtoMinor
	out.ContentLength = int64(len(reqBody))
	for _, hd := range reqHeaders {
		if strings.HasPrefix(hd.Name, ":") {
			continue
		}
		k := textproto.CanonicalMIMEHeaderKey(hd.Name)
		out.Header[k] = append(out.Header[k], hd.Value)
	}
	return out, nil
}
