#!/usr/bin/env bash
# bench/run.sh is `make bench`: every benchmark of BENCHMARKS.md in one run,
# printed as one table (bench/report). Raw outputs stay in $BENCH_OUT.
#
#   bench/run.sh                 # everything, about 6 minutes on 2 cores
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

log "the module in wazero: per-request guest sequence ($GUEST_N x $COUNT)"
$GO test -c -o "$OUT/bench.test" ./bench/
BENCH_TEST=$(cd "$OUT" && pwd)/bench.test
run_bench() { (cd bench && "$BENCH_TEST" -test.run '^$' "$@"); }
run_bench -test.bench '^BenchmarkGuestRequest$' -test.benchtime "$GUEST_N" -test.count "$COUNT" >"$OUT/go-guest.txt"
run_bench -test.bench '^BenchmarkHostShare$' -test.benchtime "$GUEST_N" -test.count "$COUNT" >"$OUT/go-hostshare.txt"
if ensure_tool node nodejs; then
	log "the module under V8 (node --no-liftoff): no filter and the five cases, interleaved ($GUEST_N x $COUNT)"
	node --no-liftoff bench/v8/bench.mjs build/tokengate.wasm "${GUEST_N%x}" "$COUNT" >"$OUT/v8.json"
else
	log "node is missing and could not be installed: no V8 rows"
fi
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

# 6. The Redis peer: the Lua token bucket of design-notes/03 by EVALSHA,
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

# 8. Rate-limit services: tokengate-rls against envoyproxy/ratelimit on one
# Redis, driven by the same gRPC load generator (bench/cmd/rlsload), one hot
# key and 10,000 keys, interleaved round by round; then the latency a
# cluster-scope rule adds to a request through tokengate-local (wrk), beside
# the same rule with local scope.
RLS_SECS=${BENCH_RLS_SECS:-8}
RLS_ROUNDS=${BENCH_RLS_ROUNDS:-3}
RLS_CLIENTS=${BENCH_RLS_CLIENTS:-32}
if [[ -n "${BENCH_QUICK:-}" ]]; then
	RLS_SECS=3 RLS_ROUNDS=1
fi
RLS_REDIS_PORT=${BENCH_RLS_REDIS_PORT:-18380}
RLS_PORT=${BENCH_RLS_PORT:-18381}
if [[ ! -d cmd/tokengate-rls ]]; then
	log "no cmd/tokengate-rls in this tree: no RLS rows"
elif ! ensure_tool redis-server redis-server; then
	log "redis-server is missing and could not be installed: no RLS rows"
elif ! RL_BIN=$(tools/ratelimit.sh); then
	log "envoyproxy/ratelimit could not be installed (tools/ratelimit.sh): no RLS rows"
else
	log "RLS: tokengate-rls vs envoyproxy/ratelimit, $RLS_CLIENTS clients, ${RLS_SECS}s x $RLS_ROUNDS rounds"
	$GO build -o "$OUT/tokengate-rls" ./cmd/tokengate-rls
	$GO build -o "$OUT/rlsload" ./bench/cmd/rlsload
	redis-server --port "$RLS_REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$OUT/rls-redis.log" 2>&1 &
	pids+=($!)
	for i in $(seq 50); do
		redis-cli -p "$RLS_REDIS_PORT" ping >/dev/null 2>&1 && break
		sleep 0.1
	done
	# The same limit for both, never reached: the services decide, admit,
	# and write Redis on every request. (fleet-per-ip is for the HTTP rows.)
	cat >"$OUT/rls.json" <<-'EOF'
		{"rules":[{"name":"bench","scope":"cluster","limit_keys":["header:x-key"],"algorithm_config":{"rps":1000000,"burst":1000000}},
		  {"name":"fleet-per-ip","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}],
		 "settings":{"rls":{"cluster":"tokengate_rls"}}}
	EOF
	"$OUT/tokengate-rls" -config "$OUT/rls.json" -redis "127.0.0.1:$RLS_REDIS_PORT" -listen "127.0.0.1:$RLS_PORT" \
		-admin "127.0.0.1:$((RLS_PORT + 1))" >"$OUT/rls-tokengate.log" 2>&1 &
	pids+=($!)
	mkdir -p "$OUT/ratelimit/ratelimit/config"
	cat >"$OUT/ratelimit/ratelimit/config/bench.yaml" <<-'EOF'
		domain: tokengate
		descriptors:
		  - key: tokengate_rule
		    value: bench
		    descriptors:
		      - key: key
		        rate_limit: {unit: second, requests_per_unit: 1000000}
	EOF
	# Its defaults but for the listeners, Redis over TCP and no statsd;
	# REDIS_POOL_SIZE stays 10, REDIS_PIPELINE_WINDOW 0 (no batching).
	env -i PATH="$PATH" HOST=127.0.0.1 PORT=$((RLS_PORT + 2)) GRPC_HOST=127.0.0.1 GRPC_PORT=$((RLS_PORT + 3)) \
		DEBUG_HOST=127.0.0.1 DEBUG_PORT=$((RLS_PORT + 4)) USE_STATSD=false LOG_LEVEL=warn \
		REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$RLS_REDIS_PORT" \
		RUNTIME_ROOT="$(cd "$OUT/ratelimit" && pwd)" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false \
		"$RL_BIN" >"$OUT/rls-envoy.log" 2>&1 &
	pids+=($!)
	load() { # name port keys out
		"$OUT/rlsload" -addr "127.0.0.1:$2" -name "$1" -keys "$3" -c "$RLS_CLIENTS" -n 2000000 -d "${RLS_SECS}s" -warmup 1s >"$4" 2>>"$OUT/rls-load.err"
	}
	for i in $(seq 100); do
		load probe "$RLS_PORT" 1 /dev/null 2>/dev/null && load probe $((RLS_PORT + 3)) 1 /dev/null 2>/dev/null && break
		sleep 0.2
	done 2>/dev/null || true
	for r in $(seq "$RLS_ROUNDS"); do
		for keys in 1 10000; do
			load tokengate-rls "$RLS_PORT" "$keys" "$OUT/rls-tokengate-$keys-$r.json" || log "rlsload against tokengate-rls failed (see $OUT/rls-load.err)"
			load envoyproxy/ratelimit $((RLS_PORT + 3)) "$keys" "$OUT/rls-envoy-$keys-$r.json" || log "rlsload against envoyproxy/ratelimit failed (see $OUT/rls-load.err)"
		done
	done

	if ensure_tool wrk wrk; then
		log "HTTP: one per-IP rule, scope local vs scope cluster (tokengate-rls), wrk -c $CONC, ${HTTP_SECS}s x $HTTP_ROUNDS rounds"
		[[ -x "$OUT/tokengate-local" ]] || $GO build -o "$OUT/tokengate-local" ./cmd/tokengate-local
		# The bootstrap of make cluster, pointed at this run's service, and
		# with its rule's rate raised out of the way; the local twin is the
		# same file without "scope": "cluster".
		sed -e "s/port_value: 8081 }/port_value: $RLS_PORT }/" -e 's/"rps": 2, "burst": 6/"rps": 1000000, "burst": 1000000/' \
			-e 's/"timeout_ms": 50/"timeout_ms": 1000/' examples/cluster/envoy.yaml >"$OUT/http-c.yaml"
		grep -v '"scope": "cluster"' "$OUT/http-c.yaml" >"$OUT/http-l.yaml"
		start_local_on() { # port flags...
			"$OUT/tokengate-local" -wasm build/tokengate.wasm -listen "127.0.0.1:$1" -admin '' -log-level error "${@:2}" \
				>"$OUT/local-$1.log" 2>&1 &
			pids+=($!)
			local i
			for i in $(seq 100); do
				grep -q 'listening on' "$OUT/local-$1.log" 2>/dev/null && return 0
				sleep 0.1
			done
			log "tokengate-local on port $1 did not start:"
			cat "$OUT/local-$1.log" >&2
			return 1
		}
		start_local_on "$HTTP_PORT_A" -envoy "$OUT/http-l.yaml"
		start_local_on "$HTTP_PORT_B" -envoy "$OUT/http-c.yaml"
		wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_A/" >/dev/null
		wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_B/" >/dev/null
		for r in $(seq "$HTTP_ROUNDS"); do
			wrk -t 2 -c "$CONC" -d "${HTTP_SECS}s" --latency "http://127.0.0.1:$HTTP_PORT_A/" >"$OUT/http-l-$r.txt"
			wrk -t 2 -c "$CONC" -d "${HTTP_SECS}s" --latency "http://127.0.0.1:$HTTP_PORT_B/" >"$OUT/http-c-$r.txt"
		done
	fi
	cleanup
	pids=()
fi

$GO run ./bench/report -dir "$OUT" | tee "$OUT/table.md"
