#!/usr/bin/env bash
# bench/run.sh is `make bench`: every benchmark of BENCHMARKS.md in one run,
# printed as one table (bench/report). Raw outputs stay in $BENCH_OUT.
#
#   bench/run.sh                 # everything, about 10 minutes on 2 cores
#   BENCH_QUICK=1 bench/run.sh   # fewer repetitions and shorter runs
#
# Tools: wrk (HTTP), redis-server and redis-benchmark (the Redis peer),
# envoyproxy/ratelimit (tools/ratelimit.sh installs it with go install) and,
# optionally, binaryen's wasm-opt (the size table). When one is missing and
# this runs as root with apt-get, it installs the Debian package
# (apt-get update first); otherwise that part is skipped with a message.
# `make test` never needs any of them.
#
# Every load generator talks to 127.0.0.1 only, for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
OUT=${BENCH_OUT:-build/bench}
COUNT=${BENCH_COUNT:-5}      # repetitions of each Go benchmark (the table shows the median)
HTTP_SECS=${BENCH_HTTP_SECS:-10}
HTTP_ROUNDS=${BENCH_HTTP_ROUNDS:-3}
CONC=${BENCH_CONCURRENCY:-8} # connections (HTTP) and clients (Redis)
GUEST_N=20000x
if [[ -n "${BENCH_QUICK:-}" ]]; then
	COUNT=2 HTTP_SECS=3 HTTP_ROUNDS=1 GUEST_N=5000x
fi
HTTP_PORT_A=${BENCH_PORT_A:-18181}
HTTP_PORT_B=${BENCH_PORT_B:-18182}
HTTP_PORT_O=${BENCH_PORT_O:-18183}
REDIS_PORT=${BENCH_REDIS_PORT:-18379}

rm -rf "$OUT"
mkdir -p "$OUT"
log() { printf '== %s\n' "$*" >&2; }

pids=()
cleanup() {
	local p
	for p in "${pids[@]+"${pids[@]}"}"; do
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
}
trap cleanup EXIT

# ensure_tool CMD PACKAGE: install PACKAGE when CMD is missing and we can.
apt_updated=
ensure_tool() {
	command -v "$1" >/dev/null 2>&1 && return 0
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		if [[ -z $apt_updated ]]; then
			log "apt-get update (for $2)"
			apt-get update -qq >/dev/null 2>&1 || true
			apt_updated=1
		fi
		log "apt-get install $2"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null 2>&1 || true
	fi
	command -v "$1" >/dev/null 2>&1
}

# machine.txt: what the numbers were measured on.
{
	echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
	echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
	echo "cores: $(nproc)"
	echo "go: $($GO env GOVERSION)"
	echo "load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
} >"$OUT/machine.txt"

log "building the module"
make build >/dev/null
cp build/tokengate.wasm "$OUT/tokengate.wasm"

# 7. Module size: as built, stripped of the name section (-s -w), and
# through wasm-opt -Oz when binaryen is there.
{
	echo "size default $(stat -c %s build/tokengate.wasm)"
	GOOS=wasip1 GOARCH=wasm $GO build -buildmode=c-shared -trimpath -ldflags='-s -w' -o "$OUT/stripped.wasm" ./cmd/tokengate
	echo "size stripped $(stat -c %s "$OUT/stripped.wasm")"
	if ensure_tool wasm-opt binaryen; then
		if wasm-opt -Oz --enable-bulk-memory --enable-sign-ext --enable-nontrapping-float-to-int \
			"$OUT/stripped.wasm" -o "$OUT/small.wasm" 2>"$OUT/wasm-opt.err"; then
			echo "size wasm-opt $(stat -c %s "$OUT/small.wasm")"
		else
			log "wasm-opt failed (see $OUT/wasm-opt.err); no wasm-opt row"
		fi
	else
		log "binaryen's wasm-opt is missing; no wasm-opt row"
	fi
} >"$OUT/size.txt"

log "Go benchmarks: bucket, sharedstate (count $COUNT)"
$GO test -run '^$' -bench '^(BenchmarkTake|BenchmarkXTimeRateAllowN)$' -benchmem -count "$COUNT" ./bucket/ >"$OUT/go-bucket.txt"
$GO test -run '^$' -bench '^BenchmarkTakeAll$' -benchmem -count "$COUNT" ./sharedstate/ >"$OUT/go-sharedstate.txt"

log "the filter's code alone against a zero-cost host: native, and GOOS=wasip1 in wazero"
$GO test -run '^$' -bench '^BenchmarkZeroCostHost$' -benchmem -count "$COUNT" ./filter/ >"$OUT/go-zerohost-native.txt"
mkdir -p "$OUT/bin"
$GO build -o "$OUT/bin/wazero" github.com/tetratelabs/wazero/cmd/wazero
PATH="$(cd "$OUT/bin" && pwd):$PATH" GOWASIRUNTIME=wazero GOOS=wasip1 GOARCH=wasm \
	$GO test -exec "$($GO env GOROOT)/lib/wasm/go_wasip1_wasm_exec" -run '^$' -bench '^BenchmarkZeroCostHost$' \
	-benchmem -count "$COUNT" ./filter/ >"$OUT/go-zerohost-wasm.txt"

$GO test -c -o "$OUT/bench.test" ./bench/
BENCH_TEST=$(cd "$OUT" && pwd)/bench.test
run_bench() { (cd bench && "$BENCH_TEST" -test.run '^$' "$@"); }
# The request cases, a no-filter row (a module that does nothing) and the
# five of BENCHMARKS.md, in wazero (BenchmarkGuestRequest) and under V8
# (node --no-liftoff, bench/v8/bench.mjs) in alternating rounds, so that
# the two engines see the same machine; the table shows the medians over
# the rounds.
have_node=
if ensure_tool node nodejs; then
	have_node=1
else
	log "node is missing and could not be installed: no V8 rows"
fi
log "the module per request in wazero${have_node:+ and under V8}, $COUNT alternating rounds of $GUEST_N"
: >"$OUT/go-guest.txt"
for r in $(seq "$COUNT"); do
	run_bench -test.bench '^BenchmarkGuestRequest$' -test.benchtime "$GUEST_N" -test.count 1 >>"$OUT/go-guest.txt"
	if [[ -n $have_node ]]; then
		node --no-liftoff bench/v8/bench.mjs build/tokengate.wasm "${GUEST_N%x}" 1 >"$OUT/v8-$r.json"
	fi
done
run_bench -test.bench '^BenchmarkHostShare$' -test.benchtime "$GUEST_N" -test.count "$COUNT" >"$OUT/go-hostshare.txt"
log "contention: 8 workers, one hot key, 100,000 requests"
run_bench -test.bench '^BenchmarkContention$' -test.benchtime 100000x >"$OUT/go-contention.txt"
log "guest memory over 100,000 and 1,000,000 requests"
run_bench -test.bench '^BenchmarkGuestMemory$' -test.benchtime 100000x >"$OUT/go-memory-100k.txt"
run_bench -test.bench '^BenchmarkGuestMemory$' -test.benchtime 1000000x >"$OUT/go-memory-1m.txt"
log "instantiating one more worker VM"
run_bench -test.bench '^BenchmarkInstantiateWorker$' -test.benchtime 20x -test.count "$COUNT" >"$OUT/go-instantiate.txt"

# 4. HTTP over loopback: tokengate-local with the passthrough configuration
# (a), with one per-IP rule (b) and with no module at all (o, -no-filter),
# measured alternately in the same run.
if ensure_tool wrk wrk; then
	log "HTTP: wrk -c $CONC, ${HTTP_SECS}s x $HTTP_ROUNDS rounds per configuration"
	$GO build -o "$OUT/tokengate-local" ./cmd/tokengate-local
	cat >"$OUT/http-a.json" <<-'EOF'
		{"bundle_version":1,"policies":[{"id":"api","spec":{"selector":{"pathPrefix":"/api/"},
		 "rules":[{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}]}}]}
	EOF
	cat >"$OUT/http-b.json" <<-'EOF'
		{"name":"per-ip","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}
	EOF
	start_local() { # config port [flags]
		"$OUT/tokengate-local" -wasm build/tokengate.wasm -config "$1" -listen "127.0.0.1:$2" -admin '' -log-level error "${@:3}" \
			>"$OUT/local-$2.log" 2>&1 &
		pids+=($!)
		local i
		for i in $(seq 100); do
			grep -q 'listening on' "$OUT/local-$2.log" 2>/dev/null && return 0
			sleep 0.1
		done
		log "tokengate-local on port $2 did not start:"
		cat "$OUT/local-$2.log" >&2
		return 1
	}
	start_local "$OUT/http-a.json" "$HTTP_PORT_A"
	start_local "$OUT/http-b.json" "$HTTP_PORT_B"
	start_local "$OUT/http-a.json" "$HTTP_PORT_O" -no-filter
	# Warm up both, then alternate a, b so that both see the same machine.
	wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_A/static/app.js" >/dev/null
	wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_B/api/items" >/dev/null
	wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_O/static/app.js" >/dev/null
	for r in $(seq "$HTTP_ROUNDS"); do
		wrk -t 2 -c "$CONC" -d "${HTTP_SECS}s" --latency "http://127.0.0.1:$HTTP_PORT_A/static/app.js" >"$OUT/http-a-$r.txt"
		wrk -t 2 -c "$CONC" -d "${HTTP_SECS}s" --latency "http://127.0.0.1:$HTTP_PORT_B/api/items" >"$OUT/http-b-$r.txt"
		wrk -t 2 -c "$CONC" -d "${HTTP_SECS}s" --latency "http://127.0.0.1:$HTTP_PORT_O/static/app.js" >"$OUT/http-o-$r.txt"
	done
	cleanup
	pids=()
else
	log "wrk is missing and could not be installed: no HTTP rows"
fi

# 6. The Redis peer: the usual Lua token bucket (bench/redis_token_bucket.lua) by EVALSHA,
# with as many clients as the HTTP run has connections.
if ensure_tool redis-server redis-server && ensure_tool redis-benchmark redis-tools; then
	log "Redis: EVALSHA token bucket, $CONC clients"
	redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$OUT/redis.log" 2>&1 &
	pids+=($!)
	for i in $(seq 50); do
		redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
		sleep 0.1
	done
	sha=$(redis-cli -p "$REDIS_PORT" SCRIPT LOAD "$(cat bench/redis_token_bucket.lua)")
	n=200000
	[[ -n "${BENCH_QUICK:-}" ]] && n=50000
	redis-benchmark -p "$REDIS_PORT" -c "$CONC" -n "$n" -r 100000 --csv \
		EVALSHA "$sha" 1 'rl:ip:__rand_int__' 1000000 1000000 1736940000 1 >"$OUT/redis-keys.csv"
	redis-benchmark -p "$REDIS_PORT" -c "$CONC" -n "$n" --csv \
		EVALSHA "$sha" 1 'rl:global' 1000000 1000000 1736940000 1 >"$OUT/redis-hot.csv"
	cleanup
	pids=()
else
	log "redis-server or redis-benchmark is missing and could not be installed: no Redis rows"
fi

# 8. Rate-limit services (bench/rls.sh; also runs on its own).
BENCH_OUT=$OUT GO=$GO bench/rls.sh || log "bench/rls.sh failed: no RLS rows"

$GO run ./bench/report -dir "$OUT" | tee "$OUT/table.md"
