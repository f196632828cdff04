package wasmhost

import (
	"context"
	"fmt"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// hostFn implements one env import. p holds the call's parameters, already
// decoded by wazero into uint64 slots; the returned Status is the result.
type hostFn func(ctx context.Context, w *worker, mem api.Memory, p []uint64) Status

// hostFuncs returns the implementation of every name in envImports.
func (h *Host) hostFuncs() map[string]hostFn {
	return map[string]hostFn{
		"proxy_log":                          h.proxyLog,
		"proxy_get_buffer_bytes":             h.getBufferBytes,
		"proxy_set_buffer_bytes":             h.setBufferBytes,
		"proxy_get_header_map_value":         h.getHeaderMapValue,
		"proxy_get_header_map_pairs":         h.getHeaderMapPairs,
		"proxy_set_header_map_pairs":         h.setHeaderMapPairs,
		"proxy_add_header_map_value":         h.addHeaderMapValue,
		"proxy_replace_header_map_value":     h.replaceHeaderMapValue,
		"proxy_remove_header_map_value":      h.removeHeaderMapValue,
		"proxy_send_local_response":          h.sendLocalResponse,
		"proxy_get_shared_data":              h.getSharedData,
		"proxy_set_shared_data":              h.setSharedData,
		"proxy_get_property":                 h.getProperty,
		"proxy_set_property":                 h.setProperty,
		"proxy_define_metric":                h.defineMetric,
		"proxy_increment_metric":             h.incrementMetric,
		"proxy_record_metric":                h.recordMetric,
		"proxy_get_metric":                   h.getMetric,
		"proxy_set_tick_period_milliseconds": h.setTickPeriod,
		"proxy_continue_stream":              h.continueStream,
		"proxy_close_stream":                 h.closeStream,
		"proxy_set_effective_context":        h.setEffectiveContext,
		"proxy_done":                         h.done,
		"proxy_http_call":                    h.httpCall,
		"proxy_grpc_call":                    h.grpcCall,
		"proxy_grpc_cancel":                  h.grpcCancel,
		"proxy_grpc_close":                   h.grpcCancel, // a unary call: closing is cancelling
		"proxy_get_status":                   h.getStatus,
		"proxy_call_foreign_function":        h.callForeignFunction,
	}
}

// instantiateEnv builds module "env" with exactly the envImports functions.
func (h *Host) instantiateEnv(ctx context.Context) error {
	impls := h.hostFuncs()
	b := h.rt.NewHostModuleBuilder("env")
	for name, s := range envImports {
		fn, ok := impls[name]
		if !ok {
			fn = h.unimplemented(name)
		}
		b.NewFunctionBuilder().
			WithGoModuleFunction(h.wrap(name, fn), s.params, s.results).
			Export(name)
	}
	_, err := b.Instantiate(ctx)
	return err
}

// wrap adapts a hostFn to wazero. A panic in the host function becomes
// INTERNAL_FAILURE and a log line, never a trap.
func (h *Host) wrap(name string, fn hostFn) api.GoModuleFunc {
	idx := importIndex(name)
	return func(ctx context.Context, mod api.Module, stack []uint64) {
		w, _ := ctx.Value(workerKey{}).(*worker)
		defer func() {
			if r := recover(); r != nil {
				h.hostLog(w, LogCritical, fmt.Sprintf("%s: host function panicked: %v", name, r))
				stack[0] = uint64(StatusInternalFailure)
			}
		}()
		if w == nil {
			h.hostLog(nil, LogCritical, name+": called outside a host callback")
			stack[0] = uint64(StatusInternalFailure)
			return
		}
		w.count(idx)
		if st, faulted := h.hostCall(w, name, stack); faulted {
			stack[0] = uint64(st)
			return
		}
		if h.opts.TimeHostCalls {
			t0 := time.Now()
			defer func() { w.hostNanos += int64(time.Since(t0)) }()
		}
		stack[0] = uint64(fn(ctx, w, mod.Memory(), stack))
	}
}

// Guest memory helpers. Every read is copied out at once: a later call into
// the guest allocator may grow memory and invalidate views.

func readBytes(mem api.Memory, ptr, n uint64) ([]byte, bool) {
	b, ok := mem.Read(uint32(ptr), uint32(n))
	if !ok {
		return nil, false
	}
	return append([]byte(nil), b...), true
}

func readString(mem api.Memory, ptr, n uint64) (string, bool) {
	b, ok := mem.Read(uint32(ptr), uint32(n))
	if !ok {
		return "", false
	}
	return string(b), true
}

// copyOut returns data to the guest as proxy-wasm-cpp-host's
// copyToPointerSize does: memory from the guest allocator (none for empty
// data: pointer 0, size 0), its address at ptrPtr and its size at sizePtr.
func (w *worker) copyOut(ctx context.Context, mem api.Memory, data []byte, ptrPtr, sizePtr uint64) Status {
	var ptr uint32
	if len(data) > 0 {
		var ok bool
		if ptr, ok = w.allocate(ctx, uint32(len(data))); !ok {
			return StatusInvalidMemoryAccess
		}
		if !mem.Write(ptr, data) {
			return StatusInvalidMemoryAccess
		}
	}
	if !mem.WriteUint32Le(uint32(ptrPtr), ptr) || !mem.WriteUint32Le(uint32(sizePtr), uint32(len(data))) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func (h *Host) proxyLog(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	msg, ok := readString(mem, p[1], p[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	level := LogLevel(uint32(p[0]))
	if level > LogCritical {
		level = LogCritical
	}
	if w.starting && level >= LogError {
		w.startErrs = append(w.startErrs, msg)
	}
	h.log(LogEntry{Level: level, Message: msg, Worker: w.index, Context: w.curID.Load()})
	return StatusOK
}

// buffer returns the buffer of type t visible in the running callback, or
// NOT_FOUND / BAD_ARGUMENT as Envoy answers.
func (h *Host) buffer(w *worker, t BufferType) (*[]byte, Status) {
	switch t {
	case BufferVMConfiguration:
		return &h.opts.VMConfig, StatusOK
	case BufferPluginConfiguration:
		return &h.opts.PluginConfig, StatusOK
	case BufferRequestBody:
		if s := w.cur; s != nil && s.phase == phaseRequestBody {
			return &s.reqBody, StatusOK
		}
	case BufferResponseBody:
		if s := w.cur; s != nil && s.phase == phaseResponseBody {
			return &s.respBody, StatusOK
		}
	case BufferHTTPCallResponse, BufferGRPCReceive:
		if r := w.callouts.current; r != nil {
			return &r.body, StatusOK
		}
	}
	if t > BufferPluginConfiguration {
		return nil, StatusBadArgument
	}
	return nil, StatusNotFound
}

func (h *Host) getBufferBytes(ctx context.Context, w *worker, mem api.Memory, p []uint64) Status {
	buf, st := h.buffer(w, BufferType(uint32(p[0])))
	if st != StatusOK {
		return st
	}
	start, length := uint64(uint32(p[1])), uint64(uint32(p[2]))
	size := uint64(len(*buf))
	if start > size {
		length = 0
	} else if start+length > size {
		length = size - start
	}
	var data []byte
	if length > 0 {
		data = append([]byte(nil), (*buf)[start:start+length]...)
	}
	return w.copyOut(ctx, mem, data, p[3], p[4])
}

func (h *Host) setBufferBytes(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	t := BufferType(uint32(p[0]))
	buf, st := h.buffer(w, t)
	if st != StatusOK {
		return st
	}
	data, ok := readBytes(mem, p[3], p[4])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	if t == BufferVMConfiguration || t == BufferPluginConfiguration {
		return StatusBadArgument // immutable, as in Envoy
	}
	start, length := uint64(uint32(p[1])), uint64(uint32(p[2]))
	// Envoy's Buffer::copyFrom: start 0 drains length bytes and prepends;
	// start at or past the end appends; anything else is BAD_ARGUMENT.
	switch size := uint64(len(*buf)); {
	case start == 0:
		*buf = append(data, (*buf)[min(length, size):]...)
	case start >= size:
		*buf = append(*buf, data...)
	default:
		return StatusBadArgument
	}
	return StatusOK
}

// HeaderMap returns the map of type t the running callback may use, as
// Envoy exposes them: request headers during proxy_on_request_headers (and
// later if it returned Pause), response headers during
// proxy_on_response_headers, response trailers during
// proxy_on_response_trailers, all of them during proxy_on_log.
func (w *worker) headerMap(t MapType) (*HeaderMap, Status) {
	if t > MapHTTPCallResponseTrailer {
		return nil, StatusBadArgument
	}
	if r := w.callouts.current; r != nil {
		switch t {
		case MapHTTPCallResponseHeaders, MapGRPCInitialMetadata:
			return &r.headers, StatusOK
		case MapHTTPCallResponseTrailer, MapGRPCTrailingMetadata:
			return &r.trailers, StatusOK
		}
	}
	s := w.cur
	if s == nil {
		return nil, StatusBadArgument
	}
	switch t {
	case MapRequestHeaders:
		if s.phase == phaseRequestHeaders || s.phase == phaseLog || s.reqHeld {
			return &s.req, StatusOK
		}
	case MapResponseHeaders:
		if s.phase == phaseResponseHeaders || s.phase == phaseLog {
			return &s.resp, StatusOK
		}
	case MapResponseTrailers:
		if s.phase == phaseResponseTrailers || s.phase == phaseLog && len(s.respTrailers.h) > 0 {
			return &s.respTrailers, StatusOK
		}
	}
	if s.phase == phaseLog {
		return nil, StatusNotFound
	}
	return nil, StatusBadArgument
}

func (h *Host) getHeaderMapValue(ctx context.Context, w *worker, mem api.Memory, p []uint64) Status {
	if MapType(uint32(p[0])) > MapHTTPCallResponseTrailer {
		return StatusBadArgument
	}
	key, ok := readString(mem, p[1], p[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	m, st := w.headerMap(MapType(uint32(p[0])))
	if st != StatusOK {
		return st
	}
	v, found := m.get(key)
	if !found {
		return StatusNotFound
	}
	return w.copyOut(ctx, mem, []byte(v), p[3], p[4])
}

func (h *Host) getHeaderMapPairs(ctx context.Context, w *worker, mem api.Memory, p []uint64) Status {
	m, st := w.headerMap(MapType(uint32(p[0])))
	if st != StatusOK {
		return st
	}
	var data []byte
	if len(m.h) > 0 {
		data = EncodeHeaders(m.h)
	}
	return w.copyOut(ctx, mem, data, p[1], p[2])
}

func (h *Host) setHeaderMapPairs(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	if MapType(uint32(p[0])) > MapHTTPCallResponseTrailer {
		return StatusBadArgument
	}
	data, ok := readBytes(mem, p[1], p[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	m, st := w.headerMap(MapType(uint32(p[0])))
	if st != StatusOK {
		return st
	}
	hs, err := DecodeHeaders(data)
	if err != nil {
		// Envoy's PairsUtil::toPairs yields no pairs, so the map is cleared.
		h.hostLog(w, LogError, "proxy_set_header_map_pairs: "+err.Error()+"; clearing the map as Envoy does")
		hs = nil
	}
	m.set(hs)
	return StatusOK
}

// headerEdit reads a key (and value, when withValue) and applies edit to
// the map.
func (h *Host) headerEdit(w *worker, mem api.Memory, p []uint64, withValue bool, edit func(m *HeaderMap, k, v string)) Status {
	if MapType(uint32(p[0])) > MapHTTPCallResponseTrailer {
		return StatusBadArgument
	}
	key, ok := readString(mem, p[1], p[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	var value string
	if withValue {
		if value, ok = readString(mem, p[3], p[4]); !ok {
			return StatusInvalidMemoryAccess
		}
	}
	m, st := w.headerMap(MapType(uint32(p[0])))
	if st != StatusOK {
		if st == StatusNotFound {
			st = StatusBadArgument // Envoy's getMap: nullptr → BadArgument
		}
		return st
	}
	edit(m, key, value)
	return StatusOK
}

func (h *Host) addHeaderMapValue(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	return h.headerEdit(w, mem, p, true, (*HeaderMap).add)
}

func (h *Host) replaceHeaderMapValue(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	return h.headerEdit(w, mem, p, true, (*HeaderMap).replace)
}

func (h *Host) removeHeaderMapValue(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	return h.headerEdit(w, mem, p, false, func(m *HeaderMap, k, _ string) { m.remove(k) })
}

func (h *Host) sendLocalResponse(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	details, ok1 := readString(mem, p[1], p[2])
	body, ok2 := readBytes(mem, p[3], p[4])
	rawHeaders, ok3 := readBytes(mem, p[5], p[6])
	if !ok1 || !ok2 || !ok3 {
		return StatusInvalidMemoryAccess
	}
	s := w.cur
	if s == nil {
		h.hostLog(w, LogError, "proxy_send_local_response called from a root context")
		return StatusBadArgument
	}
	if s.local != nil {
		h.hostLog(w, LogWarn, "proxy_send_local_response called twice on one stream; ignoring the second reply")
		return StatusBadArgument
	}
	hs, err := DecodeHeaders(rawHeaders)
	if err != nil {
		h.hostLog(w, LogError, "proxy_send_local_response: "+err.Error()+"; sending no extra headers as Envoy does")
		hs = nil
	}
	s.local = &LocalReply{
		Status:     uint32(p[0]),
		Details:    details,
		Body:       body,
		Headers:    hs,
		GRPCStatus: int32(uint32(p[7])),
	}
	s.wakeUp()
	return StatusOK
}

func (h *Host) getSharedData(ctx context.Context, w *worker, mem api.Memory, p []uint64) Status {
	key, ok := readString(mem, p[0], p[1])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	value, cas, st := h.store.Get(key)
	if st != StatusOK {
		return st
	}
	if st := w.copyOut(ctx, mem, value, p[2], p[3]); st != StatusOK {
		return st
	}
	if !mem.WriteUint32Le(uint32(p[4]), cas) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

func (h *Host) setSharedData(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	key, ok := readString(mem, p[0], p[1])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	value, ok := readBytes(mem, p[2], p[3])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	cas := uint32(p[4])
	if h.opts.Kong && uint32(p[2]) == 0 {
		// ngx_wasm_module: a NULL value pointer deletes the key (cas must
		// match; a missing key needs cas 0 and is a CAS mismatch anyway).
		d, ok := h.store.(sharedDeleter)
		if !ok {
			h.hostLog(w, LogError, "proxy_set_shared_data with a NULL value deletes the key on Kong, "+
				"but the store cannot delete under CAS; answering UNIMPLEMENTED")
			return StatusUnimplemented
		}
		return d.DeleteCAS(key, cas)
	}
	return h.store.Set(key, value, cas)
}

func (h *Host) getProperty(ctx context.Context, w *worker, mem api.Memory, p []uint64) Status {
	path, ok := readString(mem, p[0], p[1])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	v, found := w.property(path)
	if !found {
		return StatusNotFound
	}
	return w.copyOut(ctx, mem, v, p[2], p[3])
}

func (h *Host) setProperty(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	path, ok := readString(mem, p[0], p[1])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	value, ok := readBytes(mem, p[2], p[3])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	w.setProperty(path, value)
	return StatusOK
}

func (h *Host) defineMetric(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	t := MetricType(uint32(p[0]))
	if t > MetricHistogram {
		return StatusBadArgument
	}
	name, ok := readString(mem, p[1], p[2])
	if !ok {
		return StatusInvalidMemoryAccess
	}
	m, err := h.metrics.define(t, name)
	if err != nil {
		h.hostLog(w, LogError, "proxy_define_metric: "+err.Error())
		return StatusBadArgument
	}
	id := w.nextMetricID[t]
	if !mem.WriteUint32Le(uint32(p[3]), id) {
		return StatusInvalidMemoryAccess
	}
	w.nextMetricID[t] += metricIDIncrement
	w.metricIDs[id] = m
	return StatusOK
}

// Envoy's Context::incrementMetric: a counter takes only positive offsets
// and an unknown counter ID is BAD_ARGUMENT; a gauge moves either way and an
// unknown gauge ID is NOT_FOUND; histograms cannot be incremented.
func (h *Host) incrementMetric(_ context.Context, w *worker, _ api.Memory, p []uint64) Status {
	id, offset := uint32(p[0]), int64(p[1])
	m, ok := w.metricIDs[id]
	switch MetricType(id & metricTypeMask) {
	case MetricCounter:
		if !ok || offset <= 0 {
			return StatusBadArgument
		}
		m.value.Add(uint64(offset))
		return StatusOK
	case MetricGauge:
		if !ok {
			return StatusNotFound
		}
		m.value.Add(uint64(offset)) // two's complement: adds or subtracts
		return StatusOK
	}
	return StatusBadArgument
}

// Envoy's Context::recordMetric: a counter adds the value, a gauge is set to
// it, a histogram records it; an unknown ID is NOT_FOUND.
func (h *Host) recordMetric(_ context.Context, w *worker, _ api.Memory, p []uint64) Status {
	m, ok := w.metricIDs[uint32(p[0])]
	if !ok {
		return StatusNotFound
	}
	switch m.typ {
	case MetricCounter:
		m.value.Add(p[1])
	case MetricGauge:
		m.value.Store(p[1])
	case MetricHistogram:
		m.value.Add(1)
		m.sum.Add(p[1])
	}
	return StatusOK
}

func (h *Host) getMetric(_ context.Context, w *worker, mem api.Memory, p []uint64) Status {
	id := uint32(p[0])
	if MetricType(id&metricTypeMask) > MetricGauge {
		return StatusBadArgument
	}
	m, ok := w.metricIDs[id]
	if !ok {
		return StatusNotFound
	}
	if !mem.WriteUint64Le(uint32(p[1]), m.value.Load()) {
		return StatusInvalidMemoryAccess
	}
	return StatusOK
}

// setTickPeriod records the period and when it was set: Envoy recreates
// the timer on every call, so the next tick is one period after the latest
// call (setting it on every request postpones ticks for as long as requests
// keep coming).
//
// The period is the calling root context's (Envoy keeps one timer per
// root context id): the root called, or the root of the running stream.
func (h *Host) setTickPeriod(_ context.Context, w *worker, _ api.Memory, p []uint64) Status {
	r := w.root(w.curRoot)
	if r == nil {
		return StatusBadArgument
	}
	r.tickPeriod.Store(uint32(p[0]))
	r.tickSetAt.Store(time.Now().UnixNano())
	r.timerFrom.Store(h.monoNow())
	return StatusOK
}

// continueStream is proxy_continue_stream(type). A call with no stream
// effective (none is in a root callback until proxy_set_effective_context
// succeeds, and it fails for a stream that is gone) or on a request already
// continued is counted as stray (Host.StrayContinues).
func (h *Host) continueStream(_ context.Context, w *worker, _ api.Memory, p []uint64) Status {
	typ := StreamType(uint32(p[0]))
	if typ > StreamResponse {
		return StatusBadArgument
	}
	if w.cur == nil || w.streams[w.cur.id] != w.cur {
		h.strayContinues.Add(1)
		h.hostLog(w, LogError, "proxy_continue_stream: no stream is effective (gone, or proxy_set_effective_context not called)")
		return StatusBadArgument
	}
	if typ == StreamRequest && w.cur.continued {
		h.strayContinues.Add(1)
		h.hostLog(w, LogError, fmt.Sprintf("proxy_continue_stream: the request of stream %d was already continued", w.cur.id))
	}
	w.cur.continued = true
	w.cur.wakeUp()
	return StatusOK
}

func (h *Host) closeStream(_ context.Context, w *worker, _ api.Memory, p []uint64) Status {
	if StreamType(uint32(p[0])) > StreamResponse {
		return StatusBadArgument
	}
	if w.cur == nil {
		return StatusBadArgument
	}
	w.cur.reset = true
	w.cur.wakeUp()
	return StatusOK
}

func (h *Host) setEffectiveContext(_ context.Context, w *worker, _ api.Memory, p []uint64) Status {
	id := uint32(p[0])
	if w.root(id) != nil {
		w.cur = nil
		w.curID.Store(0)
		w.curRoot = id
		return StatusOK
	}
	s, ok := w.streams[id]
	if !ok {
		return StatusBadArgument
	}
	w.cur = s
	w.curID.Store(id)
	w.curRoot = s.root
	return StatusOK
}

// done is proxy_done: a root context whose proxy_on_done returned false
// says it has finished; it is deleted (roots.go) once the callback
// returns. Anywhere else it is NOT_FOUND, as in proxy-wasm-cpp-host.
func (h *Host) done(_ context.Context, w *worker, _ api.Memory, _ []uint64) Status {
	r := w.root(w.curRoot)
	if r == nil || !r.doneWait || w.cur != nil {
		return StatusNotFound
	}
	r.done = true
	return StatusOK
}

func (h *Host) callForeignFunction(_ context.Context, _ *worker, mem api.Memory, p []uint64) Status {
	if _, ok := mem.Read(uint32(p[0]), uint32(p[1])); !ok {
		return StatusInvalidMemoryAccess
	}
	if _, ok := mem.Read(uint32(p[2]), uint32(p[3])); !ok {
		return StatusInvalidMemoryAccess
	}
	return StatusNotFound // no foreign functions are registered, as in a bare Envoy
}

// unimplemented is the one answer to every ABI function the local host
// knows but does not model (shared queues, gRPC streams): a warning, once
// per worker and function, and UNIMPLEMENTED, as a host without the feature
// answers.
func (h *Host) unimplemented(name string) hostFn {
	return func(_ context.Context, w *worker, _ api.Memory, _ []uint64) Status {
		if w.warned == nil {
			w.warned = map[string]bool{}
		}
		if !w.warned[name] {
			w.warned[name] = true
			h.hostLog(w, LogWarn, name+" is not implemented by the local host; answering UNIMPLEMENTED")
		}
		return StatusUnimplemented
	}
}
