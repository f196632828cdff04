// bench.mjs measures the module under V8 (Node, run with --no-liftoff as
// Envoy runs V8) with the JavaScript host of e2e/v8: the five request cases
// of the wazero benchmark (bench/wasm_test.go BenchmarkGuestRequest) and a
// no-filter row: a module that does nothing (nop.mjs) through the same
// host, so the host's own bookkeeping and the export calls every wasm
// filter costs. The clock is the real one (nanoseconds), as in wazero.
//
// Every round runs every case, N requests, on its host, then N more on a
// second host of the same case whose host functions are timed (two clock
// reads a call), so that timed and untimed runs alternate and see the same
// machine; it prints one JSON object: per case the medians over the rounds
// of ns/request (wall, and CPU), of the ns spent inside host functions
// (less the timer's own cost, calibrated on a function that does nothing)
// and of what is left for the guest: the request less the host functions
// and less the no-filter row (the module's own code beyond a module that
// does nothing), and host calls per request.
//
//   node --no-liftoff bench/v8/bench.mjs build/tokengate.wasm [N] [ROUNDS]
import { readFileSync } from 'node:fs';
import { Host } from '../../e2e/v8/host.mjs';
import { cases, headers, median } from './cases.mjs';
import { nopModule } from './nop.mjs';

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
  const mod = c.config ? wasm : nopModule();
  const cfg = c.config ? JSON.stringify(c.config) : '';
  c.host = new Host({ pluginConfig: cfg, workers: 1 });
  await c.host.start(mod);
  // A second host with timed host functions, for the guest/host split.
  c.acc = { ns: 0n, calls: 0 };
  c.split = new Host({ pluginConfig: cfg, workers: 1 });
  await c.split.start(mod, timed(c.acc));
}

// runCase sends n requests of case c to host: wall and CPU ns/request.
function runCase(c, n, host, warm) {
  const req = { headers: headers(c.path), source: c.addrs[0] };
  let i = 0;
  const t = process.hrtime.bigint(), u = process.cpuUsage();
  for (let k = 0; k < n; k++) {
    req.source = c.addrs[i++ % c.addrs.length];
    const r = host.request(req);
    if (!warm && r.status !== c.status) throw new Error(`${c.name}: status ${r.status}, want ${c.status}`);
  }
  const cu = process.cpuUsage(u);
  return [Number(process.hrtime.bigint() - t) / n, (cu.user + cu.system) * 1000 / n];
}

// Warm up every host (and spend the rejected case's one token on each),
// then run one whole round unmeasured: the first round after warm-up ran
// up to twice as slow as the next ones (V8 still settling the host code
// shared by the module that does nothing and the real one).
for (const c of cases) {
  runCase(c, Math.min(N, 2000), c.host, true);
  runCase(c, Math.min(N, 2000), c.split, true);
}
const rows = Object.fromEntries(cases.map((c) => [c.name, { wall: [], cpu: [], timed: [], hostRaw: [], host: [], calls: [] }]));
// Each round starts at another case, so that no case always follows the
// same one (and pays for its garbage); round -1 is the unmeasured one.
for (let r = -1; r < ROUNDS; r++) {
  for (let k = 0; k < cases.length; k++) {
    const c = cases[(r + 1 + k) % cases.length];
    const row = r < 0 ? { wall: [], cpu: [], timed: [], hostRaw: [], host: [], calls: [] } : rows[c.name];
    const [wall, cpu] = runCase(c, N, c.host);
    row.wall.push(wall); row.cpu.push(cpu);
    c.acc.ns = 0n; c.acc.calls = 0;
    const [tw] = runCase(c, N, c.split);
    const raw = Number(c.acc.ns) / N, calls = c.acc.calls / N;
    row.timed.push(tw); row.hostRaw.push(raw); row.host.push(Math.max(0, raw - calls * timerNs)); row.calls.push(calls);
  }
}

const out = { engine: 'v8', node: process.version, flags: process.execArgv, n: N, rounds: ROUNDS, timerNsPerCall: timerNs, clock: 'real', cases: {} };
const base = median(rows['o-no-filter'].wall);
for (const c of cases) {
  const row = rows[c.name], ns = median(row.wall), hostNs = median(row.host);
  out.cases[c.name] = { nsPerReq: ns, cpuNsPerReq: median(row.cpu), samples: row.wall, timedNsPerReq: median(row.timed),
    hostNsRaw: median(row.hostRaw), hostNs, hostCalls: median(row.calls),
    guestNs: c.config ? Math.max(0, ns - hostNs - base) : 0 };
}
process.stdout.write(JSON.stringify(out) + '\n');
