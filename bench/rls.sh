#!/usr/bin/env bash
# bench/rls.sh is row 8 of `make bench` (bench/run.sh calls it), and runs on
# its own too:
#
#   BENCH_OUT=build/bench-rls bench/rls.sh && go run ./bench/report -dir build/bench-rls
#
# tokengate-rls against envoyproxy/ratelimit on one Redis, driven by the
# same gRPC load generator (bench/cmd/rlsload), one hot key and 10,000 keys,
# interleaved round by round; then the latency a cluster-scope rule adds to
# a request through tokengate-local (wrk), beside the same rule with local
# scope. Needs redis-server (installed with apt-get when missing, as root),
# envoyproxy/ratelimit (tools/ratelimit.sh) and, for the HTTP rows, wrk.
# Everything listens on 127.0.0.1 and runs for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
OUT=${BENCH_OUT:-build/bench}
HTTP_SECS=${BENCH_HTTP_SECS:-10}
HTTP_ROUNDS=${BENCH_HTTP_ROUNDS:-3}
CONC=${BENCH_CONCURRENCY:-8}
HTTP_PORT_A=${BENCH_PORT_A:-18181}
HTTP_PORT_B=${BENCH_PORT_B:-18182}
HTTP_PORT_M=${BENCH_PORT_M:-18184}
if [[ -n "${BENCH_QUICK:-}" ]]; then
	HTTP_SECS=3 HTTP_ROUNDS=1
fi
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

RLS_SECS=${BENCH_RLS_SECS:-8}
RLS_ROUNDS=${BENCH_RLS_ROUNDS:-3}
RLS_CLIENTS=${BENCH_RLS_CLIENTS:-32}
if [[ -n "${BENCH_QUICK:-}" ]]; then
	RLS_SECS=3 RLS_ROUNDS=1
fi
# BENCH_RLS_PIN=1 gives the services CPU 1 and Redis with the load
# generator CPU 0 (taskset), so the service's own CPU, not the neighbours
# it shares two cores with, sets its decisions/s: the way it runs on a
# machine of its own. Off by default.
PIN_SVC=() PIN_LOAD=()
if [[ -n "${BENCH_RLS_PIN:-}" ]] && command -v taskset >/dev/null 2>&1 && [[ $(nproc) -ge 2 ]]; then
	PIN_SVC=(taskset -c 1) PIN_LOAD=(taskset -c 0)
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
	# -tags=vtprotobuf as the Makefile builds it (docs/rls.md#the-codec):
	# without the tag the service encodes its answers with proto.Marshal.
	$GO build -tags=vtprotobuf -o "$OUT/tokengate-rls" ./cmd/tokengate-rls
	$GO build -o "$OUT/rlsload" ./bench/cmd/rlsload
	"${PIN_LOAD[@]}" redis-server --port "$RLS_REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no >"$OUT/rls-redis.log" 2>&1 &
	pids+=($!)
	REDIS_PID=$!
	for i in $(seq 50); do
		redis-cli -p "$RLS_REDIS_PORT" ping >/dev/null 2>&1 && break
		sleep 0.1
	done
	# The same limit for both, never reached: the services decide, admit,
	# and write Redis on every request. (fleet-per-ip is for the HTTP rows.)
	cat >"$OUT/rls.json" <<-'EOF'
		{"rules":[{"name":"bench","scope":"cluster","limit_keys":["header:x-key"],"algorithm_config":{"rps":1000000,"burst":1000000}},
		  {"name":"fleet-per-ip","scope":"cluster","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}},
		  {"name":"fleet-lease","scope":"cluster","mode":"lease","limit_keys":["ip:address"],"algorithm_config":{"rps":1000000,"burst":1000000}}],
		 "settings":{"rls":{"cluster":"tokengate_rls"}}}
	EOF
	# Lease calls are writes: the lease round's proxy authenticates with a
	# credential made for this run (docs/rls.md#trust-model).
	RLS_CREDENTIAL=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
	printf '%s\n' "$RLS_CREDENTIAL" >"$OUT/rls-credential"
	"${PIN_SVC[@]}" "$OUT/tokengate-rls" -config "$OUT/rls.json" -redis "127.0.0.1:$RLS_REDIS_PORT" -listen "127.0.0.1:$RLS_PORT" \
		-admin "127.0.0.1:$((RLS_PORT + 1))" -credential-file "$OUT/rls-credential" >"$OUT/rls-tokengate.log" 2>&1 &
	pids+=($!)
	TG_PID=$!
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
		"${PIN_SVC[@]}" "$RL_BIN" >"$OUT/rls-envoy.log" 2>&1 &
	pids+=($!)
	EV_PID=$!
	# CPU per decision (-pid, -redis-pid) is steadier than decisions/s on a
	# shared machine.
	load() { # name port keys out pid [clients]
		"${PIN_LOAD[@]}" "$OUT/rlsload" -addr "127.0.0.1:$2" -name "$1" -keys "$3" -c "${6:-$RLS_CLIENTS}" -n 2000000 -d "${RLS_SECS}s" -warmup 1s \
			-pid "$5" -redis-pid "$REDIS_PID" >"$4" 2>>"$OUT/rls-load.err"
	}
	for i in $(seq 100); do
		"$OUT/rlsload" -addr "127.0.0.1:$RLS_PORT" -n 1 -warmup 0 >/dev/null 2>&1 &&
			"$OUT/rlsload" -addr "127.0.0.1:$((RLS_PORT + 3))" -n 1 -warmup 0 >/dev/null 2>&1 && break
		sleep 0.2
	done
	for r in $(seq "$RLS_ROUNDS"); do
		for keys in 1 10000; do
			load tokengate-rls "$RLS_PORT" "$keys" "$OUT/rls-tokengate-$keys-$r.json" "$TG_PID" || log "rlsload against tokengate-rls failed (see $OUT/rls-load.err)"
			load envoyproxy/ratelimit $((RLS_PORT + 3)) "$keys" "$OUT/rls-envoy-$keys-$r.json" "$EV_PID" || log "rlsload against envoyproxy/ratelimit failed (see $OUT/rls-load.err)"
		done
		# One client: the latency of one call with nothing queued.
		load tokengate-rls "$RLS_PORT" 10000 "$OUT/rls-tokengate-c1-$r.json" "$TG_PID" 1 || log "rlsload -c 1 against tokengate-rls failed"
		load envoyproxy/ratelimit $((RLS_PORT + 3)) 10000 "$OUT/rls-envoy-c1-$r.json" "$EV_PID" 1 || log "rlsload -c 1 against envoyproxy/ratelimit failed"
	done

	if ensure_tool wrk wrk; then
		log "HTTP: one per-IP rule, scope local vs scope cluster (tokengate-rls), wrk -c $CONC, ${HTTP_SECS}s x $HTTP_ROUNDS rounds"
		make build >/dev/null
		[[ -x "$OUT/tokengate-local" ]] || $GO build -o "$OUT/tokengate-local" ./cmd/tokengate-local
		# The bootstrap of make cluster, pointed at this run's service, and
		# with its rule's rate raised out of the way; the local twin is the
		# same file without "scope": "cluster".
		sed -e "s/port_value: 8081 }/port_value: $RLS_PORT }/" -e 's/"rps": 2, "burst": 6/"rps": 1000000, "burst": 1000000/' \
			-e 's/"timeout_ms": [0-9]*/"timeout_ms": 1000/' examples/cluster/envoy.yaml >"$OUT/http-c.yaml"
		grep -v '"scope": "cluster"' "$OUT/http-c.yaml" >"$OUT/http-l.yaml"
		# Lease mode (docs/lease.md): the same cluster rule admitting from
		# leased tokens. The service's request count before the round,
		# LEASE_COLD seconds in and after it gives the RLS calls for this
		# one hot key (every request has the same client IP): the cold
		# start (the bucket was released while idle between rounds) as a
		# count, the steady state as calls a second. A second run with a
		# quarter of the connections (a lower request rate) shows whether
		# the calls grow with the request rate.
		# The rule's limit is never reached, so with one proxy every
		# non-2xx is a wrong rejection (the bound, (N-1) x lease_max, is 0).
		# Its own rule name: the service has fleet-per-ip in exact mode.
		sed -e 's/"scope": "cluster",/"scope": "cluster", "mode": "lease",/' -e 's/"name": "fleet-per-ip"/"name": "fleet-lease"/' \
			-e "s/\"domain\": \"tokengate\",/\"domain\": \"tokengate\", \"credential\": \"$RLS_CREDENTIAL\",/" \
			"$OUT/http-c.yaml" >"$OUT/http-m.yaml"
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
		start_local_on "$HTTP_PORT_M" -envoy "$OUT/http-m.yaml"
		wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_A/" >/dev/null
		wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_B/" >/dev/null
		wrk -t 2 -c "$CONC" -d 1s "http://127.0.0.1:$HTTP_PORT_M/" >/dev/null
		rls_calls() { curl -fsS "http://127.0.0.1:$((RLS_PORT + 1))/metrics" | awk '/^tokengate_rls_requests_total/ {n += $2} END {print n + 0}'; }
		LEASE_COLD=${BENCH_LEASE_COLD:-0.5}
		lease_round() { # name connections seconds: writes $OUT/http-NAME.txt and .calls
			local before mid after
			before=$(rls_calls)
			(sleep "$LEASE_COLD" && rls_calls >"$OUT/http-$1.mid") &
			wrk -t 2 -c "$2" -d "${3}s" --latency "http://127.0.0.1:$HTTP_PORT_M/" >"$OUT/http-$1.txt"
			wait $!
			after=$(rls_calls)
			mid=$(cat "$OUT/http-$1.mid")
			# before mid after seconds cold-seconds connections
			echo "$before $mid $after $3 $LEASE_COLD $2" >"$OUT/http-$1.calls"
		}
		for r in $(seq "$HTTP_ROUNDS"); do
			wrk -t 2 -c "$CONC" -d "${HTTP_SECS}s" --latency "http://127.0.0.1:$HTTP_PORT_A/" >"$OUT/http-l-$r.txt"
			wrk -t 2 -c "$CONC" -d "${HTTP_SECS}s" --latency "http://127.0.0.1:$HTTP_PORT_B/" >"$OUT/http-c-$r.txt"
			lease_round "m-$r" "$CONC" "$HTTP_SECS"
			sleep 1.5 # idle past half the lease ttl: the allowance is released, the next round starts cold
			lease_round "mq-$r" $(((CONC + 3) / 4)) 3
		done
	fi
fi

