// nop.mjs: a proxy-wasm module that does nothing, written here in the
// binary format: every callback the host calls returns at once (Continue,
// true), it imports nothing and calls no host function. Run through the
// same Host as the real module, it measures what a request costs with no
// filter work: the host's own bookkeeping and the export calls into wasm
// (V8's JS-to-wasm trampolines), which Envoy pays for any wasm filter.
// bench.mjs's no-filter row (bench/nop_test.go writes the same module for
// the wazero benchmark's).

const u32 = (n) => { const b = []; do { let x = n & 0x7f; n >>>= 7; if (n) x |= 0x80; b.push(x); } while (n); return b; };
const str = (s) => [...u32(s.length), ...Buffer.from(s, 'latin1')];
const vec = (items) => [...u32(items.length), ...items.flat()];
const section = (id, body) => [id, ...u32(body.length), ...body];
const I32 = 0x7f;

// The callbacks: name, parameter count (all i32), the i32 result or null.
const fns = [
  ['_initialize', 0, null],
  ['proxy_abi_version_0_2_1', 0, null],
  ['proxy_on_context_create', 2, null],
  ['proxy_on_vm_start', 2, 1],
  ['proxy_on_configure', 2, 1],
  ['proxy_on_request_headers', 3, 0],
  ['proxy_on_request_body', 3, 0],
  ['proxy_on_response_headers', 3, 0],
  ['proxy_on_response_body', 3, 0],
  ['proxy_on_log', 1, null],
  ['proxy_on_done', 1, 1],
  ['proxy_on_delete', 1, null],
  ['proxy_on_tick', 1, null],
  ['proxy_on_http_call_response', 5, null],
  ['malloc', 1, 1024], // never called: nothing is handed to the module
];

// nopModule returns the module's bytes.
export function nopModule() {
  const types = fns.map(([, n, r]) => [0x60, ...vec(Array(n).fill([I32])), ...(r === null ? [0] : [1, I32])]);
  const code = fns.map(([, , r]) => {
    const body = [0, ...(r === null ? [] : [0x41, ...sleb(r)]), 0x0b]; // no locals; i32.const r; end
    return [...u32(body.length), ...body];
  });
  const exports = [[...str('memory'), 2, 0], ...fns.map(([name], i) => [...str(name), 0, ...u32(i)])];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
    ...section(1, vec(types)),
    ...section(3, vec(fns.map((_, i) => u32(i)))),
    ...section(5, vec([[0, 1]])), // one memory, at least one page
    ...section(7, vec(exports)),
    ...section(10, vec(code)),
  ]);
}

// sleb is a signed LEB128 (i32.const's immediate).
function sleb(n) {
  const b = [];
  for (;;) {
    const x = n & 0x7f;
    n >>= 7;
    if ((n === 0 && !(x & 0x40)) || (n === -1 && (x & 0x40))) { b.push(x); return b; }
    b.push(x | 0x80);
  }
}
