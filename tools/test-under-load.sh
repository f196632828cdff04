#!/usr/bin/env bash
# tools/test-under-load.sh runs `make test` N times in a row (default 3),
# uncached, with two CPU-bound loops beside it, and stops at the first
# failure: no test's verdict may depend on the machine's speed. The loops
# end with the script. Each run's output is in build/load/runN.log.
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
mkdir -p build/load
loops=()
for _ in 1 2; do
	sh -c 'while :; do :; done' &
	loops+=($!)
done
trap 'kill "${loops[@]}" 2>/dev/null' EXIT
for i in $(seq "$runs"); do
	start=$(date +%s)
	GOFLAGS=-count=1 make test >"build/load/run$i.log" 2>&1
	rc=$?
	echo "run $i: exit $rc, $(($(date +%s) - start)) s, load average $(cut -d' ' -f1-3 /proc/loadavg)"
	[[ $rc -eq 0 ]] || exit "$rc"
done
