//go:build !wasip1

package dynmod

import (
	"errors"
	"strconv"
	"unsafe"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/ratelimitheader"
	"github.com/tokengate/tokengate/sharedstate/procstore"
)

// whost is a worker's filter.Host: calls act on the worker's current
// stream (worker.cur), as proxy-wasm calls act on the effective context.
type whost struct {
	w    *worker
	view procstore.View
	// hdrs is SendLocalResponse's scratch for the reply's headers.
	hdrs [][2]string
	// body is CallResponseBody's scratch for a body in several chunks.
	body []byte
	// The response headers set or added during a hook, sent to Envoy in
	// one call when the hook ends or before a response header is read
	// (flushHeaders): one crossing into C instead of one per header.
	// pendF is the stream they belong to.
	pendBuf []byte
	pendOps []uint32
	pendF   uintptr
	// box, while set (finishEarly), takes the response headers instead,
	// written straight into the mailbox; boxFull says some did not fit.
	box     *Mailbox
	boxFull bool
}

// queueHeader queues a set (add false) or add of a response header of the
// current stream.
func (h *whost) queueHeader(add bool, name, value string) {
	a := uint32(0)
	if add {
		a = 1
	}
	if b := h.box; b != nil { // finishEarly: the current stream is b's
		n, off := b.NHeaders, int(b.BufLen)
		mid := off + len(name)
		end := mid + len(value)
		if n >= MailboxHeaders || end > MailboxBytes {
			h.boxFull = true
			return
		}
		op := (*[3]uint32)(b.Ops[3*n:])
		op[0], op[1], op[2] = a, uint32(len(name)), uint32(len(value))
		copy(b.Buf[off:mid], name)
		copy(b.Buf[mid:end], value)
		b.NHeaders, b.BufLen = n+1, uint32(end)
		return
	}
	if !h.pend() {
		return
	}
	h.pendBuf = append(append(h.pendBuf, name...), value...)
	h.pendOps = append(h.pendOps, a, uint32(len(name)), uint32(len(value)))
}

// SetRateLimitHeaders formats the RateLimit headers of the current stream
// (the filter's rateLimitHeaderSetter) where they are sent from: straight
// into the mailbox when the stream finishes early, all or none (a mailbox
// they do not fit sends the stream down the ordinary path, which sets them
// again), otherwise into the queue of queueHeader. The bytes are
// ratelimitheader.AppendFields' (ratelimitheader.AppendHeaders).
func (h *whost) SetRateLimitHeaders(quotas []ratelimitheader.Quota, best int) {
	if bx := h.box; bx != nil {
		n, off := int(bx.NHeaders), int(bx.BufLen)
		if n > MailboxHeaders-5 {
			h.boxFull = true
			return
		}
		buf := bx.Buf[off:off:MailboxBytes]
		b, ops := ratelimitheader.AppendHeaders(buf, bx.Ops[3*n:3*n:3*MailboxHeaders], quotas, best)
		if cap(b) != cap(buf) || len(ops) != 15 { // outgrown: a copy
			h.boxFull = true
			return
		}
		bx.NHeaders, bx.BufLen = uint32(n+5), uint32(off+len(b))
		return
	}
	if !h.pend() {
		return
	}
	h.pendBuf, h.pendOps = ratelimitheader.AppendHeaders(h.pendBuf, h.pendOps, quotas, best)
}

// pend readies the queue for headers of the current stream, sending those
// queued for another; false when no stream is current.
func (h *whost) pend() bool {
	w := h.w
	if w.cur == 0 {
		return false
	}
	if h.pendF != w.cur {
		h.flushHeaders()
		h.pendF = w.cur
	}
	return true
}

// flushHeaders sends the queued response headers.
func (h *whost) flushHeaders() {
	if len(h.pendOps) == 0 {
		return
	}
	env.SetHeaders(h.pendF, ResponseHeader, h.pendBuf, h.pendOps)
	h.pendBuf, h.pendOps, h.pendF = h.pendBuf[:0], h.pendOps[:0], 0
}

// dropHeaders forgets the headers queued for stream f (it is destroyed).
func (h *whost) dropHeaders(f uintptr) {
	if h.pendF == f {
		h.pendBuf, h.pendOps, h.pendF = h.pendBuf[:0], h.pendOps[:0], 0
	}
}

var (
	_ filter.Host   = (*whost)(nil)
	_ filter.Caller = (*whost)(nil)
	_ filter.Ticker = (*whost)(nil)
)

var errRefused = errors.New("dynmod: Envoy refused the callout")

// Get implements sharedstate.Store over the process's store; the value is
// the worker's copy, valid until its next Get.
func (h *whost) Get(key string) ([]byte, uint32, error) { return h.view.Get(key) }

// Set implements sharedstate.Store.
func (h *whost) Set(key string, value []byte, cas uint32) error { return h.view.Set(key, value, cas) }

// Log implements filter.Host (callback_log).
func (h *whost) Log(level filter.LogLevel, msg string) { env.Log(level, msg) }

// DefineCounter implements filter.Host: every worker of a config shares its
// counters, defined with Envoy inside config_new.
func (h *whost) DefineCounter(name string) (uint32, error) { return h.w.c.defineCounter(name) }

// IncrementCounter implements filter.Host. Envoy counts on a stream: a
// count made outside one (a tick, a lease call's answer) is kept until the
// worker's next hook on a stream (worker.flushCounts). Negative deltas are
// dropped (Envoy's counters only grow).
func (h *whost) IncrementCounter(id uint32, delta int64) {
	w := h.w
	if delta <= 0 {
		return
	}
	if w.cur == 0 {
		if int(id) >= len(w.owed) {
			w.owed = append(w.owed, make([]uint64, int(id)+1-len(w.owed))...)
		}
		w.owed[id] += uint64(delta)
		w.owing = true
		return
	}
	eid, ok := w.c.envoyCounter(id)
	if !ok {
		return
	}
	if b := w.box; b != nil && b.NCounts < MailboxCounts {
		b.Counts[2*b.NCounts], b.Counts[2*b.NCounts+1] = eid, uint64(delta)
		b.NCounts++
		return
	}
	env.IncrementCounter(w.cur, eid, uint64(delta))
}

// RequestHeader implements filter.Host.
func (h *whost) RequestHeader(name string) (string, bool) {
	if h.w.cur == 0 {
		return "", false
	}
	v, _, ok := env.Header(h.w.cur, RequestHeader, name, 0)
	return v, ok
}

// RequestHeaderAll implements filter.Host: every value of the header,
// joined with ", ".
func (h *whost) RequestHeaderAll(name string) (string, bool) {
	if h.w.cur == 0 {
		return "", false
	}
	v, n, ok := env.Header(h.w.cur, RequestHeader, name, 0)
	if !ok || n <= 1 {
		return v, ok
	}
	joined := []byte(v)
	for i := 1; i < n; i++ {
		if x, _, ok := env.Header(h.w.cur, RequestHeader, name, i); ok {
			joined = append(append(joined, ", "...), x...)
		}
	}
	return string(joined), true
}

// Property implements filter.Host for source.address, the one property
// the ABI gives a filter as a string (with its port, as the filter
// expects); metadata paths are not readable field by field.
func (h *whost) Property(path ...string) ([]byte, bool) {
	v, ok := h.PropertyString(path...)
	return unsafe.Slice(unsafe.StringData(v), len(v)), ok
}

// PropertyString is Property as a string view.
func (h *whost) PropertyString(path ...string) (string, bool) {
	w := h.w
	if w.cur == 0 || len(path) != 2 || path[0] != "source" || path[1] != "address" {
		return "", false
	}
	if w.srcSet {
		return w.src, w.srcOK
	}
	return env.SourceAddress(w.cur)
}

// ViewString returns a string sharing b's bytes (the filter asks only for
// buffers it leaves alone while the view is used).
func (h *whost) ViewString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// ResponseHeader implements filter.Host.
func (h *whost) ResponseHeader(name string) (string, bool) {
	if h.w.cur == 0 {
		return "", false
	}
	h.flushHeaders()
	v, _, ok := env.Header(h.w.cur, ResponseHeader, name, 0)
	return v, ok
}

// SetResponseHeader implements filter.Host.
func (h *whost) SetResponseHeader(name, value string) { h.queueHeader(false, name, value) }

// SetResponseHeaderBytes is SetResponseHeader from bytes (queued as a
// copy).
func (h *whost) SetResponseHeaderBytes(name string, value []byte) {
	h.queueHeader(false, name, h.ViewString(value))
}

// AddResponseHeader implements filter.Host.
func (h *whost) AddResponseHeader(name, value string) { h.queueHeader(true, name, value) }

// AddResponseHeaderBytes is AddResponseHeader from bytes (queued as a
// copy).
func (h *whost) AddResponseHeaderBytes(name string, value []byte) {
	h.queueHeader(true, name, h.ViewString(value))
}

// SetRequestHeader replaces a request header of the current stream.
func (h *whost) SetRequestHeader(name, value string) {
	if h.w.cur != 0 {
		env.SetHeader(h.w.cur, RequestHeader, name, value)
	}
}

// SendLocalResponse implements filter.Host (http_send_response); a gRPC
// status is sent as the grpc-status header.
func (h *whost) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error {
	w := h.w
	if w.cur == 0 {
		return errGo
	}
	if grpcStatus != filter.NoGRPCStatus {
		h.hdrs = append(append(h.hdrs[:0], headers...), [2]string{"grpc-status", strconv.Itoa(int(grpcStatus))})
		headers = h.hdrs
	}
	if int(w.curSlot) < len(w.streams) && w.streams[w.curSlot].f == w.cur {
		w.streams[w.curSlot].replied = true
	}
	env.SendResponse(w.cur, status, headers, body, details)
	return nil
}

// HTTPCall implements filter.Caller. A callout belongs to a stream in
// Envoy, which cancels it when the stream is destroyed (the binding then
// answers it as failed, Destroy). It is made on the current stream; from a
// tick or an answer (no current stream), on the most recently paused
// stream of the worker; from a stream's response or end (a cluster
// settlement), on another live stream of the worker if there is one, so
// that it outlives the stream that made it.
func (h *whost) HTTPCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, error) {
	w := h.w
	f, slot := w.cur, w.curSlot
	if ending := f != 0 && w.ending == slot+1; f == 0 || ending {
		for i := len(w.streams) - 1; i >= 0; i-- {
			st := &w.streams[i]
			if !st.live || ending && uint32(i) == slot {
				continue
			}
			if st.sched != 0 || ending { // from a tick: a paused stream; from an end: any other
				f, slot = st.f, uint32(i)
				break
			}
		}
	}
	if f == 0 {
		return 0, errGo
	}
	id, ok := env.Callout(f, cluster, headers, body, uint64(timeoutMs))
	if !ok {
		return 0, errRefused
	}
	if w.token++; w.token == 0 {
		w.token = 1
	}
	w.calls = append(w.calls, call{token: w.token, id: id, slot: slot})
	return w.token, nil
}

// CallResponseHeader implements filter.Caller over the answer being
// delivered.
func (h *whost) CallResponseHeader(name string) (string, bool) {
	if r := h.w.resp; r != nil {
		for _, kv := range r.Headers {
			if kv[0] == name {
				return kv[1], true
			}
		}
	}
	return "", false
}

// CallResponseTrailer implements filter.Caller: the ABI delivers no
// trailers, so a trailer is looked for among the headers (a gRPC
// trailers-only answer carries grpc-status there).
func (h *whost) CallResponseTrailer(name string) (string, bool) { return h.CallResponseHeader(name) }

// CallResponseBody implements filter.Caller: the body's chunks, joined
// when there are several.
func (h *whost) CallResponseBody(size int) ([]byte, bool) {
	r := h.w.resp
	if r == nil {
		return nil, size == 0
	}
	if len(r.Body) == 1 {
		return r.Body[0], true
	}
	h.body = h.body[:0]
	for _, b := range r.Body {
		h.body = append(h.body, b...)
	}
	return h.body, true
}

// SetEffectiveContext implements filter.Caller: stream id of this worker
// becomes the current one, if it is still alive.
func (h *whost) SetEffectiveContext(id uint32) bool {
	w := h.w
	slot := id&slotMask - 1
	if int(slot) >= len(w.streams) {
		return false
	}
	st := &w.streams[slot]
	if !st.live || st.id != id {
		return false
	}
	w.cur, w.curSlot = st.f, slot
	return true
}

// ContinueRequest implements filter.Caller (continue_decoding).
func (h *whost) ContinueRequest() error {
	if h.w.cur == 0 {
		return errGo
	}
	env.ContinueDecoding(h.w.cur)
	return nil
}

// SetTickPeriod implements filter.Ticker with the worker's timer.
func (h *whost) SetTickPeriod(ms uint32) error { return h.w.setTick(ms) }

// BinaryValues implements sharedstate.BinaryValues (procstore.View).
func (h *whost) BinaryValues() bool { return true }
