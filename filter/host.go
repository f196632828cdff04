// Package filter is tokengate's rate-limiting logic: configuration, rule
// selection, descriptors, costs, decisions, response headers and metrics,
// written against the small Host interface so that the same code runs inside
// the wasm guest (through filter/abi) and natively against a fake host in
// tests (filter/filtertest).
//
// The package never prints, never touches the file system and never sleeps:
// inside Envoy a Go guest that needs WASI poll_oneoff aborts (see
// docs/proxy-wasm.md). Logs go through Host.Log.
package filter

import "github.com/tokengate/tokengate/sharedstate"

// LogLevel is a proxy-wasm log level.
type LogLevel uint32

// Log levels, with the proxy-wasm ABI's values.
const (
	LogTrace LogLevel = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)

// String returns the level's lower-case name.
func (l LogLevel) String() string {
	switch l {
	case LogTrace:
		return "trace"
	case LogDebug:
		return "debug"
	case LogInfo:
		return "info"
	case LogWarn:
		return "warn"
	case LogError:
		return "error"
	default:
		return "critical"
	}
}

// Action tells the host whether to continue processing a stream.
type Action uint32

// Actions, with the proxy-wasm ABI's values.
const (
	Continue Action = 0
	Pause    Action = 1
)

// NoGRPCStatus is the grpc_status argument of SendLocalResponse that means
// "not a gRPC reply".
const NoGRPCStatus int32 = -1

// Host is what the filter needs from a proxy-wasm host. Request and response
// calls act on the stream the host is currently calling into, as the ABI's
// "effective context" does.
//
// The lifetime rule: bytes and strings a host returns (header values,
// properties, shared-data values) are valid until the callback returns;
// the filter copies what it keeps longer. Bytes the filter passes to a host
// are the host's only during the call; the host copies what it keeps.
// filtertest enforces both, so a mistake fails native tests too.
type Host interface {
	// Store is the host's shared data (proxy_get/set_shared_data).
	sharedstate.Store

	// Log writes a message at the given level (proxy_log).
	Log(level LogLevel, msg string)

	// DefineCounter defines a counter metric and returns its id
	// (proxy_define_metric).
	DefineCounter(name string) (uint32, error)
	// IncrementCounter adds delta to a counter (proxy_increment_metric).
	IncrementCounter(id uint32, delta int64)

	// RequestHeader returns the value of a request header; name is
	// lower-case. Pseudo-headers (":path", ":method", ":authority") work.
	// The value may live in memory the host reuses (filter/abi does): it is
	// valid until the callback returns; copy what must outlive it.
	RequestHeader(name string) (string, bool)
	// RequestHeaderAll is RequestHeader over every line of a header that
	// may be repeated: the values joined with ", ", as RFC 9110 section
	// 5.3 allows for list headers such as x-forwarded-for
	// (proxy_get_header_map_pairs). Valid until the callback returns.
	RequestHeaderAll(name string) (string, bool)
	// Property returns a host property such as "source.address"; path holds
	// the segments ("source", "address"). Like RequestHeader's, the value is
	// valid until the callback returns.
	Property(path ...string) ([]byte, bool)
	// ResponseHeader returns the value of a response header (the
	// upstream's, during proxy_on_response_headers); name is lower-case.
	// Valid until the callback returns.
	ResponseHeader(name string) (string, bool)
	// SetResponseHeader replaces a response header
	// (proxy_replace_header_map_value).
	SetResponseHeader(name, value string)
	// AddResponseHeader adds a line to the response headers, keeping those
	// of the same name (proxy_add_header_map_value).
	AddResponseHeader(name, value string)
	// SendLocalResponse replies to the client without contacting the
	// upstream (proxy_send_local_response). grpcStatus is NoGRPCStatus for a
	// plain HTTP reply.
	SendLocalResponse(status uint32, details string, body []byte, headers [][2]string, grpcStatus int32) error
}
