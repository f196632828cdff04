//go:build !wasip1

// Package dynmod binds the filter to Envoy's dynamic-module ABI ("v0.1.0",
// Envoy 1.38): the module's hooks as Go functions over integer handles, a
// filter.Host per Envoy worker, and the process's shared data in memory
// (sharedstate/procstore). It is plain Go: the callbacks Envoy provides are
// reached through the Envoy interface, which cmd/tokengate-dynmod
// implements with cgo (the only product code with cgo), and which tests
// fake. Nothing Envoy holds is a Go pointer: configs and streams are
// integer handles into tables here.
//
// Threads: Envoy calls a stream's hooks on the worker thread that owns it,
// and every worker gets its own filter.Plugin (as a proxy-wasm VM per
// worker does), so a plugin is used by one thread at a time; the buckets
// are shared through the store. Timers run on goroutines and reach a worker
// only through a scheduler commit, delivered as Scheduled on that worker.
//
// Native only (not wasip1): the package uses the filter's and
// ratelimitheader's native-only calls (IdleResponseHeaders,
// ratelimitheader.AppendHeaders), which the wasm guest does not carry.
package dynmod

import "github.com/tokengate/tokengate/filter"

// HeaderKind is Envoy's envoy_dynamic_module_type_http_header_type.
type HeaderKind uint32

// Header kinds, with the ABI's values.
const (
	RequestHeader   HeaderKind = 0
	RequestTrailer  HeaderKind = 1
	ResponseHeader  HeaderKind = 2
	ResponseTrailer HeaderKind = 3
)

// Hook answers, with the ABI's values.
const (
	// HeadersContinue and HeadersStopAllAndWatermark are values of
	// on_http_filter_request_headers_status (and the response one).
	HeadersContinue            = 0
	HeadersStopAllAndWatermark = 4
	// BodyContinue and BodyStopAndBuffer are values of
	// on_http_filter_request_body_status.
	BodyContinue      = 0
	BodyStopAndBuffer = 1
	// TrailersContinue and TrailersStop are values of the trailers status.
	TrailersContinue = 0
	TrailersStop     = 1
)

// CalloutSuccess is envoy_dynamic_module_type_http_callout_result_Success.
const CalloutSuccess = 0

// Envoy is the callbacks Envoy provides to the module, as the binding uses
// them. f is a filter_envoy_ptr, cfg a filter_config_envoy_ptr, sched a
// scheduler pointer: opaque values passed back as they came. Strings and
// bytes passed in are Envoy's only during the call (it copies them);
// strings returned view Envoy's memory, valid until the hook returns.
type Envoy interface {
	// Concurrency is get_concurrency (main thread only).
	Concurrency() uint32
	// WorkerIndex is http_filter_get_worker_index.
	WorkerIndex(f uintptr) uint32
	// Log is callback_log.
	Log(level filter.LogLevel, msg string)
	// DefineCounter is http_filter_config_define_counter, without labels.
	DefineCounter(cfg uintptr, name string) (id uint64, ok bool)
	// IncrementCounter is http_filter_increment_counter, without labels.
	IncrementCounter(f uintptr, id uint64, delta uint64)
	// Header is http_get_header: the value at index of header name, and
	// the number of values the header has.
	Header(f uintptr, kind HeaderKind, name string, index int) (value string, count int, ok bool)
	// SetHeader is http_set_header, AddHeader http_add_header.
	SetHeader(f uintptr, kind HeaderKind, name, value string)
	AddHeader(f uintptr, kind HeaderKind, name, value string)
	// SetHeaders applies several http_set_header (or, with add,
	// http_add_header) calls in one: ops holds {add, name length, value
	// length} per header, buf their names and values back to back.
	SetHeaders(f uintptr, kind HeaderKind, buf []byte, ops []uint32)
	// SendResponse is http_send_response.
	SendResponse(f uintptr, status uint32, headers [][2]string, body []byte, details string)
	// ContinueDecoding is http_filter_continue_decoding.
	ContinueDecoding(f uintptr)
	// SourceAddress is http_filter_get_attribute_string(source.address).
	SourceAddress(f uintptr) (string, bool)
	// Callout is http_filter_http_callout; ok false when Envoy refused it.
	Callout(f uintptr, cluster string, headers [][2]string, body []byte, timeoutMs uint64) (id uint64, ok bool)
	// SchedulerNew, SchedulerCommit and SchedulerDelete are the
	// http_filter_scheduler callbacks; commit may be called from any
	// thread.
	SchedulerNew(f uintptr) uintptr
	SchedulerCommit(sched uintptr, event uint64)
	SchedulerDelete(sched uintptr)
}

// CallResponse is a callout's answer as on_http_filter_http_callout_done
// delivers it: the headers and the body chunks, viewing Envoy's memory,
// valid until the hook returns.
type CallResponse struct {
	Headers [][2]string
	Body    [][]byte
}
