#!/bin/sh
# bench/dynmod-callgrind.sh: instructions per request of the Envoy dynamic
# module in the C test host of e2e/dynmod, under valgrind's callgrind
# (BENCHMARKS.md, row 9a″). Instruction counts do not move with the
# machine's load, unlike CPU time.
#
# For each library (default build/libtokengate.so, built by make dynmod),
# the host runs the one per-IP rule of bench/dynmod.sh with the request
# headers of bench/v8/cases.mjs, four times under callgrind, counting the
# instructions of the thread that runs the requests
# (--separate-threads=yes: the Go runtime's own threads are left out):
#   allocs 2000, allocs 22000     2,000 warm-up requests, then N requests
#   bench 1 2000, bench 1 12000   N warm-up requests, N requests with no
#                                 filter (the host's own work), N requests
# so that, per request,
#   with  = (allocs 22000 - allocs 2000) / 20000
#   base  = (bench 1 12000 - bench 1 2000) / 10000 - 2 * with
#   added = with - base
# "with" is exact to a few tens of instructions from run to run; "base",
# the host's work alone, is the same for every library, but its estimate
# carries twice the noise of "with" (about ±200): compare libraries by
# "with".
#
#   bench/dynmod-callgrind.sh [LIB...]
set -eu
cd "$(dirname "$0")/.."
OUT=${BENCH_OUT:-build/bench}
mkdir -p "$OUT"
command -v valgrind >/dev/null || { echo "dynmod-callgrind: valgrind is not installed (apt-get install valgrind)" >&2; exit 1; }
[ $# -gt 0 ] || { make --no-print-directory dynmod >/dev/null; set -- build/libtokengate.so; }
cc -O2 -pthread -rdynamic -o build/dynmod-host e2e/dynmod/testdata/host.c -ldl
CFG='{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}'
HDRS=':authority:api.example.com :path:/api/items :method:GET :scheme:http accept:*/* user-agent:bench/1.0 x-api-key:key-0123456789 x-forwarded-proto:http x-request-id:6f1c1d52-8a38-4c1e-9a43-2b7f0c2b5a8e'
# count LIB CMD: the instructions of the busiest thread (the worker's).
count() {
	rm -f "$OUT"/dynmod-cg.out*
	printf 'workers 1\nquiet\nconfig %s\n%s %s\n' "$CFG" "$2" "$HDRS" |
		GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --separate-threads=yes \
			--callgrind-out-file="$OUT/dynmod-cg.out" build/dynmod-host "$1" >/dev/null 2>&1
	for f in "$OUT"/dynmod-cg.out-*; do sed -n 's/^totals: *//p' "$f"; done | sort -n | tail -1
}
for lib in "$@"; do
	a1=$(count "$lib" 'allocs 2000')
	a2=$(count "$lib" 'allocs 22000')
	b1=$(count "$lib" 'bench 1 2000')
	b2=$(count "$lib" 'bench 1 12000')
	awk -v lib="$lib" -v a1="$a1" -v a2="$a2" -v b1="$b1" -v b2="$b2" 'BEGIN {
		w = (a2 - a1) / 20000; base = (b2 - b1) / 10000 - 2 * w
		printf "%s: with %.0f, base %.0f, added %.0f instructions/request\n", lib, w, base, w - base }'
done
rm -f "$OUT"/dynmod-cg.out*
