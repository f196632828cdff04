// run.mjs drives host.mjs from a JSON script (argv[2]) and prints one JSON
// line per step, for the Go tests in this directory:
//
//   node --no-liftoff run.mjs script.json
//
// A script: {"wasm": path, "pluginConfig": string, "workers": n,
// "nowNs": "decimal ns" (a fixed clock; omit for the wall clock),
// "clusters": [names], "steps": [...]}. Steps:
//   {"op": "request", "headers": [[k, v]...], "source": "ip:port",
//    "worker": i, "rls": {"codes": [1|2...], "remaining": n, "reset": s,
//    "grant": n, "id": s} |    the rate-limit service's answer, if called
//    {"fail": true},           (grant and id: a lease's Quota)
//    "response": {"status": n, "headers": [[k, v]...], "chunks": [s...],
//    "abort": bool},           the upstream's answer (default: 200, no body)
//    "during": {request step}} another request (on another worker), run
//                              inside this one's first proxy_get_shared_data
//                              of a key starting with "during.keyPrefix"
//                              (default "tb:"): a compare-and-swap race
//   {"op": "advance", "ms": n} move the fixed clock
//   {"op": "shared"}           the shared data, sorted
//   {"op": "metric", "name": s}
//   {"op": "logs"}             the log lines so far
//   {"op": "repeat", "n": n, "step": {...}} a request n times, summarised
//   {"op": "tick", "rls": {...}} proxy_on_tick on every worker with a
//                              period; the held streams it finished, the
//                              calls the ticks made, and the periods. With
//                              "rls", every root-context call still out is
//                              answered so after the tick; without, they
//                              stay out
//   {"op": "imports"}          the module's imports and what the host provides
//   {"op": "cancel", "worker": i, "id": n} a held stream's client leaves
//   {"op": "trace", "on": bool} record each request's callbacks ("trace")
import { readFileSync } from 'node:fs';
import { Host } from './host.mjs';

const script = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const out = (o) => process.stdout.write(JSON.stringify(o, (k, v) => (typeof v === 'bigint' ? v.toString() : v)) + '\n');

// The test's rate-limit service: a RateLimitResponse in protobuf's wire
// format, written here by hand (not the module's encoder), unary-gRPC
// framed.
function varint(n) {
  const b = [];
  n = BigInt(n);
  while (n >= 0x80n) { b.push(Number(n & 0x7fn) | 0x80); n >>= 7n; }
  b.push(Number(n));
  return b;
}
const field = (num, wt) => varint((num << 3) | wt);
const bytesField = (num, bs) => [...field(num, 2), ...varint(bs.length), ...bs];
function rlsAnswer(spec) {
  if (spec.fail) return null; // no headers: a timeout or reset
  let overall = 1;
  const msg = [];
  for (const code of spec.codes) {
    if (code === 2) overall = 2;
  }
  msg.push(...field(1, 0), ...varint(overall));
  for (const code of spec.codes) {
    const st = [...field(1, 0), ...varint(code), ...field(3, 0), ...varint(spec.remaining || 0),
      ...bytesField(4, [...field(1, 0), ...varint(spec.reset || 0)])];
    if (spec.grant !== undefined) { // a lease: Quota{requests, id}
      st.push(...bytesField(5, [...field(1, 0), ...varint(spec.grant), ...bytesField(3, [...Buffer.from(String(spec.id))])]));
    }
    msg.push(...bytesField(2, st));
  }
  const body = new Uint8Array(5 + msg.length);
  new DataView(body.buffer).setUint32(1, msg.length, false);
  body.set(msg, 5);
  return { headers: [[':status', '200'], ['content-type', 'application/grpc']], trailers: [['grpc-status', '0']], body };
}

const host = new Host({
  pluginConfig: script.pluginConfig, workers: script.workers || 2,
  now: script.nowNs === undefined ? undefined : BigInt(script.nowNs), clusters: script.clusters || [],
});
try {
  await host.start(readFileSync(script.wasm));
} catch (e) {
  out({ op: 'start', error: String(e.message || e), logs: host.logs });
  process.exit(0);
}
out({ op: 'start', ok: true });
const req = (st) => host.request(st, st.rls ? () => rlsAnswer(st.rls) : undefined);
for (const st of script.steps) {
  switch (st.op) {
    case 'request': {
      let during;
      if (st.during) {
        const prefix = st.during.keyPrefix || 'tb:';
        host.onSharedGet = (key) => {
          if (!key.startsWith(prefix)) return;
          host.onSharedGet = null;
          during = req(st.during);
        };
      }
      const r = req(st);
      host.onSharedGet = null;
      out({ op: 'request', ...r, ...(st.during ? { during: during ?? null } : {}) });
      break;
    }
    case 'repeat': {
      const statuses = {};
      for (let i = 0; i < st.n; i++) {
        const r = req(st.step);
        statuses[r.status] = (statuses[r.status] || 0) + 1;
      }
      out({ op: 'repeat', statuses });
      break;
    }
    case 'tick': {
      const { released, calls } = host.tick(st.rls ? () => rlsAnswer(st.rls) : undefined);
      out({ op: 'tick', released, calls, periods: host.workers.map((w) => w.tickPeriod),
        tickSets: host.workers.reduce((n, w) => n + w.tickSets, 0) });
      break;
    }
    case 'trace':
      host.trace = !!st.on;
      out({ op: 'trace' });
      break;
    case 'imports': {
      const names = (list) => [...new Set(list)].sort();
      out({ op: 'imports', module: names(WebAssembly.Module.imports(host.module).map((i) => i.module + '.' + i.name)),
        host: names(host.workers[0].provided) });
      break;
    }
    case 'cancel':
      out({ op: 'cancel', ok: host.cancel(st.worker, st.id) });
      break;
    case 'advance':
      host.clock.advance(st.ms);
      out({ op: 'advance' });
      break;
    case 'shared':
      out({ op: 'shared', entries: host.shared.entries() });
      break;
    case 'metric':
      out({ op: 'metric', value: host.metric(st.name) });
      break;
    case 'logs':
      out({ op: 'logs', logs: host.logs });
      break;
    default:
      throw new Error('unknown step ' + st.op);
  }
}
