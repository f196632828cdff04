package wasmhost

import (
	"sort"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero/api"
)

// sdkImports is the host surface of tetratelabs/proxy-wasm-go-sdk v0.24.0's
// proxytest wasm wrapper (proxywasm/proxytest/wasmwrapper.go): 29 functions.
var sdkImports = []string{
	"proxy_add_header_map_value", "proxy_call_foreign_function", "proxy_close_stream",
	"proxy_continue_stream", "proxy_define_metric", "proxy_dequeue_shared_queue", "proxy_done",
	"proxy_enqueue_shared_queue", "proxy_get_buffer_bytes", "proxy_get_header_map_pairs",
	"proxy_get_header_map_value", "proxy_get_metric", "proxy_get_property", "proxy_get_shared_data",
	"proxy_http_call", "proxy_increment_metric", "proxy_log", "proxy_record_metric",
	"proxy_register_shared_queue", "proxy_remove_header_map_value", "proxy_replace_header_map_value",
	"proxy_resolve_shared_queue", "proxy_send_local_response", "proxy_set_buffer_bytes",
	"proxy_set_effective_context", "proxy_set_header_map_pairs", "proxy_set_property",
	"proxy_set_shared_data", "proxy_set_tick_period_milliseconds",
}

// TestEnvImports: the host offers the SDK emulator's 29 functions (a module
// that loads in proxytest loads here), plus the gRPC callouts and the other
// ABI 0.2.1 functions Envoy has. Every one is implemented or answers
// UNIMPLEMENTED through the one generic path.
func TestEnvImports(t *testing.T) {
	for _, name := range sdkImports {
		if _, ok := envImports[name]; !ok {
			t.Errorf("the host lacks %s, which the SDK's emulator offers", name)
		}
	}
	impls := (&Host{}).hostFuncs()
	for _, name := range []string{"proxy_http_call", "proxy_grpc_call", "proxy_grpc_cancel", "proxy_grpc_close",
		"proxy_get_status", "proxy_set_effective_context", "proxy_continue_stream", "proxy_set_tick_period_milliseconds"} {
		if impls[name] == nil {
			t.Errorf("%s is not implemented; the filter's callouts and timers need it", name)
		}
	}
	var generic []string
	for name := range envImports {
		if impls[name] == nil {
			generic = append(generic, name)
		}
	}
	for name := range impls {
		if _, ok := envImports[name]; !ok {
			t.Errorf("%s is implemented but has no signature in envImports", name)
		}
	}
	sort.Strings(generic)
	want := []string{"proxy_dequeue_shared_queue", "proxy_enqueue_shared_queue", "proxy_get_current_time_nanoseconds",
		"proxy_get_log_level", "proxy_grpc_send", "proxy_grpc_stream", "proxy_register_shared_queue", "proxy_resolve_shared_queue"}
	if strings.Join(generic, ",") != strings.Join(want, ",") {
		t.Errorf("functions answering UNIMPLEMENTED: got %v, want %v", generic, want)
	}
}

func TestCheckImports(t *testing.T) {
	i32x := func(n int) []api.ValueType { return sig(n).params }
	ret := []api.ValueType{i32}
	tests := []struct {
		name        string
		input       []importedFunc
		expectedErr string
	}{
		{name: "none", input: nil},
		{
			name: "known env and wasi",
			input: []importedFunc{
				{"env", "proxy_log", i32x(3), ret},
				{"env", "proxy_increment_metric", []api.ValueType{i32, i64}, ret},
				{"wasi_snapshot_preview1", "fd_write", i32x(4), ret},
			},
		},
		{
			name: "missing and foreign",
			input: []importedFunc{
				{"env", "proxy_get_log_level", i32x(1), ret}, // known: answers UNIMPLEMENTED
				{"env", "proxy_not_in_the_abi", i32x(1), ret},
				{"spin", "thing", nil, nil},
			},
			expectedErr: "module imports functions the host does not provide; missing (2): " +
				"env.proxy_not_in_the_abi, spin.thing",
		},
		{
			name:  "wrong signature",
			input: []importedFunc{{"env", "proxy_increment_metric", i32x(2), ret}},
			expectedErr: "module imports functions the host does not provide; wrong signature (1): " +
				"env.proxy_increment_metric: module wants (i32,i32) -> (i32), host provides (i32,i64) -> (i32)",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkImports(tc.input)
			if tc.expectedErr == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tc.expectedErr {
				t.Fatalf("got error\n  %v\nwant\n  %s", err, tc.expectedErr)
			}
		})
	}
}
