#!/usr/bin/env bash
# Runs the official MCP conformance suite (npm @modelcontextprotocol/conformance)
# against haia-trace-mcp serving Streamable HTTP without authentication on a
# free loopback port. Needs a Node 22 `node`/`npx` on PATH (tools/ci-node.sh
# provides one). Exits non-zero when a scenario fails.
#
#   tools/conformance.sh [path/to/haia-trace-mcp]
set -euo pipefail

CONFORMANCE_VERSION=0.1.16
SCENARIOS=(server-initialize ping tools-list logging-set-level dns-rebinding-protection)

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${HAIA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/haia-trace-mcp}
suite="$cache/conformance-$CONFORMANCE_VERSION"
work=$(mktemp -d)
server_pid=
cleanup() {
	if [[ -n $server_pid ]]; then kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
	rm -rf "$work"
}
trap cleanup EXIT

major=$(node -p 'process.versions.node.split(".")[0]')
if [[ $major -lt 22 ]]; then
	echo "conformance: node $(node --version) is too old; put Node 22 first on PATH (tools/ci-node.sh does)" >&2
	exit 1
fi

if [[ ! -x $suite/node_modules/.bin/conformance ]]; then
	mkdir -p "$suite"
	(cd "$suite" && printf '{"name":"haia-conformance","private":true}\n' >package.json &&
		npm install --no-audit --no-fund --save-exact "@modelcontextprotocol/conformance@$CONFORMANCE_VERSION" >&2)
fi

bin=${1:-}
if [[ -z $bin ]]; then
	bin="$work/haia-trace-mcp"
	(cd "$repo" && go build -o "$bin" ./cmd/haia-trace-mcp)
fi

mkdir -p "$work/root/events"
"$bin" --dir "$work/root" --key-file "$work/signing.pem" --http 127.0.0.1:0 --http-insecure-no-auth 2>"$work/server.log" &
server_pid=$!
addr=
for _ in $(seq 1 200); do
	addr=$(sed -n 's/.*"msg":"serving MCP over Streamable HTTP".*"addr":"\([^"]*\)".*/\1/p' "$work/server.log" | head -1)
	[[ -n $addr ]] && break
	if ! kill -0 "$server_pid" 2>/dev/null; then cat "$work/server.log" >&2; echo "conformance: server exited" >&2; exit 1; fi
	sleep 0.05
done
if [[ -z $addr ]]; then cat "$work/server.log" >&2; echo "conformance: server did not start" >&2; exit 1; fi
url="http://$addr/mcp"
echo "conformance: server at $url"

failed=()
for s in "${SCENARIOS[@]}"; do
	echo "== $s"
	if ! "$suite/node_modules/.bin/conformance" server --url "$url" --scenario "$s" -o "$work/results"; then
		failed+=("$s")
	fi
done
if ((${#failed[@]})); then
	echo "conformance: FAILED: ${failed[*]}" >&2
	echo "--- server log" >&2
	tail -50 "$work/server.log" >&2
	exit 1
fi
echo "conformance: all ${#SCENARIOS[@]} scenarios passed"
