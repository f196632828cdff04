package wasmhost

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tetratelabs/wazero/api"
)

// Status is the result of a proxy-wasm ABI 0.2.1 host call.
type Status uint32

// Statuses a host function returns.
const (
	StatusOK                   Status = 0
	StatusNotFound             Status = 1
	StatusBadArgument          Status = 2
	StatusSerializationFailure Status = 3
	StatusParseFailure         Status = 4
	StatusInvalidMemoryAccess  Status = 6
	StatusEmpty                Status = 7
	StatusCASMismatch          Status = 8
	StatusInternalFailure      Status = 10
	StatusUnimplemented        Status = 12
)

// String returns the ABI name of the status, e.g. "CAS_MISMATCH".
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "OK"
	case StatusNotFound:
		return "NOT_FOUND"
	case StatusBadArgument:
		return "BAD_ARGUMENT"
	case StatusSerializationFailure:
		return "SERIALIZATION_FAILURE"
	case StatusParseFailure:
		return "PARSE_FAILURE"
	case StatusInvalidMemoryAccess:
		return "INVALID_MEMORY_ACCESS"
	case StatusEmpty:
		return "EMPTY"
	case StatusCASMismatch:
		return "CAS_MISMATCH"
	case StatusInternalFailure:
		return "INTERNAL_FAILURE"
	case StatusUnimplemented:
		return "UNIMPLEMENTED"
	}
	return fmt.Sprintf("Status(%d)", uint32(s))
}

// Action is what a guest returns from a headers, body or trailers callback.
type Action uint32

// Actions.
const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

// MapType selects a header map in the header-map host calls.
type MapType uint32

// Header maps. The host serves request and response headers; the others
// answer BAD_ARGUMENT, as Envoy does when a map is not available.
const (
	MapRequestHeaders          MapType = 0
	MapRequestTrailers         MapType = 1
	MapResponseHeaders         MapType = 2
	MapResponseTrailers        MapType = 3
	MapGRPCInitialMetadata     MapType = 4
	MapGRPCTrailingMetadata    MapType = 5
	MapHTTPCallResponseHeaders MapType = 6
	MapHTTPCallResponseTrailer MapType = 7
)

// BufferType selects a buffer in proxy_get_buffer_bytes and
// proxy_set_buffer_bytes.
type BufferType uint32

// Buffers.
const (
	BufferRequestBody         BufferType = 0
	BufferResponseBody        BufferType = 1
	BufferDownstreamData      BufferType = 2
	BufferUpstreamData        BufferType = 3
	BufferHTTPCallResponse    BufferType = 4
	BufferGRPCReceive         BufferType = 5
	BufferVMConfiguration     BufferType = 6
	BufferPluginConfiguration BufferType = 7
)

// MetricType is the kind of a metric defined with proxy_define_metric.
type MetricType uint32

// Metric kinds.
const (
	MetricCounter   MetricType = 0
	MetricGauge     MetricType = 1
	MetricHistogram MetricType = 2
)

// String returns "counter", "gauge" or "histogram", the Prometheus TYPE.
func (t MetricType) String() string {
	switch t {
	case MetricCounter:
		return "counter"
	case MetricGauge:
		return "gauge"
	case MetricHistogram:
		return "histogram"
	}
	return fmt.Sprintf("MetricType(%d)", uint32(t))
}

// LogLevel is the level passed to proxy_log.
type LogLevel int

// Log levels, as in the ABI.
const (
	LogTrace LogLevel = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)

// String returns the lower-case level name Envoy prints, e.g. "warning".
func (l LogLevel) String() string {
	switch l {
	case LogTrace:
		return "trace"
	case LogDebug:
		return "debug"
	case LogInfo:
		return "info"
	case LogWarn:
		return "warning"
	case LogError:
		return "error"
	case LogCritical:
		return "critical"
	}
	return fmt.Sprintf("level(%d)", int(l))
}

// StreamType selects the request or response in proxy_continue_stream and
// proxy_close_stream.
type StreamType uint32

// Stream types.
const (
	StreamRequest  StreamType = 0
	StreamResponse StreamType = 1
)

const (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// signature is a wasm function type.
type signature struct {
	params  []api.ValueType
	results []api.ValueType
}

// String formats the type as "(i32,i32) -> (i32)".
func (s signature) String() string {
	return "(" + typeList(s.params) + ") -> (" + typeList(s.results) + ")"
}

func (s signature) equal(params, results []api.ValueType) bool {
	return string(s.params) == string(params) && string(s.results) == string(results)
}

func typeList(ts []api.ValueType) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = api.ValueTypeName(t)
	}
	return strings.Join(names, ",")
}

func sig(n int, extra ...api.ValueType) signature {
	p := make([]api.ValueType, 0, n+len(extra))
	for range n {
		p = append(p, i32)
	}
	p = append(p, extra...)
	return signature{params: p, results: []api.ValueType{i32}}
}

// envImports is the ABI 0.2.1 surface the host provides in module "env",
// with the wasm signatures: the 29 functions of the tetratelabs
// proxy-wasm-go-sdk v0.24.0 proxytest wrapper, the gRPC callouts and the
// rest of Envoy's set. Every one returns an i32 Status. Those without an
// implementation in hostFuncs answer UNIMPLEMENTED (Host.unimplemented).
var envImports = map[string]signature{
	"proxy_log":                          sig(3),
	"proxy_set_property":                 sig(4),
	"proxy_get_property":                 sig(4),
	"proxy_send_local_response":          sig(8),
	"proxy_get_shared_data":              sig(5),
	"proxy_set_shared_data":              sig(5),
	"proxy_register_shared_queue":        sig(3),
	"proxy_resolve_shared_queue":         sig(5),
	"proxy_dequeue_shared_queue":         sig(3),
	"proxy_enqueue_shared_queue":         sig(3),
	"proxy_get_header_map_value":         sig(5),
	"proxy_add_header_map_value":         sig(5),
	"proxy_replace_header_map_value":     sig(5),
	"proxy_remove_header_map_value":      sig(3),
	"proxy_get_header_map_pairs":         sig(3),
	"proxy_set_header_map_pairs":         sig(3),
	"proxy_continue_stream":              sig(1),
	"proxy_close_stream":                 sig(1),
	"proxy_get_buffer_bytes":             sig(5),
	"proxy_set_buffer_bytes":             sig(5),
	"proxy_http_call":                    sig(10),
	"proxy_grpc_call":                    sig(12),
	"proxy_grpc_stream":                  sig(9),
	"proxy_grpc_send":                    sig(4),
	"proxy_grpc_cancel":                  sig(1),
	"proxy_grpc_close":                   sig(1),
	"proxy_get_status":                   sig(3),
	"proxy_get_log_level":                sig(1),
	"proxy_get_current_time_nanoseconds": sig(1),
	"proxy_call_foreign_function":        sig(6),
	"proxy_set_tick_period_milliseconds": sig(1),
	"proxy_set_effective_context":        sig(1),
	"proxy_done":                         sig(0),
	"proxy_define_metric":                sig(4),
	"proxy_increment_metric":             sig(1, i64),
	"proxy_record_metric":                sig(1, i64),
	"proxy_get_metric":                   sig(2),
}

// guestExports are the callbacks the host calls, with the signatures it
// calls them with. A missing optional callback is skipped, as in
// proxy-wasm-cpp-host.
var guestExports = map[string]signature{
	"_initialize":                 {},
	"malloc":                      {params: []api.ValueType{i32}, results: []api.ValueType{i32}},
	"proxy_on_memory_allocate":    {params: []api.ValueType{i32}, results: []api.ValueType{i32}},
	"proxy_on_context_create":     {params: []api.ValueType{i32, i32}},
	"proxy_on_vm_start":           {params: []api.ValueType{i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_configure":          {params: []api.ValueType{i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_request_headers":    {params: []api.ValueType{i32, i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_request_body":       {params: []api.ValueType{i32, i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_request_trailers":   {params: []api.ValueType{i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_response_headers":   {params: []api.ValueType{i32, i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_response_body":      {params: []api.ValueType{i32, i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_response_trailers":  {params: []api.ValueType{i32, i32}, results: []api.ValueType{i32}},
	"proxy_on_log":                {params: []api.ValueType{i32}},
	"proxy_on_done":               {params: []api.ValueType{i32}, results: []api.ValueType{i32}},
	"proxy_on_delete":             {params: []api.ValueType{i32}},
	"proxy_on_tick":               {params: []api.ValueType{i32}},
	"proxy_on_queue_ready":        {params: []api.ValueType{i32, i32}},
	"proxy_on_http_call_response": {params: []api.ValueType{i32, i32, i32, i32, i32}},

	"proxy_on_grpc_receive_initial_metadata":  {params: []api.ValueType{i32, i32, i32}},
	"proxy_on_grpc_receive":                   {params: []api.ValueType{i32, i32, i32}},
	"proxy_on_grpc_receive_trailing_metadata": {params: []api.ValueType{i32, i32, i32}},
	"proxy_on_grpc_close":                     {params: []api.ValueType{i32, i32, i32}},
}

const abiMarker = "proxy_abi_version_0_2_1"

// ImportError reports functions a module imports that the host does not
// provide, or provides with another signature.
type ImportError struct {
	// Missing lists "module.name" of every unknown import, sorted.
	Missing []string
	// Mismatched lists "module.name: module wants S, host provides T".
	Mismatched []string
}

// Error implements error.
func (e *ImportError) Error() string {
	var b strings.Builder
	b.WriteString("module imports functions the host does not provide")
	if len(e.Missing) > 0 {
		fmt.Fprintf(&b, "; missing (%d): %s", len(e.Missing), strings.Join(e.Missing, ", "))
	}
	if len(e.Mismatched) > 0 {
		fmt.Fprintf(&b, "; wrong signature (%d): %s", len(e.Mismatched), strings.Join(e.Mismatched, "; "))
	}
	return b.String()
}

// importedFunc is the part of api.FunctionDefinition checkImports needs.
type importedFunc struct {
	module, name    string
	params, results []api.ValueType
}

// checkImports returns an *ImportError if any import is outside the host's
// env module or WASI preview1 (whose names are checked by wazero), or nil.
func checkImports(imports []importedFunc) error {
	e := &ImportError{}
	for _, f := range imports {
		switch f.module {
		case "wasi_snapshot_preview1":
			// Provided in full by wazero; it reports unknown names itself.
		case "env":
			want, ok := envImports[f.name]
			if !ok {
				e.Missing = append(e.Missing, f.module+"."+f.name)
				continue
			}
			if !want.equal(f.params, f.results) {
				got := signature{params: f.params, results: f.results}
				e.Mismatched = append(e.Mismatched,
					fmt.Sprintf("%s.%s: module wants %s, host provides %s", f.module, f.name, got, want))
			}
		default:
			e.Missing = append(e.Missing, f.module+"."+f.name)
		}
	}
	if len(e.Missing) == 0 && len(e.Mismatched) == 0 {
		return nil
	}
	sort.Strings(e.Missing)
	sort.Strings(e.Mismatched)
	return e
}

// checkExports returns an error naming what the module lacks to be a
// proxy-wasm ABI 0.2.1 guest, or a callback exported with another type.
func checkExports(exports map[string]api.FunctionDefinition) error {
	var problems []string
	if _, ok := exports[abiMarker]; !ok {
		problems = append(problems, "does not export "+abiMarker+" (only ABI 0.2.1 is supported)")
	}
	_, hasMalloc := exports["malloc"]
	_, hasAlloc := exports["proxy_on_memory_allocate"]
	if !hasMalloc && !hasAlloc {
		problems = append(problems, "exports neither malloc nor proxy_on_memory_allocate")
	}
	names := make([]string, 0, len(guestExports))
	for name := range guestExports {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		def, ok := exports[name]
		if !ok {
			continue
		}
		want := guestExports[name]
		if !want.equal(def.ParamTypes(), def.ResultTypes()) {
			got := signature{params: def.ParamTypes(), results: def.ResultTypes()}
			problems = append(problems, fmt.Sprintf("exports %s as %s, host calls it as %s", name, got, want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("module is not a proxy-wasm 0.2.1 guest: %s", strings.Join(problems, "; "))
	}
	return nil
}
