//go:build wasip1

package abi

import (
	"errors"
	"strconv"

	"github.com/tokengate/tokengate/filter"
	"github.com/tokengate/tokengate/sharedstate"
)

// host implements filter.Host over the imports. Calls act on the context
// the host is currently calling into. Its methods have pointer receivers:
// called through the interface, a value receiver would go through a
// compiler-generated wrapper, one more guest call per host call.
type host struct{}

// theHost is the one host value every plugin uses.
var theHost = &host{}

var _ filter.Host = (*host)(nil)

// ret holds the return slots the host writes through. They are package
// variables because a local whose address reaches a wasmimport call escapes
// to the heap: one allocation per host call. A VM runs one callback at a
// time, and malloc, which the host may call meanwhile, does not touch them.
var ret struct {
	data, size, cas uint32
	ns              uint64
}

// statusError is a Status other than OK, NOT_FOUND or CAS_MISMATCH.
type statusError uint32

func (s statusError) Error() string {
	return "proxy-wasm status " + strconv.FormatUint(uint64(s), 10)
}

var errBadReturn = errors.New("proxy-wasm: host returned memory it did not allocate")

func (*host) Log(level filter.LogLevel, msg string) {
	proxyLog(uint32(level), ptr(msg), uint32(len(msg)))
}

// LogBytes is Log with the message in a byte slice, which the host copies.
func (*host) LogBytes(level filter.LogLevel, msg []byte) {
	proxyLog(uint32(level), bptr(msg), uint32(len(msg)))
}

// Get returns the value in memory that stays valid until the callback
// returns (see memory.go); sharedstate parses it at once.
func (*host) Get(key string) ([]byte, uint32, error) {
	unpin()
	switch st := proxyGetSharedData(ptr(key), uint32(len(key)), &ret.data, &ret.size, &ret.cas); st {
	case statusOK:
	case statusNotFound:
		return nil, 0, sharedstate.ErrNotFound
	case statusUnimplemented: // APISIX: the filter keeps state per worker
		return nil, 0, sharedstate.ErrUnimplemented
	default:
		return nil, 0, statusError(st)
	}
	b, ok := returned(ret.data, ret.size)
	if !ok {
		return nil, 0, errBadReturn
	}
	return b, ret.cas, nil
}

func (*host) Set(key string, value []byte, cas uint32) error {
	switch st := proxySetSharedData(ptr(key), uint32(len(key)), bptr(value), uint32(len(value)), cas); st {
	case statusOK:
		return nil
	case statusCASMismatch:
		return sharedstate.ErrCASMismatch
	case statusNotFound:
		// ngx_wasm_module may answer a stale cas on a vanished key this way.
		return sharedstate.ErrCASMismatch
	case statusUnimplemented:
		return sharedstate.ErrUnimplemented
	default:
		return statusError(st)
	}
}

func (*host) DefineCounter(name string) (uint32, error) {
	if st := proxyDefineMetric(metricCounter, ptr(name), uint32(len(name)), &ret.data); st != statusOK {
		return 0, statusError(st)
	}
	return ret.data, nil
}

func (*host) IncrementCounter(id uint32, delta int64) {
	proxyIncrementMetric(id, delta)
}

// RequestHeader returns the value without copying it: the string is valid
// until the callback returns (see memory.go and filter.Host).
func (*host) RequestHeader(name string) (string, bool) { return headerValue(mapRequestHeaders, name) }

// ResponseHeader implements filter.Host.
func (*host) ResponseHeader(name string) (string, bool) { return headerValue(mapResponseHeaders, name) }

// RequestHeaderAll implements filter.Host over proxy_get_header_map_pairs,
// since proxy_get_header_map_value answers only the first line of a
// repeated header (Envoy's getHeaderMapValue does). One line is returned
// without a copy; several are joined into a new string.
func (*host) RequestHeaderAll(name string) (string, bool) {
	unpin()
	if proxyGetHeaderMapPairs(mapRequestHeaders, &ret.data, &ret.size) != statusOK {
		return "", false
	}
	b, ok := returned(ret.data, ret.size)
	if !ok {
		return "", false
	}
	first, n := "", 0
	var joined []byte
	forEachPair(b, func(k, v []byte) {
		if string(k) != name {
			return
		}
		switch n++; n {
		case 1:
			first = viewString(v)
		case 2:
			joined = append(append(append(joined, first...), ", "...), v...)
		default:
			joined = append(append(joined, ", "...), v...)
		}
	})
	switch {
	case n == 0:
		return "", false
	case n == 1:
		return first, true
	}
	return string(joined), true
}

// headerValue reads a header of the request or response map.
func headerValue(m uint32, name string) (string, bool) {
	unpin()
	if proxyGetHeaderMapValue(m, ptr(name), uint32(len(name)), &ret.data, &ret.size) != statusOK {
		return "", false
	}
	b, ok := returned(ret.data, ret.size)
	if !ok {
		return "", false
	}
	return viewString(b), true
}

// propertyPath is Property's scratch buffer for the NUL-joined path.
var propertyPath []byte

// Property returns the value without copying it; it is valid until the
// callback returns.
func (*host) Property(path ...string) ([]byte, bool) {
	unpin()
	p := propertyPath[:0]
	for i, seg := range path {
		if i > 0 {
			p = append(p, 0)
		}
		p = append(p, seg...)
	}
	propertyPath = p
	if proxyGetProperty(bptr(p), uint32(len(p)), &ret.data, &ret.size) != statusOK {
		return nil, false
	}
	return returned(ret.data, ret.size)
}

// PropertyString is Property returning a string without a copy, valid
// until the callback returns.
func (h *host) PropertyString(path ...string) (string, bool) {
	b, ok := h.Property(path...)
	return viewString(b), ok
}

// ViewString returns a string sharing b's bytes, without a copy: the filter
// only asks for it on buffers it leaves alone until the next request (its
// shared-data keys, its 429 header values), and the host copies both
// during each call.
func (*host) ViewString(b []byte) string { return viewString(b) }

// SetResponseHeaderBytes is SetResponseHeader without converting value to
// a string: the host copies it during the call.
func (*host) SetResponseHeaderBytes(name string, value []byte) {
	proxyReplaceHeaderMapValue(mapResponseHeaders, ptr(name), uint32(len(name)), bptr(value), uint32(len(value)))
}

// SetRequestHeader replaces a request header of the effective stream.
func (*host) SetRequestHeader(name, value string) {
	proxyReplaceHeaderMapValue(mapRequestHeaders, ptr(name), uint32(len(name)), ptr(value), uint32(len(value)))
}

func (*host) SetResponseHeader(name, value string) {
	proxyReplaceHeaderMapValue(mapResponseHeaders, ptr(name), uint32(len(name)), ptr(value), uint32(len(value)))
}

// AddResponseHeaderBytes is AddResponseHeader without converting value to
// a string: the host copies it during the call.
func (*host) AddResponseHeaderBytes(name string, value []byte) {
	proxyAddHeaderMapValue(mapResponseHeaders, ptr(name), uint32(len(name)), bptr(value), uint32(len(value)))
}

func (*host) AddResponseHeader(name, value string) {
	proxyAddHeaderMapValue(mapResponseHeaders, ptr(name), uint32(len(name)), ptr(value), uint32(len(value)))
}

func (*host) SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error {
	headerMapBuf = appendHeaderMap(headerMapBuf[:0], headers)
	hm := headerMapBuf
	st := proxySendLocalResponse(status, ptr(details), uint32(len(details)), bptr(body), uint32(len(body)),
		bptr(hm), uint32(len(hm)), grpcStatus)
	if st != statusOK {
		return statusError(st)
	}
	return nil
}

// ResponseBody reads up to max bytes of the response body chunk of the
// running proxy_on_response_body, from start, into one static window (see
// memory.go): valid until the next ResponseBody call or the callback ends.
func (*host) ResponseBody(start, max int) ([]byte, bool) {
	return bodyBytes(bufferResponseBody, start, max)
}

// RequestBody reads up to max bytes of the request body the host buffered
// for the running proxy_on_request_body, as ResponseBody does.
func (*host) RequestBody(start, max int) ([]byte, bool) {
	return bodyBytes(bufferRequestBody, start, max)
}

// bodyBytes reads up to max bytes of a body buffer from start into the
// static window.
func bodyBytes(buffer uint32, start, max int) ([]byte, bool) {
	if max <= 0 {
		return nil, true
	}
	unpin()
	wantWindow = true
	st := proxyGetBufferBytes(buffer, uint32(start), uint32(max), &ret.data, &ret.size)
	wantWindow = false
	if st != statusOK {
		return nil, false
	}
	return returned(ret.data, ret.size)
}

// headerMapBuf is SendLocalResponse's scratch for the encoded headers.
var headerMapBuf []byte

// bufferBytes reads a whole VM or plugin configuration buffer into a copy
// of its own: the configuration outlives the callback.
func bufferBytes(typ, size uint32) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	unpin()
	if st := proxyGetBufferBytes(typ, 0, size, &ret.data, &ret.size); st != statusOK {
		return nil, statusError(st)
	}
	b, ok := returned(ret.data, ret.size)
	if !ok {
		return nil, errBadReturn
	}
	return append([]byte(nil), b...), nil
}

var (
	_ filter.Caller = (*host)(nil)
	_ filter.Ticker = (*host)(nil)
)

// callHeaders is HTTPCall's scratch for the serialized header map.
var callHeaders []byte

// HTTPCall implements filter.Caller over proxy_http_call.
func (*host) HTTPCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, error) {
	callHeaders = appendHeaderMap(callHeaders[:0], headers)
	if st := proxyHTTPCall(ptr(cluster), uint32(len(cluster)), bptr(callHeaders), uint32(len(callHeaders)),
		bptr(body), uint32(len(body)), nil, 0, timeoutMs, &ret.data); st != statusOK {
		return 0, statusError(st)
	}
	return ret.data, nil
}

// CallResponseHeader implements filter.Caller.
func (*host) CallResponseHeader(name string) (string, bool) {
	return headerValue(mapHTTPCallRespHeaders, name)
}

// CallResponseTrailer implements filter.Caller.
func (*host) CallResponseTrailer(name string) (string, bool) {
	return headerValue(mapHTTPCallRespTrailers, name)
}

// CallResponseBody implements filter.Caller; the bytes are valid until the
// callback returns.
func (*host) CallResponseBody(size int) ([]byte, bool) {
	if size == 0 {
		return nil, true
	}
	unpin()
	if proxyGetBufferBytes(bufferHTTPCallResponseBody, 0, uint32(size), &ret.data, &ret.size) != statusOK {
		return nil, false
	}
	return returned(ret.data, ret.size)
}

// SetEffectiveContext implements filter.Caller. A failure leaves the
// previous context effective: the caller must not continue or reply then.
func (*host) SetEffectiveContext(id uint32) bool {
	return proxySetEffectiveContext(id) == statusOK
}

// SetTickPeriod implements filter.Ticker.
func (*host) SetTickPeriod(ms uint32) error {
	if st := proxySetTickPeriodMilliseconds(ms); st != statusOK {
		return statusError(st)
	}
	return nil
}

// ContinueRequest implements filter.Caller.
func (*host) ContinueRequest() error {
	if st := proxyContinueStream(streamRequest); st != statusOK {
		return statusError(st)
	}
	return nil
}
