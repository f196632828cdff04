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

import (
	"github.com/tokengate/tokengate/config"
	"github.com/tokengate/tokengate/sharedstate"
)

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

// The optional capabilities of a host: the filter finds them once, when the
// plugin starts (NewPlugin, findCapabilities), keeps them in fields of the
// Plugin (nil when the host lacks one), and never asks the host again.
// OnConfigure logs what a configuration needs that the host lacks, and
// what the filter does instead (checkCapabilities).

// Caller is implemented by hosts that can call out and resume a paused
// stream from the root context (filter/abi). Without it, cluster-scope
// rules take settings.rls.on_error.
type Caller interface {
	// HTTPCall dispatches an HTTP call (proxy_http_call) and returns its
	// token; the response arrives as Plugin.OnHTTPCallResponse.
	HTTPCall(cluster string, headers [][2]string, body []byte, timeoutMs uint32) (uint32, error)
	// CallResponseHeader and CallResponseTrailer return a header or
	// trailer of the call response being delivered, CallResponseBody its
	// body; valid until the callback returns.
	CallResponseHeader(name string) (string, bool)
	CallResponseTrailer(name string) (string, bool)
	CallResponseBody(size int) ([]byte, bool)
	// SetEffectiveContext makes the stream with context id the one later
	// calls act on (proxy_set_effective_context); false if it is gone.
	SetEffectiveContext(id uint32) bool
	// ContinueRequest resumes the effective stream's request
	// (proxy_continue_stream).
	ContinueRequest() error
}

// Ticker is implemented by hosts with a per-worker timer
// (proxy_set_tick_period_milliseconds); the timer calls Plugin.OnTick.
// Without it (or without Caller), or once the host has refused a tick
// period, a request that would have to wait for its reservation is
// rejected instead, and lease rules are not refilled ahead.
type Ticker interface {
	// SetTickPeriod sets the period of the root context's tick, in
	// milliseconds; 0 stops it.
	SetTickPeriod(ms uint32) error
}

// bodyReader is implemented by hosts that can read the response body chunk
// of the running proxy_on_response_body (filter/abi, over
// proxy_get_buffer_bytes). Without it a response_json or response_sse cost
// is always default_cost.
type bodyReader interface {
	// ResponseBody returns up to max bytes of the current body chunk from
	// start; they are valid until the next ResponseBody call or the end of
	// the callback.
	ResponseBody(start, max int) ([]byte, bool)
}

// requestBodyReader is implemented by hosts that can read the request body
// buffered for the running proxy_on_request_body (filter/abi). Without it a
// request_json estimate is never read, and pre_charge is reserved.
type requestBodyReader interface {
	// RequestBody returns up to max bytes of the buffered request body
	// from start, valid as ResponseBody's are.
	RequestBody(start, max int) ([]byte, bool)
}

// requestHeaderSetter is implemented by hosts that can replace a request
// header before the request goes upstream (filter/abi, over
// proxy_replace_header_map_value). Without it strip_accept_encoding does
// nothing, and a compressed body costs what was reserved.
type requestHeaderSetter interface {
	// SetRequestHeader replaces a request header of the effective stream;
	// name is lower-case.
	SetRequestHeader(name, value string)
}

// headerBytesSetter is implemented by hosts that can set or add a response
// header from a byte slice without converting it to a string first
// (filter/abi: the host copies the value during the call).
type headerBytesSetter interface {
	// SetResponseHeaderBytes is SetResponseHeader with the value as bytes;
	// the host must not keep value after the call.
	SetResponseHeaderBytes(name string, value []byte)
	// AddResponseHeaderBytes is AddResponseHeader with the value as bytes.
	AddResponseHeaderBytes(name string, value []byte)
}

// propertyStringer is implemented by hosts that can return a property as a
// string without a copy, valid until the callback returns (filter/abi).
type propertyStringer interface {
	PropertyString(path ...string) (string, bool)
}

// bytesLogger is implemented by hosts that can log a message held in a byte
// slice (filter/abi); the host must not keep msg after the call.
type bytesLogger interface {
	LogBytes(level LogLevel, msg []byte)
}

// bytesViewer is implemented by hosts that can give a string view of a
// byte slice without copying it (filter/abi, which alone may use unsafe).
// The filter uses it for buffers it does not touch again until the next
// request or rejection: the request's shared-data keys (sharedstate.Store
// forbids keeping a key past the call) and the 429's header values (hosts
// copy them).
type bytesViewer interface {
	// ViewString returns a string sharing b's bytes: valid while b is not
	// modified.
	ViewString(b []byte) string
}

// findCapabilities records which optional interfaces h implements.
func (p *Plugin) findCapabilities(h Host) {
	p.caller, _ = h.(Caller)
	p.br, _ = h.(bodyReader)
	p.rbr, _ = h.(requestBodyReader)
	p.rhs, _ = h.(requestHeaderSetter)
	p.hbs, _ = h.(headerBytesSetter)
	p.rlh = findRateLimitHeaderSetter(h)
	p.ps, _ = h.(propertyStringer)
	p.bl, _ = h.(bytesLogger)
	p.bv, _ = h.(bytesViewer)
	p.timer.ticker, _ = h.(Ticker)
	p.timer.log = h
}

// checkCapabilities logs, at warn level, what the configuration's rules
// need that the host lacks: one line for the first rule of each kind concerned, saying what
// the filter does instead. None of them refuses the configuration: each has
// a defined fallback, the one a request would meet if the capability failed
// at run time (a failed callout, a refused tick).
func (p *Plugin) checkCapabilities() {
	var logged uint8 // a bit per note
	for _, r := range p.rules.rules {
		k := -1
		switch {
		case (r.Cluster || r.Lease != nil) && p.caller == nil:
			k = 0
		case r.Delay.Debt > 0 && (p.caller == nil || p.timer.ticker == nil):
			k = 1
		case r.Lease != nil && p.timer.ticker == nil:
			k = 2
		case r.Settle != nil && r.Settle.Response >= config.ResponseJSON && p.br == nil:
			k = 3
		case awaitsEstimate(r) && p.rbr == nil:
			k = 4
		}
		if k >= 0 && logged&(1<<k) == 0 {
			logged |= 1 << k
			p.host.Log(LogWarn, "tokengate: rule "+r.Name+capabilityNotes[k])
		}
	}
}

// capabilityNotes say what a rule needs that the host lacks, and what the
// filter does instead (checkCapabilities).
var capabilityNotes = [...]string{
	" needs HTTP callouts, which the host lacks: it takes settings.rls.on_error",
	" holds requests (max_reserved), which needs a timer and stream resumption the host lacks: they are rejected instead",
	" leases, which needs a timer the host lacks: no refill ahead, a request short of allowance makes its own call",
	" reads its cost in the response body, which the host cannot: the cost is what the request reserved, or default_cost if more",
	" reads its estimate in the request body, which the host cannot: it reserves pre_charge",
}
