// configs.mjs compares configurations (and builds) of the one-rule request
// under V8 side by side, as ab.mjs compares builds: every round runs K
// requests of every variant in turn, in one process, and it prints the
// median CPU ns/request of each and its ratio to the first. A variant is
// name=module.wasm@config, where config is a plugin configuration (JSON)
// or one of the cases of cases.mjs by name ("a-passthrough",
// "b-one-rule", ...); "nop" as the module is the module that does nothing.
// Requests are those of the one-rule case (the passthrough's for
// "a-passthrough"). BENCHMARKS.md's decomposition of the one-rule request:
//
//   node --no-liftoff bench/v8/configs.mjs 30 1000 nop=nop@ pass=build/tokengate.wasm@a-passthrough \
//     one=build/tokengate.wasm@b-one-rule \
//     noheaders=build/tokengate.wasm@'{"rules":[...],"settings":{"ratelimit_headers":false}}'
import { readFileSync } from 'node:fs';
import { Host } from '../../e2e/v8/host.mjs';
import { cases, headers, median } from './cases.mjs';
import { nopModule } from './nop.mjs';

const [roundsArg, kArg, ...specs] = process.argv.slice(2);
const R = Number(roundsArg), K = Number(kArg);
if (!(R > 0 && K > 0 && specs.length > 0)) {
  process.stderr.write('usage: node --no-liftoff configs.mjs ROUNDS K name=module.wasm@config ...\n');
  process.exit(2);
}
const one = cases.find((c) => c.name === 'b-one-rule');
const variants = [];
for (const spec of specs) {
  const eq = spec.indexOf('='), at = spec.indexOf('@', eq);
  const name = spec.slice(0, eq), mod = spec.slice(eq + 1, at), cfg = spec.slice(at + 1);
  const c = cases.find((x) => x.name === cfg);
  const config = mod === 'nop' ? '' : c ? JSON.stringify(c.config) : cfg;
  const host = new Host({ pluginConfig: config, workers: 1 });
  await host.start(mod === 'nop' ? nopModule() : readFileSync(mod));
  variants.push({ name, host, req: { headers: headers((c || one).path), source: one.addrs[0] }, samples: [] });
}
const run = (v, n) => {
  const u = process.cpuUsage();
  for (let i = 0; i < n; i++) if (v.host.request(v.req).status !== 200) throw new Error(v.name + ': not admitted');
  const c = process.cpuUsage(u);
  return (c.user + c.system) * 1000 / n;
};
for (const v of variants) run(v, Math.max(K, 2000));
for (let r = 0; r < R; r++) for (const v of r % 2 ? [...variants].reverse() : variants) v.samples.push(run(v, K));
const base = median(variants[0].samples);
console.log(`# ${R} rounds x ${K} requests, interleaved in one process; CPU ns/request, median`);
for (const v of variants) {
  const m = median(v.samples);
  console.log(v.name.padEnd(16) + m.toFixed(0).padStart(7) + `  ${(m / base).toFixed(2)}x ${variants[0].name}`);
}
