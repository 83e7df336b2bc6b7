#!/usr/bin/env bash
# Bounded load test of haia-trace-mcp over Streamable HTTP on loopback: for
# authentication off and on (HS256), starts the server on a generated Trace
# root and runs tools/loadtest against each tool, printing a table with the
# server's RSS before and after each run (from /proc/PID/status).
#
#   tools/loadtest.sh [DURATION=30s] [CLIENTS=32]   (TOOLS="list_operations check_before_pay" to choose)
set -euo pipefail

duration=${1:-30s}
clients=${2:-32}
tools=${TOOLS:-"list_operations check_before_pay list_operations"}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
server_pid=
stop_server() {
	if [[ -n $server_pid ]]; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
		server_pid=
	fi
}
trap 'stop_server; rm -rf "$work"' EXIT

(cd "$repo" && go build -o "$work/haia-trace-mcp" ./cmd/haia-trace-mcp && go build -o "$work/loadtest" ./tools/loadtest)

# A Trace root of 50 runs copied from the guard fixtures.
mkdir -p "$work/root/events"
for i in $(seq -w 1 50); do
	cp "$repo/testdata/guard/buyer-run.ndjson" "$work/root/events/run-$i.ndjson"
done
head -c 48 /dev/urandom | base64 | tr -d '\n' >"$work/secret"
issuer=http://127.0.0.1/loadtest-as

rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

start_server() { # $1 = off|on
	local args=(--dir "$work/root" --key-file "$work/signing.pem" --http 127.0.0.1:0 --rate-limit 1000000 --rate-burst 1000000) # one caller at full speed: measure the server, not the per-caller limit
	if [[ $1 == off ]]; then
		args+=(--http-insecure-no-auth)
	else
		args+=(--auth-issuer "$issuer" --auth-hmac-secret "$work/secret" --auth-scope trace:read --auth-tool-scope check_before_pay=trace:guard)
	fi
	"$work/haia-trace-mcp" "${args[@]}" 2>"$work/server-$1.log" &
	server_pid=$!
	addr=
	for _ in $(seq 1 200); do
		addr=$(sed -n 's/.*"msg":"serving MCP over Streamable HTTP".*"addr":"\([^"]*\)".*/\1/p' "$work/server-$1.log" | head -1)
		[[ -n $addr ]] && return 0
		sleep 0.05
	done
	cat "$work/server-$1.log" >&2
	echo "loadtest: the server did not start" >&2
	exit 1
}

printf '%-5s %-17s %9s %9s %9s %-22s %10s %10s\n' auth tool req/s p50 p99 errors rss_before rss_after
status=0
for mode in off on; do
	start_server "$mode"
	url="http://$addr/mcp"
	tokarg=()
	if [[ $mode == on ]]; then
		"$work/loadtest" mint-hs256 --secret-file "$work/secret" --issuer "$issuer" --audience "$url" \
			--scope "trace:read trace:guard" >"$work/token"
		tokarg=(--token-file "$work/token")
	fi
	for tool in $tools; do
		before=$(rss "$server_pid")
		if ! out=$("$work/loadtest" --url "$url" "${tokarg[@]}" --duration "$duration" --clients "$clients" --tool "$tool" --row); then
			status=1
		fi
		after=$(rss "$server_pid")
		read -r rps p50 p99 errs <<<"$out"
		printf '%-5s %-17s %9s %9s %9s %-22s %8skB %8skB\n' "$mode" "$tool" "$rps" "$p50" "$p99" "$errs" "$before" "$after"
	done
	stop_server
done
exit $status
