#!/usr/bin/env bash
# Soak run of haia-trace-mcp over Streamable HTTP on loopback, with
# authentication (HS256): for DURATION (default 10m) four load generators
# call list_operations, get_receipt, explain and check_before_pay at once.
# It reports each tool's throughput, p50/p99 and errors, and the server's
# RSS and goroutine count (from /metrics) at the start and at the end.
# Bounded: it stops by itself, listens on 127.0.0.1 only, and cleans up.
#
#   tools/soak.sh [DURATION=10m] [CLIENTS_PER_TOOL=8]
set -euo pipefail

duration=${1:-10m}
clients=${2:-8}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
server_pid=
cleanup() {
	[[ -n $server_pid ]] && kill -TERM "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT

(cd "$repo" && go build -o "$work/haia-trace-mcp" ./cmd/haia-trace-mcp && go build -o "$work/loadtest" ./tools/loadtest)
mkdir -p "$work/root/events"
for i in $(seq -w 1 50); do
	cp "$repo/testdata/guard/buyer-run.ndjson" "$work/root/events/run-$i.ndjson"
done
head -c 48 /dev/urandom | base64 | tr -d '\n' >"$work/secret"
issuer=http://127.0.0.1/soak-as

"$work/haia-trace-mcp" --dir "$work/root" --key-file "$work/signing.pem" --http 127.0.0.1:0 --rate-limit 1000000 --rate-burst 1000000 --log-level info \
	--auth-issuer "$issuer" --auth-hmac-secret "$work/secret" --auth-scope trace:read \
	--auth-tool-scope check_before_pay=trace:guard 2>"$work/server.log" &
server_pid=$!
addr=
for _ in $(seq 1 200); do
	addr=$(sed -n 's/.*"addr":"\([^"]*\)".*/\1/p' "$work/server.log" | head -1)
	[[ -n $addr ]] && break
	sleep 0.05
done
[[ -n $addr ]] || { cat "$work/server.log" >&2; echo "soak: the server did not start" >&2; exit 1; }
url="http://$addr/mcp"
"$work/loadtest" mint-hs256 --secret-file "$work/secret" --issuer "$issuer" --audience "$url" \
	--scope "trace:read trace:guard" --ttl 2h >"$work/token"

gauge() { # $1 = metric name; reads the server's own /metrics
	curl -s "http://$addr/metrics" | awk -v m="$1" '$1 == m {print $2}'
}
report() { # $1 = label
	printf '%-6s rss=%s MB goroutines=%s\n' "$1" \
		"$(awk '/^VmRSS/ {printf "%.1f", $2/1024}' "/proc/$server_pid/status")" "$(gauge go_goroutines)"
}

echo "soak: $duration, $clients clients per tool, server $url (pid $server_pid)"
report start
declare -A args=(
	[list_operations]='{"limit":50}'
	[get_receipt]='{"run_id":"run-07","operation_id":"op-1"}'
	[explain]='{"run_id":"run-23","operation_id":"op-2"}'
	[check_before_pay]='{"counterparty":"0x209693bc6afc0c5328ba36faf03c514ef312287c","amount":"0.05"}'
)
pids=()
for tool in "${!args[@]}"; do
	"$work/loadtest" --url "$url" --token-file "$work/token" --duration "$duration" --clients "$clients" \
		--tool "$tool" --args "${args[$tool]}" --row >"$work/$tool.row" 2>"$work/$tool.err" &
	pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
report end
printf '%-17s %9s %9s %9s %s\n' tool req/s p50 p99 errors
for tool in "${!args[@]}"; do
	read -r rps p50 p99 errs <"$work/$tool.row" || true
	printf '%-17s %9s %9s %9s %s\n' "$tool" "$rps" "$p50" "$p99" "$errs"
	[[ -s $work/$tool.err ]] && sed 's/^/  /' "$work/$tool.err"
done
exit $status
