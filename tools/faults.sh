#!/usr/bin/env bash
# The fault table of docs/failures.md: what gRPC clients of tokengate-rls
# see while Redis is frozen (SIGSTOP), killed, busy (DEBUG SLEEP) or behind
# a connection that stops forwarding, standalone and on a 3-master Cluster
# (internal/service/rls TestFaultTable). Needs redis-server and redis-cli; takes
# about a minute; prints the Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENGATE_FAULT_TABLE=1 go test ./internal/service/rls -run '^TestFaultTable$' -count=1 -v -timeout 5m |
	sed -n 's/^[[:space:]]*\(|.*|\)[[:space:]]*$/\1/p'
