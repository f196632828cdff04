//go:build wasip1

package abi

import (
	"unsafe"
)

// Host functions, module "env". Every one returns a proxy-wasm Status.
// Return slots are *uint32: the host writes a 32-bit guest address or size.

//go:wasmimport env proxy_log
func proxyLog(level uint32, msg unsafe.Pointer, size uint32) uint32

//go:wasmimport env proxy_get_buffer_bytes
func proxyGetBufferBytes(typ, start, max uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_value
func proxyGetHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_get_header_map_pairs
func proxyGetHeaderMapPairs(mapType uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_http_call
func proxyHTTPCall(upstream unsafe.Pointer, upstreamSize uint32, headers unsafe.Pointer, headersSize uint32, body unsafe.Pointer, bodySize uint32, trailers unsafe.Pointer, trailersSize uint32, timeoutMs uint32, retToken *uint32) uint32

//go:wasmimport env proxy_set_tick_period_milliseconds
func proxySetTickPeriodMilliseconds(ms uint32) uint32

//go:wasmimport env proxy_set_effective_context
func proxySetEffectiveContext(id uint32) uint32

//go:wasmimport env proxy_continue_stream
func proxyContinueStream(typ uint32) uint32

//go:wasmimport env proxy_replace_header_map_value
func proxyReplaceHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_add_header_map_value
func proxyAddHeaderMapValue(mapType uint32, key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32) uint32

//go:wasmimport env proxy_send_local_response
func proxySendLocalResponse(status uint32, details unsafe.Pointer, detailsSize uint32, body unsafe.Pointer, bodySize uint32, headers unsafe.Pointer, headersSize uint32, grpcStatus int32) uint32

//go:wasmimport env proxy_get_shared_data
func proxyGetSharedData(key unsafe.Pointer, keySize uint32, retData, retSize, retCAS *uint32) uint32

//go:wasmimport env proxy_set_shared_data
func proxySetSharedData(key unsafe.Pointer, keySize uint32, value unsafe.Pointer, valueSize uint32, cas uint32) uint32

//go:wasmimport env proxy_get_property
func proxyGetProperty(path unsafe.Pointer, pathSize uint32, retData, retSize *uint32) uint32

//go:wasmimport env proxy_define_metric
func proxyDefineMetric(metricType uint32, name unsafe.Pointer, nameSize uint32, retID *uint32) uint32

//go:wasmimport env proxy_increment_metric
func proxyIncrementMetric(id uint32, delta int64) uint32

// Status values of the proxy-wasm ABI.
const (
	statusOK            = 0
	statusNotFound      = 1
	statusCASMismatch   = 8
	statusUnimplemented = 12
)

// Enum values of the proxy-wasm ABI.
const (
	mapRequestHeaders       = 0
	mapResponseHeaders      = 2
	mapHTTPCallRespHeaders  = 6
	mapHTTPCallRespTrailers = 7

	bufferRequestBody          = 0
	bufferResponseBody         = 1
	bufferHTTPCallResponseBody = 4
	streamRequest              = 0

	bufferVMConfiguration     = 6
	bufferPluginConfiguration = 7

	metricCounter = 0
)

// clockTimeGet is WASI's clock_time_get. The filter needs only the wall
// clock; time.Now also reads the monotonic clock, a second host call.
//
//go:wasmimport wasi_snapshot_preview1 clock_time_get
func clockTimeGet(id uint32, precision uint64, time *uint64) uint32

// clockRealtime is WASI's CLOCKID_REALTIME.
const clockRealtime = 0

// realtime returns the wall clock in seconds since the Unix epoch, with one
// host call; it is every plugin's Clock. A host whose clock fails gets 0,
// which every bucket update refuses (the request fails open): the time
// package, the only other clock, would add its GODEBUG machinery to the
// module and read the same WASI clock anyway.
func realtime() float64 {
	if clockTimeGet(clockRealtime, 1, &ret.ns) != 0 {
		return 0
	}
	return float64(ret.ns) / 1e9
}
