// ab.mjs compares builds under V8 side by side: each variant is a host
// (a checkout's e2e/v8/host.mjs) and a module, all loaded in one process,
// and every round runs K requests of every case on every variant in turn
// (the order alternating), so that a noisy machine slows them alike. It
// prints, per case and variant, the median wall and CPU ns/request and the
// 10th percentile of CPU ns/request (the least disturbed rounds), then, for
// each later variant, the median over the rounds of its CPU ns/request less
// the first variant's in the same round (paired: the two ran back to back).
// The no-filter row runs a module that does nothing (nop.mjs) through each
// variant's host; the clock is the real one. AB_CASES=a-passthrough,b-one-rule
// (names from cases.mjs) runs only those cases.
//
//   git worktree add /tmp/old main && (cd /tmp/old && make build)
//   node --no-liftoff bench/v8/ab.mjs 40 1000 old=/tmp/old:/tmp/old/build/tokengate.wasm new=.:build/tokengate.wasm
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { cases, headers, median } from './cases.mjs';
import { nopModule } from './nop.mjs';

const [roundsArg, kArg, ...specs] = process.argv.slice(2);
const R = Number(roundsArg), K = Number(kArg);
if (!(R > 0 && K > 0 && specs.length > 0)) {
  process.stderr.write('usage: node --no-liftoff ab.mjs ROUNDS K name=hostdir:module.wasm ...\n');
  process.exit(2);
}
const p10 = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 10)];

const only = process.env.AB_CASES ? process.env.AB_CASES.split(',') : null;
const cs = only ? cases.filter((c) => only.includes(c.name)) : cases;
const variants = [];
for (const spec of specs) {
  const eq = spec.indexOf('='), colon = spec.indexOf(':', eq);
  const name = spec.slice(0, eq), dir = spec.slice(eq + 1, colon), wasmPath = spec.slice(colon + 1);
  const { Host } = await import(pathToFileURL(resolve(dir, 'e2e/v8/host.mjs')).href);
  const wasm = readFileSync(wasmPath);
  const v = { name, runs: {} };
  for (const c of cs) {
    const host = new Host({ pluginConfig: c.config ? JSON.stringify(c.config) : '', workers: 1 });
    await host.start(c.config ? wasm : nopModule());
    v.runs[c.name] = { host, i: 0, samples: [] };
  }
  variants.push(v);
}

// run sends n requests of case c to one variant's host: wall and CPU
// ns/request.
function run(c, st, n) {
  const req = { headers: headers(c.path), source: c.addrs[0] };
  const t = process.hrtime.bigint(), u = process.cpuUsage();
  for (let k = 0; k < n; k++) {
    req.source = c.addrs[st.i++ % c.addrs.length];
    const r = st.host.request(req);
    if (r.status !== c.status && st.i > 1) throw new Error(`${c.name}: status ${r.status}, want ${c.status}`);
  }
  const cu = process.cpuUsage(u);
  return [Number(process.hrtime.bigint() - t) / n, (cu.user + cu.system) * 1000 / n];
}

for (const v of variants) for (const c of cs) run(c, v.runs[c.name], Math.max(K, 2000)); // warm up
for (let r = 0; r < R; r++) {
  const order = r % 2 ? [...variants].reverse() : variants;
  for (const c of cs) for (const v of order) v.runs[c.name].samples.push(run(c, v.runs[c.name], K));
}

const cell = (s) => `${median(s.map((x) => x[0])).toFixed(0)} / ${median(s.map((x) => x[1])).toFixed(0)} / ${p10(s.map((x) => x[1])).toFixed(0)}`;
console.log(`# ${R} rounds x ${K} requests, interleaved in one process; ns/request: wall median / CPU median / CPU p10`);
console.log('case'.padEnd(14) + variants.map((v) => v.name.padStart(26)).join(''));
for (const c of cs) console.log(c.name.padEnd(14) + variants.map((v) => cell(v.runs[c.name].samples).padStart(26)).join(''));
for (const c of cs) {
  const first = variants[0].runs[c.name].samples;
  for (const v of variants.slice(1)) {
    const d = v.runs[c.name].samples.map((x, i) => x[1] - first[i][1]);
    console.log(`${c.name} ${v.name} - ${variants[0].name}: paired CPU difference, median ${median(d).toFixed(0)} ns/request`);
  }
}
for (const v of variants.filter((v) => v.runs['b-one-rule'] && v.runs['a-passthrough'])) {
  const cpu = (name, f) => f(v.runs[name].samples.map((x) => x[1]));
  console.log(`${v.name}: one rule / passthrough = ${(cpu('b-one-rule', median) / cpu('a-passthrough', median)).toFixed(2)}x (CPU medians), ` +
    `${(cpu('b-one-rule', p10) / cpu('a-passthrough', p10)).toFixed(2)}x (CPU p10)`);
}
