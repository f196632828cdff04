#!/usr/bin/env bash
# tools/cluster.sh is `make cluster`: a fleet on this machine whose proxies
# share one limit per client IP. It starts
#   - redis-server on 127.0.0.1:16379 (no persistence; installed with apt-get
#     when missing and running as root),
#   - tokengate-rls on 127.0.0.1:8081 (admin :8082) with
#     examples/cluster/cluster.json,
#   - three tokengate-local proxies on 127.0.0.1:10000, :10010 and :10020
#     (admin :10001, :10011, :10021) with examples/cluster/envoy.yaml, whose
#     rule "fleet-per-ip" has "scope": "cluster",
# prints how to drive them, and stops everything on Ctrl-C (or when a proxy
# exits). Logs go to $CLUSTER_DIR (build/cluster).
#
# Environment (the test e2e/cluster_script_test.go uses free ports):
#   CLUSTER_PORTS="10000 10010 10020"  proxy ports; each admin is port+1
#   CLUSTER_RLS_PORT=8081 CLUSTER_RLS_ADMIN_PORT=8082 CLUSTER_REDIS_PORT=16379
#   CLUSTER_DIR=build/cluster
#   LOCAL=build/tokengate-local RLS=build/tokengate-rls WASM=build/tokengate.wasm
#   MODE=exact   or MODE=lease: the same fleet with the rule in lease mode
#                (docs/lease.md): "mode": "lease", "lease_max": 2 are added
#                to the rule of both configurations
#   EXAMPLE=cluster  or EXAMPLE=ai-api: examples/ai-api/ai-api.json and
#                its envoy.yaml, an AI API's budgets per API key (tokens per
#                minute, tokens per month as a quota, requests in flight);
#                MODE=exact only (a quota is never leased)
#   UPSTREAM=URL the proxies' upstream (tokengate-local -upstream), e.g. an
#                OpenAI-compatible API; default: the local host's echo
set -euo pipefail
cd "$(dirname "$0")/.."

PORTS=(${CLUSTER_PORTS:-10000 10010 10020})
RLS_PORT=${CLUSTER_RLS_PORT:-8081}
RLS_ADMIN_PORT=${CLUSTER_RLS_ADMIN_PORT:-8082}
REDIS_PORT=${CLUSTER_REDIS_PORT:-16379}
DIR=${CLUSTER_DIR:-build/cluster}
LOCAL=${LOCAL:-build/tokengate-local}
RLS=${RLS:-build/tokengate-rls}
WASM=${WASM:-build/tokengate.wasm}
EXAMPLE=${EXAMPLE:-cluster}
MODE=${MODE:-exact}
rls_auth=()
upstream=()
[[ -n ${UPSTREAM:-} ]] && upstream=(-upstream "$UPSTREAM")

log() { printf 'make cluster: %s\n' "$*" >&2; }

if ! command -v redis-server >/dev/null 2>&1; then
	if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
		log 'installing redis-server (apt-get)'
		apt-get update -qq >/dev/null 2>&1 || true
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
	else
		log 'redis-server is not installed: apt-get install redis-server (as root), then run make cluster again'
		exit 1
	fi
fi

case $EXAMPLE in
cluster)
	CONFIG=examples/cluster/cluster.json
	ENVOY=examples/cluster/envoy.yaml
	;;
ai-api)
	CONFIG=examples/ai-api/ai-api.json
	ENVOY=examples/ai-api/envoy.yaml
	if [[ $MODE != exact ]]; then
		log "EXAMPLE=ai-api runs in MODE=exact only: its quota is counted in the service, never leased (docs/configuration.md)"
		exit 1
	fi
	;;
*)
	log "EXAMPLE must be cluster or ai-api, got $EXAMPLE"
	exit 1
	;;
esac

mkdir -p "$DIR"
case $MODE in
exact) ;;
lease)
	# The example's rule in lease mode, in both configurations.
	lease='"scope": "cluster", "mode": "lease", "lease_max": 2,'
	sed "s/\"scope\": \"cluster\",/$lease/" "$CONFIG" >"$DIR/cluster.json"
	sed "s/\"scope\": \"cluster\",/$lease/" "$ENVOY" >"$DIR/envoy-lease.yaml"
	CONFIG=$DIR/cluster.json
	ENVOY=$DIR/envoy-lease.yaml
	grep -q '"mode": "lease"' "$CONFIG" && grep -q '"mode": "lease"' "$ENVOY" ||
		{ log 'MODE=lease: could not put the rule in lease mode'; exit 1; }
	# Lease calls are writes: the proxies authenticate with a credential
	# made for this run (docs/rls.md#trust-model).
	credential=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
	printf '%s\n' "$credential" >"$DIR/credential"
	chmod 600 "$DIR/credential"
	sed -i "s/\"domain\": \"tokengate\",/\"domain\": \"tokengate\", \"credential\": \"$credential\",/" "$CONFIG" "$ENVOY"
	grep -q '"credential"' "$CONFIG" && grep -q '"credential"' "$ENVOY" ||
		{ log 'MODE=lease: could not add the credential'; exit 1; }
	rls_auth=(-credential-file "$DIR/credential")
	;;
*)
	log "MODE must be exact or lease, got $MODE"
	exit 1
	;;
esac
pids=()
stopping=
stop() {
	[[ -n $stopping ]] && return
	stopping=1
	log 'stopping'
	local p
	# Reverse order: the proxies, then the service, then Redis.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -TERM "${pids[i]}" 2>/dev/null || true
	done
	for p in "${pids[@]+"${pids[@]}"}"; do
		wait "$p" 2>/dev/null || true
	done
}
# Ctrl-C is how this ends: a clean exit, not make's "Error 130". The
# children run in sessions of their own (setsid), so the terminal's Ctrl-C
# reaches this script only: it stops them in order, and a proxy that the
# same Ctrl-C ended cannot look like a proxy that failed.
trap 'stop; exit 0' INT TERM
trap stop EXIT

# wait_http URL NAME LOG PID: until URL answers 200, at most 60 s.
wait_http() {
	local i
	for i in $(seq 600); do
		if curl -fsS -o /dev/null --max-time 1 "$1" 2>/dev/null; then
			return 0
		fi
		if ! kill -0 "$4" 2>/dev/null; then
			log "$2 exited; its log ($3):"
			cat "$3" >&2
			exit 1
		fi
		sleep 0.1
	done
	log "$2 not ready after 60 s; its log ($3):"
	cat "$3" >&2
	exit 1
}

setsid redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" \
	>"$DIR/redis.log" 2>&1 &
pids+=($!)
for i in $(seq 100); do
	redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
	if ! kill -0 "${pids[-1]}" 2>/dev/null; then
		log "redis-server exited ($DIR/redis.log):"
		cat "$DIR/redis.log" >&2
		exit 1
	fi
	sleep 0.1
done

setsid "$RLS" -config "$CONFIG" -redis "127.0.0.1:$REDIS_PORT" -listen "127.0.0.1:$RLS_PORT" -admin "127.0.0.1:$RLS_ADMIN_PORT" \
	"${rls_auth[@]+"${rls_auth[@]}"}" >"$DIR/tokengate-rls.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$RLS_ADMIN_PORT/ready" tokengate-rls "$DIR/tokengate-rls.log" "${pids[-1]}"

# The proxies read the service's address from the bootstrap's cluster;
# point it at $RLS_PORT when that is not the default.
bootstrap=$ENVOY
if [[ $RLS_PORT != 8081 ]]; then
	bootstrap=$DIR/envoy.yaml
	sed "s/port_value: 8081 }/port_value: $RLS_PORT }/" "$ENVOY" >"$bootstrap"
fi
for p in "${PORTS[@]}"; do
	setsid "$LOCAL" -wasm "$WASM" -envoy "$bootstrap" -listen "127.0.0.1:$p" -admin "127.0.0.1:$((p + 1))" -workers 2 \
		"${upstream[@]+"${upstream[@]}"}" >"$DIR/proxy-$p.log" 2>&1 &
	pids+=($!)
done
# Started together: each compiles the module when it starts.
for i in "${!PORTS[@]}"; do
	p=${PORTS[i]}
	wait_http "http://127.0.0.1:$((p + 1))/ready" "tokengate-local on :$p" "$DIR/proxy-$p.log" "${pids[i + 2]}"
done

if [[ $EXAMPLE == ai-api ]]; then
	cat <<-MSG
	An AI API on a fleet of ${#PORTS[@]} proxies (examples/ai-api), per API key (x-api-key):
	  ai-tokens-per-minute  6000 tokens a minute (a cluster token bucket, 100 a second)
	  ai-tokens-per-month   20000 tokens a calendar month (a quota; warnings at 80 % and 95 %)
	  ai-in-flight          2 requests in flight per proxy
	The body's max_tokens is reserved before the upstream runs, and the usage the
	response reports (usage.total_tokens) charged after it. The upstream is
	$( [[ -n ${UPSTREAM:-} ]] && printf '%s' "$UPSTREAM" || printf "the local host's echo, which reports no usage: each request costs its max_tokens\n\t(UPSTREAM=<url> to use an OpenAI-compatible API)" ).
	  proxies        $(for p in "${PORTS[@]}"; do printf 'http://127.0.0.1:%s  ' "$p"; done)
	  tokengate-rls  127.0.0.1:$RLS_PORT (gRPC), metrics http://127.0.0.1:$RLS_ADMIN_PORT/metrics
	  redis-server   127.0.0.1:$REDIS_PORT
	  logs           $DIR/
	Try, in another terminal (the minute's 6000 tokens pass as 4 requests of 1500, whichever proxy):
	  for i in \$(seq 2); do for p in ${PORTS[*]}; do curl -s -o /dev/null -w "\$p:%{http_code} " -H 'x-api-key: demo' -d '{"max_tokens":1500}' 127.0.0.1:\$p/v1/chat/completions; done; done; echo
	  curl -i -H 'x-api-key: demo' -d '{"max_tokens":10}' 127.0.0.1:${PORTS[0]}/v1/chat/completions
	  redis-cli -p $REDIS_PORT --scan --pattern '*demo*'
	  curl -s 127.0.0.1:$RLS_ADMIN_PORT/metrics | grep -e decisions -e quota
	  pids: redis-server ${pids[0]}, tokengate-rls ${pids[1]}, proxies ${pids[*]:2}
	Ctrl-C to stop everything.
	MSG
else
cat <<-MSG
	A fleet of ${#PORTS[@]} proxies sharing one limit per client IP (rule fleet-per-ip:
	bursts of 6, 2 a second, across all of them), decided by tokengate-rls on Redis
	in $MODE mode$( [[ $MODE == lease ]] && printf ' (each proxy admits from leased tokens; docs/lease.md)'):
	  proxies        $(for p in "${PORTS[@]}"; do printf 'http://127.0.0.1:%s  ' "$p"; done)
	  tokengate-rls  127.0.0.1:$RLS_PORT (gRPC), metrics http://127.0.0.1:$RLS_ADMIN_PORT/metrics
	  redis-server   127.0.0.1:$REDIS_PORT
	  logs           $DIR/
	Try, in another terminal (6 requests pass in all, whichever proxy they hit):
	  for i in \$(seq 4); do for p in ${PORTS[*]}; do curl -s -o /dev/null -w "\$p:%{http_code} " 127.0.0.1:\$p/; done; done; echo
	  curl -i 127.0.0.1:${PORTS[0]}/
	  redis-cli -p $REDIS_PORT --scan --pattern 't[bl]:*'
	  curl -s 127.0.0.1:$((PORTS[0] + 1))/stats | grep fleet_per_ip
	  curl -s 127.0.0.1:$RLS_ADMIN_PORT/metrics | grep decisions
	Stop tokengate-rls (kill the pid below) to see on_error "local": each proxy then limits on its own.
	  pids: redis-server ${pids[0]}, tokengate-rls ${pids[1]}, proxies ${pids[*]:2}
	Ctrl-C to stop everything.
MSG
fi

# Until Ctrl-C, or until a proxy exits (tokengate-rls and Redis may be
# stopped on purpose, to watch on_error).
set +e
wait -n "${pids[@]:2}"
log 'a proxy exited; stopping the others'
