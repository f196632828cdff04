// cases.mjs: the request cases of the V8 benchmarks (bench.mjs, ab.mjs),
// the same as the wazero benchmark's (bench/wasm_test.go
// BenchmarkGuestRequest), and a no-filter row (config null: a module that
// does nothing, nop.mjs, through the same host).

const rule = (name, keys) => ({ name, limit_keys: keys, algorithm_config: { rps: 1000000, burst: 1000000 } });
const configs = {
  passthrough: { bundle_version: 1, policies: [{ id: 'api', spec: { selector: { pathPrefix: '/api/' }, rules: [rule('per-ip', ['ip:address'])] } }] },
  one: rule('per-ip', ['ip:address']),
  four: { rules: [rule('per-ip', ['ip:address']), rule('per-key', ['header:x-api-key']), rule('per-route', ['method', 'path']), rule('global', [])] },
  rejected: { name: 'per-ip', limit_keys: ['ip:address'], algorithm_config: { rps: 0.001, burst: 1 } },
};

// headers are a request's headers, as a browser-ish client sends them.
export const headers = (path) => [[':authority', 'api.example.com'], [':path', path], [':method', 'GET'], [':scheme', 'http'],
  ['accept', '*/*'], ['user-agent', 'bench/1.0'], ['x-api-key', 'key-0123456789'], ['x-forwarded-proto', 'http'],
  ['x-request-id', '6f1c1d52-8a38-4c1e-9a43-2b7f0c2b5a8e']];

const ips = Array.from({ length: 100000 }, (_, i) => `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}:40000`);

// cases: name, plugin configuration (null: no filter), :path, the client
// addresses taken in turn, and the status every request must get.
export const cases = [
  { name: 'o-no-filter', config: null, path: '/api/items', addrs: ips.slice(0, 1), status: 200 },
  { name: 'a-passthrough', config: configs.passthrough, path: '/static/app.js', addrs: ips.slice(0, 1), status: 200 },
  { name: 'b-one-rule', config: configs.one, path: '/api/items', addrs: ips.slice(0, 1), status: 200 },
  { name: 'c-four-rules', config: configs.four, path: '/api/items', addrs: ips.slice(0, 1), status: 200 },
  { name: 'd-rejected', config: configs.rejected, path: '/api/items', addrs: ips.slice(0, 1), status: 429 },
  { name: 'e-100000-ips', config: configs.one, path: '/api/items', addrs: ips, status: 200 },
];

export const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
