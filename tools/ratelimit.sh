#!/usr/bin/env bash
# tools/ratelimit.sh installs envoyproxy/ratelimit, the reference RLS v3
# server, into build/tools (once per version) and prints the binary's path.
# The e2e tests (e2e/rls*_test.go, through internal/testsupport/envoyrl), bench/run.sh and
# `make ratelimit` all call this script, so the version is pinned here only.
#
# envoyproxy/ratelimit has no release tags on the Go module proxy newer than
# v1.4.0 (2020); `go list -m github.com/envoyproxy/ratelimit@latest` gives the
# newest commit as a pseudo-version, and that is what we pin.
set -euo pipefail
RATELIMIT_VERSION=v1.4.1-0.20260122083618-3fb702589d36

root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build/tools
bin=$dir/ratelimit-$RATELIMIT_VERSION
if [[ ! -x $bin ]]; then
	mkdir -p "$dir"
	tmp=$(mktemp -d "$dir/.install.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	echo "tools/ratelimit.sh: go install github.com/envoyproxy/ratelimit/src/service_cmd@$RATELIMIT_VERSION into $bin (the first build takes a minute or two)" >&2
	# From $tmp, outside our module: go install pkg@version builds with the
	# peer's own go.mod, none of our dependencies.
	(cd "$tmp" && GOBIN="$tmp" GOFLAGS=-buildvcs=false "${GO:-go}" install "github.com/envoyproxy/ratelimit/src/service_cmd@$RATELIMIT_VERSION") >&2
	mv "$tmp/service_cmd" "$bin"
fi
echo "$bin"
