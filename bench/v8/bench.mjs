// bench.mjs measures the module under V8 (Node, run with --no-liftoff as
// Envoy runs V8) with the JavaScript host of e2e/v8: the five request cases
// of the wazero benchmark (bench/wasm_test.go BenchmarkGuestRequest) and a
// row with no filter at all (the host's request path without the module).
// Cases run interleaved, ROUNDS times N requests each; it prints one JSON
// object: per case the median ns/request, the ns spent inside host
// functions (less the timer's own cost, calibrated on a function that does
// nothing), the rest of the request apart from the host's own bookkeeping
// (the no-filter row): the guest, export calls included, and host calls
// per request.
//
//   node --no-liftoff bench/v8/bench.mjs build/tokengate.wasm [N] [ROUNDS]
import { readFileSync } from 'node:fs';
import { Host } from '../../e2e/v8/host.mjs';
import { cases, headers, median } from './cases.mjs';

const [wasmPath, nArg, roundsArg] = process.argv.slice(2);
const N = Number(nArg || 20000), ROUNDS = Number(roundsArg || 5);
const wasm = readFileSync(wasmPath);

// timed wraps every env function to add the time spent inside it to acc
// (two clock reads per call, as the wazero benchmark's split does).
const timed = (acc) => (fns) => {
  for (const [k, f] of Object.entries(fns)) {
    fns[k] = (...a) => {
      const t = process.hrtime.bigint();
      try { return f(...a); } finally { acc.ns += process.hrtime.bigint() - t; acc.calls++; }
    };
  }
  return fns;
};

// The timer's own cost inside each timed interval, per host call: timed
// around a function that does nothing.
const calib = { ns: 0n, calls: 0 };
const nop = timed(calib)({ nop: () => 0 }).nop;
for (let i = 0; i < 20000; i++) nop();
calib.ns = 0n; calib.calls = 0;
for (let i = 0; i < 200000; i++) nop();
const timerNs = Number(calib.ns) / calib.calls;

for (const c of cases) {
  if (!c.config) continue;
  c.host = new Host({ pluginConfig: JSON.stringify(c.config), workers: 1, now: 1700000000000000000n });
  await c.host.start(wasm);
  // A second host with timed host functions, for the guest/host split, so
  // that the timing does not slow the main measurement.
  c.acc = { ns: 0n, calls: 0 };
  c.split = new Host({ pluginConfig: JSON.stringify(c.config), workers: 1, now: 1700000000000000000n });
  await c.split.start(wasm, timed(c.acc));
}
// The no-filter row: the host's own request bookkeeping and echo answer.
function noFilter(req) {
  const s = { reqHeaders: req.headers.map(([k, v]) => [k.toLowerCase(), v]), source: req.source };
  const respHeaders = [[':status', '200'], ['content-type', 'application/json']];
  return { status: 200, headers: respHeaders.filter(([k]) => !k.startsWith(':')), body: '{"echo":true}', s };
}

function runCase(c, n, host, warm) {
  const req = { headers: headers(c.path), source: c.addrs[0] };
  let i = 0;
  const t = process.hrtime.bigint();
  for (let k = 0; k < n; k++) {
    req.source = c.addrs[i++ % c.addrs.length];
    const r = host ? host.request(req) : noFilter(req);
    if (!warm && r.status !== c.status) throw new Error(`${c.name}: status ${r.status}, want ${c.status}`);
  }
  return Number(process.hrtime.bigint() - t) / n;
}

// Warm up every case (and spend the rejected case's one token).
for (const c of cases) runCase(c, Math.min(N, 2000), c.host, true);
const samples = Object.fromEntries(cases.map((c) => [c.name, []]));
for (let r = 0; r < ROUNDS; r++) {
  for (const c of cases) samples[c.name].push(runCase(c, N, c.host));
}

// The split: the same requests on the timed host.
const split = {};
for (const c of cases) {
  if (!c.split) continue;
  runCase(c, Math.min(N, 2000), c.split, true);
  c.acc.ns = 0n; c.acc.calls = 0;
  const total = runCase(c, N, c.split);
  const raw = Number(c.acc.ns) / N, calls = c.acc.calls / N;
  split[c.name] = { timedNsPerReq: total, hostNsRaw: raw, hostNs: Math.max(0, raw - calls * timerNs), hostCalls: calls };
}

const out = { engine: 'v8', node: process.version, flags: process.execArgv, n: N, rounds: ROUNDS, timerNsPerCall: timerNs, cases: {} };
const base = median(samples['o-no-filter']);
for (const c of cases) {
  const ns = median(samples[c.name]), sp = split[c.name];
  out.cases[c.name] = { nsPerReq: ns, samples: samples[c.name], ...(sp ? { ...sp, guestNs: Math.max(0, ns - sp.hostNs - base) } : {}) };
}
process.stdout.write(JSON.stringify(out) + '\n');
