#!/bin/sh
# bench/dynmod.sh: the Envoy dynamic module (libtokengate.so) against the
# Wasm module under V8, side by side in one run (BENCHMARKS.md, row 9).
#
# ROUNDS times, alternating: the C test host of e2e/dynmod runs N requests
# with no filter and N through the library's one per-IP rule (thread CPU
# time, interleaved inside the round), then bench/v8/bench.mjs runs the
# Wasm module's cases under `node --no-liftoff` for one round of N requests.
# It prints the medians over the rounds and their ratios:
#   native added = CPU/request with the rule - CPU/request with no filter
#   V8 added     = CPU/request of case b (one per-IP rule) - of case o (no filter)
#
# With BASE_LIB set to another build of the library (an older commit's, say),
# each round also runs the C host's bench against it, between the two others,
# and the summary gives its figures beside this tree's.
#
#   bench/dynmod.sh [ROUNDS] [N]      (defaults 5, 20000)
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
N=${2:-20000}
OUT=${BENCH_OUT:-build/bench}
mkdir -p "$OUT"
make --no-print-directory build dynmod >/dev/null
cc -O2 -pthread -rdynamic -o build/dynmod-host e2e/dynmod/testdata/host.c -ldl
CFG='{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}'
HDRS=':authority:api.example.com :path:/api/items :method:GET :scheme:http accept:*/* user-agent:bench/1.0 x-api-key:key-0123456789 x-forwarded-proto:http x-request-id:6f1c1d52-8a38-4c1e-9a43-2b7f0c2b5a8e'
: >"$OUT/dynmod-native.txt"
: >"$OUT/dynmod-v8.jsonl"
: >"$OUT/dynmod-base.txt"
i=0
while [ "$i" -lt "$ROUNDS" ]; do
	printf 'workers 1\nquiet\nconfig %s\nbench 1 %s %s\n' "$CFG" "$N" "$HDRS" |
		build/dynmod-host build/libtokengate.so | grep '^bench' >>"$OUT/dynmod-native.txt"
	if [ -n "${BASE_LIB:-}" ]; then
		printf 'workers 1\nquiet\nconfig %s\nbench 1 %s %s\n' "$CFG" "$N" "$HDRS" |
			build/dynmod-host "$BASE_LIB" | grep '^bench' >>"$OUT/dynmod-base.txt"
	fi
	node --no-liftoff bench/v8/bench.mjs build/tokengate.wasm "$N" 1 >>"$OUT/dynmod-v8.jsonl"
	i=$((i + 1))
done
node -e '
const fs = require("fs");
const [nat, v8, baseLib] = process.argv.slice(1);
const med = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const parse = (f) => fs.readFileSync(f, "utf8").trim().split("\n").filter((l) => l).map((l) => Object.fromEntries(l.split(" ").slice(1).reduce((a, x, i, s) => (i % 2 ? a : [...a, [x, Number(s[i + 1])]]), [])));
const rows = parse(nat);
const runs = fs.readFileSync(v8, "utf8").trim().split("\n").map((l) => JSON.parse(l));
const base = med(rows.map((r) => r.base_ns)), withF = med(rows.map((r) => r.filter_ns)), added = med(rows.map((r) => r.added_ns));
const v8o = med(runs.map((r) => r.cases["o-no-filter"].cpuNsPerReq)), v8b = med(runs.map((r) => r.cases["b-one-rule"].cpuNsPerReq));
const v8added = med(runs.map((r) => r.cases["b-one-rule"].cpuNsPerReq - r.cases["o-no-filter"].cpuNsPerReq));
console.log(`rounds ${rows.length}, ${runs[0].n} requests each`);
console.log(`native: no filter ${base.toFixed(0)} ns CPU/req, one rule ${withF.toFixed(0)} ns, added ${added.toFixed(0)} ns`);
console.log(`V8 ${runs[0].node}: no filter ${v8o.toFixed(0)} ns CPU/req, one rule ${v8b.toFixed(0)} ns, added ${v8added.toFixed(0)} ns`);
console.log(`native added / V8 added = ${(added / v8added).toFixed(3)}`);
const bases = parse(baseLib);
if (bases.length) {
  const bAdded = med(bases.map((r) => r.added_ns));
  console.log(`BASE_LIB: no filter ${med(bases.map((r) => r.base_ns)).toFixed(0)} ns CPU/req, one rule ${med(bases.map((r) => r.filter_ns)).toFixed(0)} ns, added ${bAdded.toFixed(0)} ns; / V8 added = ${(bAdded / v8added).toFixed(3)}; this tree / BASE_LIB added = ${(added / bAdded).toFixed(3)}`);
}
' "$OUT/dynmod-native.txt" "$OUT/dynmod-v8.jsonl" "$OUT/dynmod-base.txt"
