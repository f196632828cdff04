#!/usr/bin/env bash
# bench/dropin.sh: decisions/s of envoyproxy/ratelimit against tokengate-rls
# started as /bin/ratelimit would be (docs/dropin.md), in both of its
# modes (token buckets, TOKENGATE_ALGORITHM=fixed_window), on the same YAML
# and environment and the same Redis, driven by bench/cmd/rlsload with one
# hot key and 10,000 keys, interleaved round by round. Every process listens
# on 127.0.0.1 and the run is bounded (rounds × 2 key sets × 3 services ×
# BENCH_DROPIN_SECS). The JSON lines land in $BENCH_OUT (build/bench-dropin).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
OUT=${BENCH_OUT:-build/bench-dropin}
SECS=${BENCH_DROPIN_SECS:-6}
ROUNDS=${BENCH_DROPIN_ROUNDS:-2}
BASE=${BENCH_DROPIN_PORT:-18480}
rm -rf "$OUT" && mkdir -p "$OUT/rt/ratelimit/config"
OUT=$(cd "$OUT" && pwd)
command -v redis-server >/dev/null || { echo "bench/dropin.sh: redis-server is missing" >&2; exit 1; }
$GO build -tags=vtprotobuf -o "$OUT/ratelimit" ./cmd/tokengate-rls # the name selects the drop-in; the tag as the Makefile builds it
$GO build -o "$OUT/rlsload" ./bench/cmd/rlsload
RL_BIN=$(tools/ratelimit.sh)
pids=()
trap 'for p in "${pids[@]+"${pids[@]}"}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done' EXIT
redis-server --port "$BASE" --bind 127.0.0.1 --save '' --appendonly no >"$OUT/redis.log" 2>&1 &
pids+=($!)
REDIS_PID=$!
cat >"$OUT/rt/ratelimit/config/bench.yaml" <<'Y'
domain: tokengate
descriptors:
  - key: tokengate_rule
    value: bench
    descriptors:
      - key: key
        rate_limit: {unit: second, requests_per_unit: 1000000}
Y
# The same environment for all three; REDIS_TIMEOUT unset (each service's
# default: 10 s there, 25 ms here).
common=(PATH="$PATH" HOST=127.0.0.1 GRPC_HOST=127.0.0.1 DEBUG_HOST=127.0.0.1 USE_STATSD=false LOG_LEVEL=warn
	REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$BASE" RUNTIME_ROOT="$OUT/rt" RUNTIME_SUBDIRECTORY=ratelimit RUNTIME_WATCH_ROOT=false)
start() { # name port-offset extra-env...
	local name=$1 off=$2
	shift 2
	env -i "${common[@]}" PORT=$((BASE + off)) GRPC_PORT=$((BASE + off + 1)) DEBUG_PORT=$((BASE + off + 2)) "$@" >"$OUT/$name.log" 2>&1 &
	pids+=($!)
}
start envoyproxy-ratelimit 10 "$RL_BIN"
EV=$!
start token-bucket 20 "$OUT/ratelimit"
TB=$!
start fixed-window 30 TOKENGATE_ALGORITHM=fixed_window "$OUT/ratelimit"
FW=$!
for p in $((BASE + 11)) $((BASE + 21)) $((BASE + 31)); do
	for _ in $(seq 100); do
		"$OUT/rlsload" -addr "127.0.0.1:$p" -n 1 -warmup 0 >/dev/null 2>&1 && break
		sleep 0.2
	done
done
for r in $(seq "$ROUNDS"); do
	for keys in 1 10000; do
		for s in "envoyproxy/ratelimit $((BASE + 11)) $EV" "tokengate-rls/token-bucket $((BASE + 21)) $TB" "tokengate-rls/fixed-window $((BASE + 31)) $FW"; do
			set -- $s
			"$OUT/rlsload" -addr "127.0.0.1:$2" -name "$1" -keys "$keys" -c 32 -n 2000000 -d "${SECS}s" -warmup 1s \
				-pid "$3" -redis-pid "$REDIS_PID" 2>>"$OUT/load.err"
		done
	done
done | tee "$OUT/results.jsonl"
