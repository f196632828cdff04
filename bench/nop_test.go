package bench

// nopModule returns a proxy-wasm module that does nothing, written here in
// the binary format (the same module as bench/v8/nop.mjs writes for V8):
// every callback the host calls returns at once (Continue, true), it
// imports nothing and calls no host function. Run through the same host as
// the real module, it is the no-filter row of benchmark 3: the host's own
// bookkeeping and the export calls any wasm filter costs.
func nopModule() []byte {
	type fn struct {
		name   string
		params int
		result int // -1: none
	}
	fns := []fn{
		{"_initialize", 0, -1},
		{"proxy_abi_version_0_2_1", 0, -1},
		{"proxy_on_context_create", 2, -1},
		{"proxy_on_vm_start", 2, 1},
		{"proxy_on_configure", 2, 1},
		{"proxy_on_request_headers", 3, 0},
		{"proxy_on_request_body", 3, 0},
		{"proxy_on_response_headers", 3, 0},
		{"proxy_on_response_body", 3, 0},
		{"proxy_on_log", 1, -1},
		{"proxy_on_done", 1, 1},
		{"proxy_on_delete", 1, -1},
		{"proxy_on_tick", 1, -1},
		{"proxy_on_http_call_response", 5, -1},
		{"malloc", 1, 1024}, // never called: nothing is handed to the module
	}
	const i32 = 0x7f
	uleb := func(b []byte, n uint32) []byte {
		for {
			x := byte(n & 0x7f)
			n >>= 7
			if n == 0 {
				return append(b, x)
			}
			b = append(b, x|0x80)
		}
	}
	sleb := func(b []byte, n int32) []byte {
		for {
			x := byte(n & 0x7f)
			n >>= 7
			if (n == 0 && x&0x40 == 0) || (n == -1 && x&0x40 != 0) {
				return append(b, x)
			}
			b = append(b, x|0x80)
		}
	}
	section := func(out []byte, id byte, count int, body []byte) []byte {
		body = append(uleb(nil, uint32(count)), body...)
		return append(uleb(append(out, id), uint32(len(body))), body...)
	}
	var types, funcs, exports, code []byte
	exports = append(uleb(exports, uint32(len("memory"))), "memory"...)
	exports = append(exports, 2, 0) // memory 0
	for i, f := range fns {
		types = append(types, 0x60)
		types = uleb(types, uint32(f.params))
		for range f.params {
			types = append(types, i32)
		}
		if f.result < 0 {
			types = append(types, 0)
		} else {
			types = append(types, 1, i32)
		}
		funcs = uleb(funcs, uint32(i))
		exports = append(uleb(exports, uint32(len(f.name))), f.name...)
		exports = uleb(append(exports, 0), uint32(i))
		body := []byte{0} // no locals
		if f.result >= 0 {
			body = sleb(append(body, 0x41), int32(f.result)) // i32.const
		}
		body = append(body, 0x0b) // end
		code = append(uleb(code, uint32(len(body))), body...)
	}
	out := []byte{0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0}
	out = section(out, 1, len(fns), types)
	out = section(out, 3, len(fns), funcs)
	out = section(out, 5, 1, []byte{0, 1}) // one memory, at least one page
	out = section(out, 7, len(fns)+1, exports)
	out = section(out, 10, len(fns), code)
	return out
}
