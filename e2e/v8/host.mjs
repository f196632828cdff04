// A proxy-wasm ABI 0.2.1 host for Node's V8, written from the spec and
// Envoy's documented behaviour (docs/proxy-wasm.md), sharing no code with
// the Go product or the wazero host: a second engine to judge the module.
//
// It provides exactly what the module imports, no more: the env functions
// and the WASI preview1 calls a Go reactor makes (TestHostProvidesTheImports
// compares the two lists). Several workers are several
// instances of the module (Envoy's per-thread VMs) sharing one shared-data
// store with Envoy's CAS rules.
//
// V8 differs from wazero in two ways a host must respect: linear memory may
// grow inside any call into the guest (malloc), which detaches every view of
// the old buffer, so views are re-validated after each such call; and i64
// parameters arrive as BigInt.
//
// The host stands in for Envoy's C++ host in benchmarks, so its request path
// avoids what C++ would not do: TextEncoder.encode (a native call of about a
// microsecond for a short string), views made per call, closures and
// arrays per lookup. ASCII, nearly every byte a header or key holds, is
// copied by hand; anything else goes through TextEncoder/TextDecoder.

const OK = 0, NOT_FOUND = 1, BAD_ARGUMENT = 2, INVALID_MEMORY_ACCESS = 6, CAS_MISMATCH = 8;
const ENOSYS = 52;
const te = new TextEncoder(), td = new TextDecoder('utf-8', { fatal: false });

// SharedData is one process's shared data (per vm_id in Envoy): a get of a
// missing key is NOT_FOUND; a set with cas 0 writes unconditionally; a
// non-zero cas on an existing key must match its current cas; a missing key
// is created whatever the cas; the cas is one global counter, never 0.
export class SharedData {
  constructor() { this.map = new Map(); this.counter = 0; }
  get(key) { return this.map.get(key); }
  // set copies value (which may be a view of guest memory).
  set(key, value, cas) {
    const e = this.map.get(key);
    if (e && cas !== 0 && cas !== e.cas) return CAS_MISMATCH;
    this.counter = (this.counter + 1) >>> 0;
    if (this.counter === 0) this.counter = 1;
    if (!e) this.map.set(key, { value: value.slice(), cas: this.counter });
    else {
      if (e.value.length === value.length) e.value.set(value); else e.value = value.slice();
      e.cas = this.counter;
    }
    return OK;
  }
  entries() {
    return [...this.map.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([key, e]) => ({ key, value: td.decode(e.value), cas: e.cas }));
  }
}

// Clock is the hosts' time in nanoseconds since the epoch, a BigInt: fixed
// (advanced by hand) when given a start, else the real clock, read from the
// monotonic nanosecond timer from an epoch offset taken once.
export class Clock {
  constructor(ns) {
    this.ns = ns === undefined ? null : BigInt(ns);
    this.offset = BigInt(Date.now()) * 1000000n - process.hrtime.bigint();
  }
  now() { return this.ns === null ? this.offset + process.hrtime.bigint() : this.ns; }
  advance(ms) { if (this.ns !== null) this.ns += BigInt(Math.round(ms * 1e6)); }
}

// encodePairs serializes header pairs in the ABI's map format.
function encodePairs(pairs) {
  const keys = pairs.map(([k]) => te.encode(k)), vals = pairs.map(([, v]) => te.encode(v));
  let size = 4 + 8 * pairs.length;
  for (let i = 0; i < pairs.length; i++) size += keys[i].length + vals[i].length + 2;
  const out = new Uint8Array(size), dv = new DataView(out.buffer);
  dv.setUint32(0, pairs.length, true);
  let p = 4 + 8 * pairs.length;
  for (let i = 0; i < pairs.length; i++) {
    dv.setUint32(4 + 8 * i, keys[i].length, true);
    dv.setUint32(8 + 8 * i, vals[i].length, true);
  }
  for (let i = 0; i < pairs.length; i++) {
    out.set(keys[i], p); p += keys[i].length + 1;
    out.set(vals[i], p); p += vals[i].length + 1;
  }
  return out;
}

// decodeAt decodes len bytes of m at p as UTF-8, as td.decode does: short
// ASCII by hand, eight characters a step (one string per character costs
// three times as much), anything else by the decoder.
const fcc = String.fromCharCode;
function decodeAt(m, p, len) {
  const e = p + len;
  if (len > 64) return td.decode(m.subarray(p, e));
  for (let i = p; i < e; i++) if (m[i] > 127) return td.decode(m.subarray(p, e));
  let s = '', i = p;
  for (; i + 8 <= e; i += 8) s += fcc(m[i], m[i + 1], m[i + 2], m[i + 3], m[i + 4], m[i + 5], m[i + 6], m[i + 7]);
  for (; i < e; i++) s += fcc(m[i]);
  return s;
}

// nameAt is decodeAt for names and keys, which the module sends again and
// again: short ASCII ones are interned. A hash of the bytes, read four at a
// time, finds the entry decoded last time, whose bytes are compared four at
// a time too; no string is built.
const interned = new Map(); // hash -> { s, words }
const maxInterned = 4096;
function nameAt(m, dv, p, len) {
  if (len > 64) return td.decode(m.subarray(p, p + len));
  // h stays an int32 (the offset basis written as one, or the loop would
  // box it as a double), and the key a small integer.
  let h = 0x811c9dc5 | 0, ascii = 0;
  const nw = len >> 2, e = p + len;
  for (let i = p, we = p + 4 * nw; i < we; i += 4) {
    const w = dv.getInt32(i, true);
    ascii |= w;
    h = Math.imul(h ^ w, 0x01000193);
  }
  for (let i = p + 4 * nw; i < e; i++) {
    const c = m[i];
    ascii |= c;
    h = Math.imul(h ^ c, 0x01000193);
  }
  if (ascii & 0x80808080) return td.decode(m.subarray(p, e));
  h = (h ^ len) & 0x3fffffff;
  const hit = interned.get(h);
  if (hit !== undefined && hit.s.length === len) {
    const words = hit.words;
    let i = 0;
    while (i < nw && dv.getInt32(p + 4 * i, true) === words[i]) i++;
    if (i === nw) {
      let j = 4 * nw;
      while (j < len && hit.s.charCodeAt(j) === m[p + j]) j++;
      if (j === len) return hit.s;
    }
  }
  const s = td.decode(m.subarray(p, e));
  const words = new Int32Array(nw);
  for (let i = 0; i < nw; i++) words[i] = dv.getInt32(p + 4 * i, true);
  if (interned.size >= maxInterned) interned.clear();
  interned.set(h, { s, words });
  return s;
}

// isASCII reports whether every character of s is below 0x80, so that its
// UTF-8 form is its characters, one byte each.
function isASCII(s) {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 127) return false;
  return true;
}

// findHeader returns the value of the first header in hs (names stored
// lower-case) named by the len bytes of m at p, lower-cased; undefined if
// there is none.
function findHeader(hs, m, p, len) {
  for (let i = p; i < p + len; i++) {
    if (m[i] > 127) { // not ASCII: by the book
      const key = td.decode(m.subarray(p, p + len)).toLowerCase();
      for (let j = 0; j < hs.length; j++) if (hs[j][0] === key) return hs[j][1];
      return undefined;
    }
  }
  next: for (let j = 0; j < hs.length; j++) {
    const k = hs[j][0];
    if (k.length !== len) continue;
    for (let i = 0; i < len; i++) {
      let c = m[p + i];
      if (c >= 65 && c <= 90) c += 32;
      if (k.charCodeAt(i) !== c) continue next;
    }
    return hs[j][1];
  }
  return undefined;
}

// getHeader returns the first value of a header named name (lower-case).
function getHeader(hs, name) {
  for (let j = 0; j < hs.length; j++) if (hs[j][0] === name) return hs[j][1];
  return undefined;
}

// propertyNames maps the NUL-joined paths the module asks for to their
// dotted names, without splitting each time.
const propertyNames = new Map(['source\0address', 'request\0path', 'request\0method', 'request\0host',
  'plugin_name', 'plugin_root_id', 'plugin_vm_id'].map((p) => [p, p.replace('\0', '.')]));

function decodePairs(b) {
  if (b.length < 4) return null;
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const n = dv.getUint32(0, true);
  if (4 + 8 * n > b.length) return null;
  let p = 4 + 8 * n;
  const out = [];
  for (let i = 0; i < n; i++) {
    const kl = dv.getUint32(4 + 8 * i, true), vl = dv.getUint32(8 + 8 * i, true);
    if (p + kl + vl + 2 > b.length) return null;
    const k = decodeAt(b, p, kl); p += kl + 1;
    const v = decodeAt(b, p, vl); p += vl + 1;
    out.push([k, v]);
  }
  return out;
}

// Worker is one VM: an instance of the module.
class Worker {
  constructor(host, index) {
    this.host = host;
    this.index = index;
    this.cur = null; // the stream whose callback runs
    this.nextID = 2; // 1 is the root context
    this.streams = new Map(); // live streams by context id
    this.calls = []; // proxy_http_call calls not yet answered
    this.rootCalls = []; // calls made by proxy_on_tick, answered by tick()
    this.tickPeriod = 0; // ms; 0 = no ticks (proxy_set_tick_period_milliseconds)
    this.tickSets = 0; // how many times the period was set
    this.held = new Map(); // streams paused with no call: a tick may continue them
    this.u8 = new Uint8Array(0); // views of linear memory; see bytes
    this.dv = null;
  }

  // bytes and view return views of linear memory, made afresh when it has
  // grown: growing detaches the old buffer, and a view of a detached buffer
  // has length 0 (linear memory is never empty), so one comparison
  // re-validates them on every use.
  bytes() {
    if (this.u8.length === 0) this.remap();
    return this.u8;
  }
  view() {
    if (this.u8.length === 0) this.remap();
    return this.dv;
  }
  remap() {
    this.u8 = new Uint8Array(this.memory.buffer);
    this.dv = new DataView(this.memory.buffer);
  }

  read(ptr, len) {
    const m = this.bytes();
    if (ptr + len > m.length) return null;
    return m.slice(ptr, ptr + len);
  }
  // sub is read without the copy: a view valid until memory grows.
  sub(ptr, len) {
    const m = this.bytes();
    if (ptr + len > m.length) return null;
    return m.subarray(ptr, ptr + len);
  }
  str(ptr, len) {
    const m = this.bytes();
    if (ptr + len > m.length) return null;
    return decodeAt(m, ptr, len);
  }
  // name is str for names and keys (interned; see nameAt).
  name(ptr, len) {
    const m = this.bytes();
    if (ptr + len > m.length) return null;
    return nameAt(m, this.dv, ptr, len);
  }

  // copyOut hands data to the guest as proxy-wasm hosts do: guest memory
  // from its malloc, then the address and size written to the two return
  // slots. malloc may grow memory: views are taken after it.
  copyOut(data, ptrPtr, sizePtr) {
    const n = data.length;
    let addr = 0;
    if (n > 0) {
      addr = this.malloc(n) >>> 0;
      const m = this.bytes();
      if (addr === 0 || addr + n > m.length) return INVALID_MEMORY_ACCESS;
      if (n > 64) m.set(data, addr);
      else for (let i = 0; i < n; i++) m[addr + i] = data[i];
    }
    const dv = this.view();
    dv.setUint32(ptrPtr, addr, true);
    dv.setUint32(sizePtr, n, true);
    return OK;
  }

  // copyStr is copyOut of a string's UTF-8 bytes.
  copyStr(s, ptrPtr, sizePtr) {
    if (!isASCII(s)) return this.copyOut(te.encode(s), ptrPtr, sizePtr);
    const n = s.length;
    let addr = 0;
    if (n > 0) {
      addr = this.malloc(n) >>> 0;
      const m = this.bytes();
      if (addr === 0 || addr + n > m.length) return INVALID_MEMORY_ACCESS;
      for (let i = 0; i < n; i++) m[addr + i] = s.charCodeAt(i);
    }
    const dv = this.view();
    dv.setUint32(ptrPtr, addr, true);
    dv.setUint32(sizePtr, n, true);
    return OK;
  }

  env() {
    const h = this.host, w = this;
    return {
      proxy_log(level, ptr, len) {
        const msg = w.str(ptr, len);
        if (msg === null) return INVALID_MEMORY_ACCESS;
        h.logs.push({ level, msg, worker: w.index });
        return OK;
      },
      proxy_get_buffer_bytes(type, start, max, ptrPtr, sizePtr) {
        let buf;
        if (type === 6) buf = h.vmConfig; else if (type === 7) buf = h.pluginConfig;
        else if (type === 4 && w.callResp) buf = w.callResp.body;
        else if (type === 1 && w.cur && w.cur.respChunk) buf = w.cur.respChunk;
        else return type > 7 ? BAD_ARGUMENT : NOT_FOUND;
        const s = Math.min(start, buf.length), e = Math.min(buf.length, s + max);
        return w.copyOut(buf.subarray(s, e), ptrPtr, sizePtr);
      },
      proxy_get_header_map_value(map, kptr, klen, ptrPtr, sizePtr) {
        const m = w.bytes();
        if (kptr + klen > m.length) return INVALID_MEMORY_ACCESS;
        const hs = w.headerMap(map);
        if (!hs) return BAD_ARGUMENT;
        const v = findHeader(hs, m, kptr, klen);
        if (v === undefined) return NOT_FOUND;
        return w.copyStr(v, ptrPtr, sizePtr);
      },
      proxy_get_header_map_pairs(map, ptrPtr, sizePtr) {
        const hs = w.headerMap(map);
        if (!hs) return BAD_ARGUMENT;
        return w.copyOut(encodePairs(hs), ptrPtr, sizePtr);
      },
      proxy_http_call(uptr, ulen, hptr, hlen, bptr, blen, tptr, tlen, timeout, tokenPtr) {
        const cluster = w.str(uptr, ulen), raw = w.read(hptr, hlen), body = w.read(bptr, blen);
        if (cluster === null || raw === null || body === null) return INVALID_MEMORY_ACCESS;
        const headers = decodePairs(raw) || [];
        for (const need of [':method', ':path', ':authority']) {
          if (!headers.some(([k]) => k === need)) return BAD_ARGUMENT;
        }
        if (!h.clusters.has(cluster)) return BAD_ARGUMENT; // Envoy: unknown cluster
        const token = h.nextToken++;
        w.calls.push({ token, cluster, headers, body, timeout, stream: w.cur ? w.cur.id : 0 });
        w.view().setUint32(tokenPtr, token, true);
        return OK;
      },
      proxy_set_effective_context(id) {
        const s = w.streams.get(id);
        if (!s || s.done) return BAD_ARGUMENT; // previous context stays effective
        w.cur = s;
        return OK;
      },
      proxy_set_tick_period_milliseconds(ms) {
        w.tickPeriod = ms >>> 0;
        w.tickSets++;
        return OK;
      },
      proxy_continue_stream(type) {
        if (type > 1) return BAD_ARGUMENT;
        if (w.cur && type === 0) w.cur.continued++;
        return OK; // on the root context Envoy answers OK and does nothing
      },
      proxy_replace_header_map_value(map, kptr, klen, vptr, vlen) {
        const key = w.name(kptr, klen), val = w.str(vptr, vlen);
        if (key === null || val === null) return INVALID_MEMORY_ACCESS;
        const hs = w.headerMap(map);
        if (!hs) return BAD_ARGUMENT;
        const k = key.toLowerCase();
        let i = 0;
        while (i < hs.length && hs[i][0] !== k) i++;
        if (i === hs.length) hs.push([k, val]);
        else { hs[i] = [k, val]; for (let j = hs.length - 1; j > i; j--) if (hs[j][0] === k) hs.splice(j, 1); }
        return OK;
      },
      // Envoy's addCopy: a line of its own, after any of the same name.
      proxy_add_header_map_value(map, kptr, klen, vptr, vlen) {
        const key = w.name(kptr, klen), val = w.str(vptr, vlen);
        if (key === null || val === null) return INVALID_MEMORY_ACCESS;
        const hs = w.headerMap(map);
        if (!hs) return BAD_ARGUMENT;
        hs.push([key.toLowerCase(), val]);
        return OK;
      },
      proxy_send_local_response(status, dptr, dlen, bptr, blen, hptr, hlen, grpcStatus) {
        const details = w.str(dptr, dlen), body = w.read(bptr, blen), raw = w.read(hptr, hlen);
        if (details === null || body === null || raw === null) return INVALID_MEMORY_ACCESS;
        const s = w.cur;
        if (!s) return BAD_ARGUMENT;
        if (s.local) return BAD_ARGUMENT;
        s.local = { status, details, body, headers: hlen ? (decodePairs(raw) || []) : [], grpcStatus };
        return OK;
      },
      proxy_get_shared_data(kptr, klen, ptrPtr, sizePtr, casPtr) {
        const key = w.name(kptr, klen);
        if (key === null) return INVALID_MEMORY_ACCESS;
        const e = h.shared.get(key);
        if (!e) return NOT_FOUND;
        const st = w.copyOut(e.value, ptrPtr, sizePtr);
        if (st !== OK) return st;
        w.view().setUint32(casPtr, e.cas, true);
        // A test's hook may run another worker here, between this get and
        // the set that follows it (a compare-and-swap race).
        if (h.onSharedGet !== null) h.onSharedGet(key, w.index);
        return OK;
      },
      proxy_set_shared_data(kptr, klen, vptr, vlen, cas) {
        const key = w.name(kptr, klen), val = w.sub(vptr, vlen);
        if (key === null || val === null) return INVALID_MEMORY_ACCESS;
        return h.shared.set(key, val, cas >>> 0);
      },
      proxy_get_property(pptr, plen, ptrPtr, sizePtr) {
        const path = w.name(pptr, plen);
        if (path === null) return INVALID_MEMORY_ACCESS;
        const v = w.property(propertyNames.get(path) ?? path.split('\0').join('.'));
        if (v === undefined) return NOT_FOUND;
        return w.copyStr(v, ptrPtr, sizePtr);
      },
      proxy_define_metric(type, nptr, nlen, idPtr) {
        const name = w.str(nptr, nlen);
        if (name === null) return INVALID_MEMORY_ACCESS;
        if (type > 2) return BAD_ARGUMENT;
        let id = h.metricIDs.get(name);
        if (id === undefined) { id = h.metrics.length; h.metrics.push({ name, type, value: 0n }); h.metricIDs.set(name, id); }
        w.view().setUint32(idPtr, id, true);
        return OK;
      },
      proxy_increment_metric(id, delta) { // delta: i64, a BigInt in V8
        const m = h.metrics[id];
        if (!m) return NOT_FOUND;
        if (typeof delta !== 'bigint') throw new Error('proxy_increment_metric: i64 arrived as ' + typeof delta);
        m.value += delta;
        return OK;
      },
    };
  }

  wasi() {
    const h = this.host, w = this;
    return {
      clock_time_get(id, precision, resultPtr) { // precision: i64 BigInt
        w.view().setBigUint64(resultPtr, h.clock.now(), true);
        return 0;
      },
      random_get(ptr, len) { crypto.getRandomValues(w.bytes().subarray(ptr, ptr + len)); return 0; },
      fd_write(fd, iovs, iovsLen, nPtr) {
        const dv = w.view();
        let n = 0, text = '';
        for (let i = 0; i < iovsLen; i++) {
          const p = dv.getUint32(iovs + 8 * i, true), l = dv.getUint32(iovs + 8 * i + 4, true);
          text += td.decode(w.bytes().subarray(p, p + l)); n += l;
        }
        h.logs.push({ level: fd === 2 ? 4 : 2, msg: 'fd ' + fd + ': ' + text, worker: w.index });
        dv.setUint32(nPtr, n, true);
        return 0;
      },
      poll_oneoff() { return ENOSYS; }, // as Envoy 1.33 to ~1.38 answer
      sched_yield() { return 0; },
      proc_exit(code) { throw new Error('proc_exit(' + code + ')'); },
      args_sizes_get(a, b) { const dv = w.view(); dv.setUint32(a, 0, true); dv.setUint32(b, 0, true); return 0; },
      args_get() { return 0; },
      environ_sizes_get(a, b) { const dv = w.view(); dv.setUint32(a, 0, true); dv.setUint32(b, 0, true); return 0; },
      environ_get() { return 0; },
    };
  }

  headerMap(map) {
    if (map === 6 || map === 7) return this.callResp ? (map === 6 ? this.callResp.headers : this.callResp.trailers) : null;
    const s = this.cur;
    if (!s) return null;
    if (map === 0) return s.reqHeaders;
    if (map === 2) return s.respHeaders;
    if (map === 6 && this.callResp) return this.callResp.headers;
    if (map === 7 && this.callResp) return this.callResp.trailers;
    return null;
  }

  property(path) {
    const h = this.host, s = this.cur;
    switch (path) {
      case 'plugin_name': return h.pluginName;
      case 'plugin_root_id': return h.rootID;
      case 'plugin_vm_id': return h.vmID;
    }
    if (!s) return undefined;
    switch (path) {
      case 'source.address': return s.source;
      case 'request.path': return getHeader(s.reqHeaders, ':path');
      case 'request.method': return getHeader(s.reqHeaders, ':method');
      case 'request.host': return getHeader(s.reqHeaders, ':authority');
    }
    return undefined;
  }

  async start(module, wrapEnv) {
    const env = wrapEnv ? wrapEnv(this.env()) : this.env();
    const imports = { env, wasi_snapshot_preview1: this.wasi() };
    // What this host provides, "module.name", for the comparison with what
    // the module imports.
    this.provided = Object.entries(imports).flatMap(([m, fns]) => Object.keys(fns).map((n) => m + '.' + n));
    this.instance = await WebAssembly.instantiate(module, imports);
    const ex = this.instance.exports;
    this.ex = ex;
    this.memory = ex.memory;
    this.malloc = ex.malloc || ex.proxy_on_memory_allocate;
    ex._initialize();
    ex.proxy_on_context_create(1, 0);
    if (ex.proxy_on_vm_start && !ex.proxy_on_vm_start(1, this.host.vmConfig.length)) throw new Error('proxy_on_vm_start returned false');
    if (!ex.proxy_on_configure(1, this.host.pluginConfig.length)) throw new Error('proxy_on_configure returned false');
  }

  // callStream calls the export name for stream s, with s the effective
  // context (and, when the host traces, the call recorded on s).
  callStream(s, name, a, b, c) {
    if (s.trace !== null) s.trace.push(name);
    this.cur = s;
    try { return this.ex[name](a, b, c); } finally { this.cur = null; }
  }

  // answer delivers the answers of calls to the root context, as Envoy
  // does: answerCall(call) gives the response (null: the call failed, no
  // headers, as a timeout or reset).
  answer(calls, answerCall) {
    const ex = this.ex;
    for (const c of calls) {
      const resp = answerCall ? answerCall(c) : null;
      this.callResp = resp || { headers: [], trailers: [], body: new Uint8Array(0) };
      this.cur = null;
      try {
        ex.proxy_on_http_call_response(1, c.token, this.callResp.headers.length, this.callResp.body.length, this.callResp.trailers.length);
      } finally { this.callResp = null; this.cur = null; }
    }
  }

  // request runs one stream through the filter in Envoy's order and
  // returns the response the client would get. A request the filter pauses
  // waits for its calls: each is answered by answerCall (the test's
  // rate-limit service), delivered to the root context as Envoy does, and
  // the stream goes on if the filter continued it.
  request(req, answerCall) {
    const s = {
      id: this.nextID++,
      reqHeaders: req.headers.map(([k, v]) => [k.toLowerCase(), v]),
      respHeaders: null,
      source: req.source || '127.0.0.1:40000',
      response: req.response, // the upstream's answer, if the step gives one
      local: null,
      continued: 0,
      done: false,
      trace: this.host.trace ? [] : null, // the callbacks called, when tracing
    };
    this.streams.set(s.id, s);
    this.callStream(s, 'proxy_on_context_create', s.id, 1);
    const action = this.callStream(s, 'proxy_on_request_headers', s.id, s.reqHeaders.length, 1);
    const grpc = /^application\/grpc([+;]|$)/i.test(getHeader(s.reqHeaders, 'content-type') || '');
    const calls = [];
    if (action !== 0 && !s.local) {
      // Paused: answer this stream's calls from the root context (those
      // its callbacks made; ticks answer their own, see tick).
      while (this.calls.length > 0 && s.continued === 0 && !s.local) {
        const c = this.calls.shift();
        calls.push(c);
        this.answer([c], answerCall);
      }
    }
    if (action !== 0 && !s.local && s.continued === 0 && calls.length === 0) {
      // Paused with nothing to wait for but a tick: held, as Envoy holds a
      // stream after StopAllIteration, until tick() continues it or
      // cancel() ends it as a client that leaves.
      this.held.set(s.id, { s, grpc, action });
      return { status: 0, held: true, id: s.id, worker: this.index, paused: true, continued: 0, headers: [], calls: [] };
    }
    return this.finish(s, grpc, action, calls);
  }

  // finish runs the rest of a stream: the upstream's answer (or the local
  // reply), the response callbacks and the end of the stream.
  finish(s, grpc, action, calls) {
    let body = '', chunks = null;
    const local = s.local;
    if (local) {
      // The local reply goes through the response callbacks, as in Envoy
      // (a local reply is encoded through the filter chain): its headers,
      // then its body, if any, as one last chunk.
      ({ headers: s.respHeaders, body } = localReply(local, grpc));
      if (body.length > 0) chunks = [local.body];
    } else if (action !== 0 && s.continued === 0) {
      s.respHeaders = [[':status', '500']];
      body = 'v8host: the filter paused the request and never resumed it\n';
    } else if (s.response) {
      // The upstream's response: a status, headers and body chunks, each
      // handed to proxy_on_response_body as it would arrive (Envoy with a
      // filter answering Continue); abort ends the stream without
      // end_of_stream, as an upstream reset does.
      const r = s.response;
      s.respHeaders = [[':status', String(r.status || 200)], ...(r.headers || [])];
      body = (r.chunks || []).join('');
      if (body.length > 0) chunks = r.chunks.map((c) => te.encode(c));
    } else {
      // No answer given: 200 with no body (end of stream on the headers),
      // as the wazero benchmark's upstream (internal/localhost/wasmhost Exchange).
      s.respHeaders = [[':status', '200'], ['content-length', '0']];
    }
    this.callStream(s, 'proxy_on_response_headers', s.id, s.respHeaders.length, body.length === 0 ? 1 : 0);
    if (s.local === local && chunks !== null) {
      const abort = !local && s.response.abort;
      for (let i = 0; i < chunks.length; i++) {
        const last = i === chunks.length - 1 && !abort;
        s.respChunk = chunks[i];
        try { this.callStream(s, 'proxy_on_response_body', s.id, s.respChunk.length, last ? 1 : 0); } finally { s.respChunk = null; }
        if (s.local !== local) break;
      }
    }
    // A local reply sent while processing the upstream's response replaces
    // it; the response callbacks do not run again.
    if (s.local !== local) ({ headers: s.respHeaders, body } = localReply(s.local, grpc));
    this.callStream(s, 'proxy_on_log', s.id);
    this.callStream(s, 'proxy_on_done', s.id);
    this.callStream(s, 'proxy_on_delete', s.id);
    s.done = true;
    this.streams.delete(s.id);
    const status = Number((s.respHeaders.find(([k]) => k === ':status') || [, '0'])[1]);
    const res = { status, id: s.id, worker: this.index, headers: s.respHeaders.filter(([k]) => !k.startsWith(':')), body, paused: action !== 0, continued: s.continued,
      calls: calls.map(callJSON) };
    if (s.trace !== null) res.trace = s.trace;
    return res;
  }

  // tick calls the root context's proxy_on_tick if the filter set a tick
  // period; the calls it makes are the root context's own (a lease
  // refill), kept apart from any stream's. With answerCall, every root
  // call still unanswered is answered after the tick, in order (without,
  // they stay out, as slow answers do). Then it finishes the held streams
  // the tick continued or answered, in the order they were held.
  tick(answerCall) {
    if (this.tickPeriod !== 0) {
      this.cur = null;
      try { this.ex.proxy_on_tick(1); } finally { this.cur = null; }
    }
    const made = this.calls.splice(0);
    this.rootCalls.push(...made);
    if (answerCall) {
      // Calls an answer makes are root calls too: answered on the next tick.
      const out = this.rootCalls.splice(0);
      this.answer(out, answerCall);
      this.rootCalls.push(...this.calls.splice(0));
    }
    const released = [];
    for (const [id, { s, grpc, action }] of this.held) {
      if (s.continued === 0 && !s.local) continue;
      this.held.delete(id);
      released.push(this.finish(s, grpc, action, []));
    }
    return { released, calls: made.map((c) => ({ worker: this.index, ...callJSON(c) })) };
  }

  // cancel ends a held stream as Envoy does when its client leaves:
  // proxy_on_log, proxy_on_done, proxy_on_delete, and it is gone.
  cancel(id) {
    const h = this.held.get(id);
    if (!h) return false;
    this.held.delete(id);
    const s = h.s;
    for (const name of ['proxy_on_log', 'proxy_on_done', 'proxy_on_delete']) this.callStream(s, name, s.id);
    s.done = true;
    this.streams.delete(s.id);
    return true;
  }
}

// callJSON is a call as the tests see it: the body in base64.
function callJSON(c) {
  return { cluster: c.cluster, headers: c.headers, timeout: c.timeout, body: Buffer.from(c.body).toString('base64') };
}

// localReply builds the response of proxy_send_local_response as Envoy
// does: a gRPC request gets HTTP 200 with grpc-status and grpc-message.
function localReply(lr, grpc) {
  const hs = [[':status', String(lr.status)], ...lr.headers.map(([k, v]) => [k.toLowerCase(), v])];
  const set = (k, v) => { const i = hs.findIndex(([n]) => n === k); if (i < 0) hs.push([k, v]); else hs[i] = [k, v]; };
  const body = td.decode(lr.body);
  if (grpc) {
    set(':status', '200');
    set('content-type', 'application/grpc');
    if (!hs.some(([k]) => k === 'grpc-status')) {
      const code = lr.grpcStatus >= 0 && lr.grpcStatus <= 16 ? lr.grpcStatus : httpToGRPC(lr.status);
      set('grpc-status', String(code));
    }
    if (body) set('grpc-message', encodeURIComponent(body));
    return { headers: hs, body: '' };
  }
  if (body && !hs.some(([k]) => k === 'content-type')) hs.push(['content-type', 'text/plain']);
  return { headers: hs, body };
}

function httpToGRPC(status) {
  return { 400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14 }[status] ?? 2;
}

// Host runs workers of one module with one shared-data store.
export class Host {
  constructor({ pluginConfig = '', vmConfig = '', workers = 2, now, pluginName = 'tokengate', rootID = '', vmID = '', clusters = [] } = {}) {
    this.pluginConfig = te.encode(pluginConfig);
    this.vmConfig = te.encode(vmConfig);
    this.nWorkers = workers;
    this.clock = new Clock(now);
    this.shared = new SharedData();
    this.metrics = []; this.metricIDs = new Map();
    this.logs = [];
    this.pluginName = pluginName; this.rootID = rootID; this.vmID = vmID;
    this.next = 0;
    this.clusters = new Set(clusters);
    this.nextToken = 1;
    this.trace = false; // record each stream's callbacks (result.trace)
    this.onSharedGet = null; // (key, worker) after each proxy_get_shared_data that found its key
  }

  // start compiles the module and starts the workers; wrapEnv, if given,
  // may wrap the env functions (bench/v8 times them).
  async start(wasmBytes, wrapEnv) {
    const module = await WebAssembly.compile(wasmBytes);
    this.module = module;
    this.workers = [];
    for (let i = 0; i < this.nWorkers; i++) {
      const w = new Worker(this, i);
      await w.start(module, wrapEnv);
      this.workers.push(w);
    }
  }

  // request runs on the given worker, or round robin.
  request(req, answerCall) {
    const i = req.worker ?? (this.next++ % this.workers.length);
    return this.workers[i].request(req, answerCall);
  }

  // tick ticks every worker (see Worker.tick) and returns the streams
  // finished and the calls the ticks made, worker by worker.
  tick(answerCall) {
    const rs = this.workers.map((w) => w.tick(answerCall));
    return { released: rs.flatMap((r) => r.released), calls: rs.flatMap((r) => r.calls) };
  }

  cancel(worker, id) { return this.workers[worker].cancel(id); }

  metric(name) {
    const id = this.metricIDs.get(name);
    return id === undefined ? undefined : this.metrics[id].value;
  }
}
