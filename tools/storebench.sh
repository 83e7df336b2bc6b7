#!/usr/bin/env bash
# check_before_pay by store: 16 concurrent callers (each its own token
# subject, so its own caller: its own reviews and idempotency keys) asking a mix of
# questions that are allowed and questions that go to review, against
#   1. the file store, one server;
#   2. PostgreSQL with 1, 2 and 3 replicas (server processes on this machine
#      sharing the Trace root, the signing key and the database; the callers
#      spread evenly over them).
# Each configuration starts from an empty store. After each run every
# decision chain is exported and verified with the store's keyring (VALID
# expected). Prints a line a row: build, round, store, shape, replicas,
# req/s, p50, p99, the CPU seconds the servers and PostgreSQL's backends
# spent per 1000 answers, statements and round trips per answer (and of
# those round trips, the ones that only prepared statements), the load
# average, errors, answers, chains and reviews; then the summary. Exits 1
# when any row is not exact (an error, a chain not VALID, a review check
# that fails).
#
#   HAIA_BENCH_POSTGRES=postgres://user:pw@127.0.0.1:5432/db tools/storebench.sh [DURATION=20s]
#
# Shapes (SHAPES, default "distinct shared"): distinct gives each caller a
# counterparty pair of its own (one payee it is allowed to pay, one that
# goes to review), so no two callers' questions bear on each other; shared
# gives every caller the same pair. HAIA_BENCH_BIN runs a haia-trace-mcp
# binary built elsewhere (another version, side by side) instead of
# building this checkout's; LABEL names it in the table. MIXED_BIN runs
# every second replica from that binary instead (a rolling upgrade: old
# and new replicas on one database at once).
#
# Side by side in one run: ROUNDS (default 3) repeats every row, and
# BUILDS="label=/path/to/haia-trace-mcp label2=/other/build" runs each row
# with every build in turn within a round (A B A B …), so the builds and
# the rows share the machine's load alike; the summary at the end gives,
# per build and row, the median over the rounds and the spread (min–max),
# and per build and replica count the distinct / shared ratio of req/s.
# The servers reach PostgreSQL through tools/pgcount, a loopback proxy
# that counts the statements and round trips every build sends (columns
# stmt and rt: per answer; prep: the round trips among rt that executed
# nothing, a connection preparing statements it had not run yet). The
# load average is sampled after each row.
#
# HAIA_BENCH_POSTGRES is any database the role can connect to; the role must
# be allowed to CREATE DATABASE: the benchmark drops and creates its own
# database (HAIA_BENCH_DB, default haia_bench) for each PostgreSQL row.
# Without HAIA_BENCH_POSTGRES only the file row runs. CLIENTS (default 16)
# and REPLICAS (default "1 2 3") override the shape. TENANTS=1 adds the
# tenants' rows: tenant b's CALM callers (default 4) alone and while tenant
# a's CLIENTS flood one server, each tenant in a database of its own.
set -euo pipefail

duration=${1:-20s}
clients=${CLIENTS:-16}
replica_counts=${REPLICAS:-"1 2 3"}
shapes=${SHAPES:-"distinct shared"}
label=${LABEL:-this}
rounds=${ROUNDS:-3}
pg_admin=${HAIA_BENCH_POSTGRES:-}
bench_db=${HAIA_BENCH_DB:-haia_bench}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
export HAIA_CONFIG_DIR="$work/config" # no reviewers file or keys of the user's are read
export PGOPTIONS="-c client_min_messages=warning"
mkdir -p "$HAIA_CONFIG_DIR"

pids=()
stop_servers() {
	local pid
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	pids=()
}
trap 'stop_servers; rm -rf "$work"' EXIT

if [[ ! $duration =~ ^[0-9]+(ms|s|m)$ ]]; then
	echo "storebench: DURATION must look like 20s (got $duration)" >&2
	exit 2
fi
if [[ -n $pg_admin && ! $pg_admin =~ ^postgres(ql)?:// ]]; then
	echo "storebench: HAIA_BENCH_POSTGRES must be a postgres:// URL" >&2
	exit 2
fi
if [[ ! $rounds =~ ^[1-9][0-9]*$ ]]; then
	echo "storebench: ROUNDS must be a positive number (got $rounds)" >&2
	exit 2
fi
if [[ ! $bench_db =~ ^[a-z_][a-z0-9_]*$ ]]; then
	echo "storebench: HAIA_BENCH_DB must be a plain lower-case identifier (got $bench_db)" >&2
	exit 2
fi
for tool in jq psql; do
	if ! command -v "$tool" >/dev/null; then
		[[ $tool == psql && -z $pg_admin ]] && continue
		echo "storebench: $tool is needed" >&2
		exit 2
	fi
done

for shape in $shapes; do
	if [[ $shape != distinct && $shape != shared ]]; then
		echo "storebench: SHAPES holds distinct and/or shared (got $shape)" >&2
		exit 2
	fi
done
(cd "$repo" && go build -o "$work/loadtest" ./tools/loadtest && go build -o "$work/pgcount" ./tools/pgcount)
# builds: "label=binary" pairs, each row run with each in turn.
builds=()
if [[ -n ${BUILDS:-} ]]; then
	for b in $BUILDS; do
		if [[ $b != *=* || ! -x ${b#*=} ]]; then
			echo "storebench: BUILDS holds label=/path/to/binary pairs (got $b, or it is not executable)" >&2
			exit 2
		fi
		builds+=("$b")
	done
elif [[ -n ${HAIA_BENCH_BIN:-} ]]; then
	builds=("$label=$HAIA_BENCH_BIN")
else
	(cd "$repo" && go build -o "$work/haia-trace-mcp" ./cmd/haia-trace-mcp)
	builds=("$label=$work/haia-trace-mcp")
fi
bin=${builds[0]#*=} # the binary of the row being run (set by each row)

# The Trace root: 50 runs, each with settled payments to the clean payees
# and a payment to each open payee that was submitted and never answered
# (an open partial operation: the guard sends such a counterparty to
# review). The questions: each payee once, half allow, half review.
clean=() open=()
for i in $(seq 1 "$clients"); do
	clean+=("$(printf '0xC1EA%036x' "$i")")
	open+=("$(printf '0x09E0%036x' "$i")")
done
asset=0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913
event() { # run op seq type payee [settle]
	local where
	if [[ $4 == x402.payment.required ]]; then
		where="\"accepts\":[{\"scheme\":\"exact\",\"network\":\"base\",\"asset\":\"$asset\",\"amount\":\"10000\",\"pay_to\":\"$5\",\"max_timeout_seconds\":300}]"
	else
		where="\"requirements\":{\"scheme\":\"exact\",\"network\":\"base\",\"asset\":\"$asset\",\"amount\":\"10000\",\"pay_to\":\"$5\",\"max_timeout_seconds\":300}${6:-}"
	fi
	printf '{"event_id":"%s-%d","event_type":"%s","occurred_at":"2026-07-25T%02d:%02d:%02d.000Z","seq":%d,"adapter":"trace-x402","role":"client","context_id":"%s","payload":{"x402_version":2,"resource":{"url":"https://api.example.com/%s/%s","description":"d","mime_type":"application/json"},%s}}\n' \
		"$2" "$3" "$4" $((8 + $1 % 12)) $(($3 / 60)) $(($3 % 60)) "$3" "$2" "$1" "$2" "$where"
}
settled=',"settle":{"success":true,"transaction":"0xabababababababababababababababababababababababababababababababab","network":"base","payer":"0x1199C34AF7B1d56A1348E1F0D8E86b6C425ac2c0"}'
mkdir -p "$work/events"
for r in $(seq 1 50); do
	seq=0 op=0
	{
		for p in "${clean[@]}" "${open[@]}"; do
			op=$((op + 1))
			for t in required creating submitted; do
				event "$r" "op-$op" "$seq" "x402.payment.$t" "$p"
				seq=$((seq + 1))
			done
			if [[ $p == 0xC1EA* ]]; then
				event "$r" "op-$op" "$seq" x402.payment.responded "$p" "$settled"
				seq=$((seq + 1))
			fi
		done
	} >"$work/events/run-$(printf %02d "$r").ndjson"
done
# Each caller asks of its pair in turn: client i of pair i (distinct), or
# every client of pair 0 (shared).
for i in "${!clean[@]}"; do
	printf '{"counterparty":"%s","amount":"0.01"}\n{"counterparty":"%s","amount":"0.01"}\n' "${clean[i]}" "${open[i]}"
done >"$work/questions-distinct.ndjson"
head -2 "$work/questions-distinct.ndjson" >"$work/questions-shared.ndjson"

# Authentication with HS256 tokens, one subject a client: the caller is the
# token's subject, so the 16 callers are distinct (each its own reviews and
# idempotency keys), as 16 agents would be.
head -c 48 /dev/urandom | base64 | tr -d '\n' >"$work/secret"
issuer=http://127.0.0.1/storebench-as

addr=
start_server() { # root store log [binary]; sets addr (not in a subshell: the server stays this shell's child)
	local args=(--dir "$1")
	[[ -n $2 ]] && args+=(--store "$2")
	serve "$3" "${4:-$bin}" "${args[@]}"
}

serve() { # log binary args...; sets addr
	local log=$1 b=$2
	shift 2
	local args=("$@" --key-file "$work/signing.pem" --http 127.0.0.1:0 --rate-limit 1000000 --rate-burst 1000000
		--auth-issuer "$issuer" --auth-hmac-secret "$work/secret" --auth-scope trace:read --auth-tool-scope check_before_pay=trace:guard)
	"$b" "${args[@]}" >/dev/null 2>"$log" &
	pids+=($!)
	addr=
	for _ in $(seq 1 200); do
		addr=$(sed -n 's/.*"msg":"serving MCP over Streamable HTTP".*"addr":"\([^"]*\)".*/\1/p' "$log" | head -1)
		[[ -n $addr ]] && return 0
		sleep 0.05
	done
	cat "$log" >&2
	echo "storebench: the server did not start (log above)" >&2
	return 1
}

# verify_chains: every segment of every chain exported as a
# NOA array and verified with the keyring; prints "N VALID" or the failures.
verify_chains() { # keyring store
	local keyring=$1 store=$2 out=$work/chains verdict bad=0 n=0 receipts=0 id count f
	rm -rf "$out"
	mkdir -p "$out"
	local sargs=()
	[[ -n $store ]] && sargs=(--store "$store")
	"$bin" chain list "${sargs[@]}" --dir "$root" >"$out/list" || { echo "chain list failed"; return 1; }
	while IFS=$'\t' read -r id _ count _; do
		[[ -n $id ]] || continue
		n=$((n + 1))
		receipts=$((receipts + count))
		mkdir -p "$out/$id"
		"$bin" chain export "$id" --all --out "$out/$id" "${sargs[@]}" --dir "$root" >/dev/null || { echo "chain export $id failed"; return 1; }
		for f in "$out/$id"/*.json; do
			verdict=$("$bin" verify "$f" "$keyring" 2>>"$work/verify.log") || true
			if [[ $verdict != VALID* ]]; then
				bad=$((bad + 1))
				echo "storebench: chain $id segment $(basename "$f"): $verdict" >&2
			fi
		done
	done <"$out/list"
	if ((n == 0)); then
		echo "no chains"
		return 1
	fi
	if ((bad > 0)); then
		echo "$bad/$n NOT VALID ($receipts receipts)"
		return 1
	fi
	echo "$n VALID ($receipts receipts)"
}

status=0
# cpu_ticks: "pid:ticks" for each process, its user+system CPU so far.
cpu_ticks() {
	local pid f
	for pid in "$@"; do
		[[ -r /proc/$pid/stat ]] || continue
		read -ra f <"/proc/$pid/stat" || continue
		echo "$pid:$((f[13] + f[14]))"
	done
}

# cpu_used: the ticks the processes of after ("pid:ticks" lines) used
# since before (a process not in before counts from zero).
cpu_used() { # before after
	awk -F: 'NR == FNR { t[$1] = $2; next } { sum += $2 - ($1 in t ? t[$1] : 0) } END { print sum + 0 }' <(echo "$1") <(echo "$2")
}

pg_backends() {
	[[ -n $pg_admin ]] || return 0
	psql "$pg_admin" -AtX -c "SELECT pid FROM pg_stat_activity WHERE datname = '$bench_db'"
}

# review_check: the reviews (--slurpfile rv: review list --json) against
# what the load generator was answered ($run: its --json report); prints
# "OK <reviews by rules>" or "BAD <what is wrong>".
read -r -d '' review_check <<'JQ' || true
	def pair($c; $cp): "\($c) \($cp | ascii_downcase)";
	($run.questions | map(select(.decisions.review > 0) | pair(.client; .args | fromjson | .counterparty)) | unique) as $must
	| ($run.questions | map(select(.cut > 0 and (.decisions.review // 0) == 0) | pair(.client; .args | fromjson | .counterparty)) | unique) as $may
	| ($rv[0].reviews | map((first(.caller // "" | match("bench-agent-([0-9]+)").captures[0].string | tonumber) // "of no bench caller \(.caller)") as $c | pair($c; .counterparty))) as $got
	| ($got | group_by(.) | map(select(length > 1) | "\(length) reviews of caller/payee \(.[0])")) as $twice
	| ($must - $got | map("no review of caller/payee \(.) (answered review)")) as $missing
	| ($got - $must - $may | map("a review of caller/payee \(.) (never answered review)")) as $extra
	| ($twice + $missing + $extra) as $bad
	| if ($bad | length) > 0 then "BAD " + ($bad | .[:5] | join("; ")) + (if ($bad | length) > 5 then "; …" else "" end)
	  else "OK " + ($rv[0].reviews | map([.reasons[]?.rule] | unique | join("+")) | group_by(.) | map("\(.[0]):\(length)") | join(",")) end
JQ

run_row() { # store-name shape replicas store-url round
	local name=$1 shape=$2 replicas=$3 store=$4 round=$5 urls=() i serve_store=$4
	root=$work/root-$name-$shape-$replicas
	rm -rf "$root"
	mkdir -p "$root"
	cp -r "$work/events" "$root/events"
	# The servers reach the database through the counting proxy.
	[[ -n $store ]] && serve_store=$(proxied "$store")
	for i in $(seq 1 "$replicas"); do
		local b=$bin
		[[ -n ${MIXED_BIN:-} && $((i % 2)) == 0 ]] && b=$MIXED_BIN
		start_server "$root" "$serve_store" "$work/server-$name-$shape-$replicas-$i.log" "$b" || exit 1
		urls+=("http://$addr/mcp")
	done
	local tokens=()
	for i in $(seq 0 $((clients - 1))); do
		"$work/loadtest" mint-hs256 --secret-file "$work/secret" --issuer "$issuer" --audience "${urls[i % replicas]}" \
			--scope "trace:read trace:guard" --sub "$(printf 'bench-agent-%02d' "$i")" >"$work/token-$i"
		tokens+=("$work/token-$i")
	done
	local json pg_pids=() cpu0 pgcpu0 cpu1 pgcpu1 ticks wire0=(0 0 0) wire1=(0 0 0)
	ticks=$(getconf CLK_TCK)
	[[ -n $store ]] && mapfile -t pg_pids < <(pg_backends)
	cpu0=$(cpu_ticks "${pids[@]}")
	pgcpu0=$(cpu_ticks "${pg_pids[@]}")
	[[ -n $store ]] && read -ra wire0 < <(wire_counts)
	json=$("$work/loadtest" --url "$(IFS=,; echo "${urls[*]}")" --token-file "$(IFS=,; echo "${tokens[*]}")" \
		--duration "$duration" --clients "$clients" --tool check_before_pay --args-file "$work/questions-$shape.ndjson" --args-per-client 2 --json) || status=1
	[[ -n $store ]] && mapfile -t pg_pids < <(pg_backends)
	cpu1=$(cpu_ticks "${pids[@]}")
	pgcpu1=$(cpu_ticks "${pg_pids[@]}")
	[[ -n $store ]] && read -ra wire1 < <(wire_counts)
	stop_servers
	local keyring=$root/guard/keyring.json chains
	if [[ -n $store ]]; then
		rm -rf "$work/export-$shape-$replicas"
		"$bin" store export --store "$store" --dir "$work/export-$shape-$replicas" >/dev/null
		keyring=$work/export-$shape-$replicas/guard/keyring.json
	fi
	chains=$(verify_chains "$keyring" "$store") || status=1
	# Idempotency: a caller's identical question opens one review, however
	# often it is asked and of whichever replica. Which questions went to
	# review is what the load generator was answered, per caller and
	# question: the payee with an open payment from the first call, and a
	# payee allowed until then once a rule says so (in the shared shape
	# the per-counterparty limit, after 500 allows of 0.01 in all). So:
	# every (caller, payee) answered "review" has exactly one review, and
	# no other has any — but one whose only call the end of the run cut
	# short may have one.
	local reviews sargs=() verdict
	[[ -n $store ]] && sargs=(--store "$store")
	"$bin" review list --all --json "${sargs[@]}" --dir "$root" >"$work/reviews.json"
	reviews=$(jq '.reviews | length' "$work/reviews.json")
	verdict=$(jq -nr --slurpfile rv "$work/reviews.json" --argjson run "$json" "$review_check")
	if [[ $verdict == BAD* ]]; then
		echo "storebench: $name $shape with $replicas replica(s): ${verdict#BAD }" >&2
		status=1
		reviews="$reviews!"
	else
		reviews="$reviews ${verdict#OK }"
	fi
	local rps p50 p99 errs answers requests srv pg stmt=- rt=- prep=- load ok=true
	rps=$(jq -r '.rps | floor' <<<"$json")
	requests=$(jq -r '.requests' <<<"$json")
	srv=$(jq -nr --argjson u "$(cpu_used "$cpu0" "$cpu1")" --argjson t "$ticks" --argjson n "$requests" '$u / $t / ($n / 1000) | . * 100 | round / 100')
	pg=-
	if [[ -n $store ]]; then
		pg=$(jq -nr --argjson u "$(cpu_used "$pgcpu0" "$pgcpu1")" --argjson t "$ticks" --argjson n "$requests" '$u / $t / ($n / 1000) | . * 100 | round / 100')
		stmt=$(jq -nr --argjson d "$((wire1[0] - wire0[0]))" --argjson n "$requests" 'if $n > 0 then $d / $n | . * 10 | round / 10 else "-" end')
		rt=$(jq -nr --argjson d "$((wire1[1] - wire0[1]))" --argjson n "$requests" 'if $n > 0 then $d / $n | . * 10 | round / 10 else "-" end')
		prep=$(jq -nr --argjson d "$((wire1[2] - wire0[2]))" --argjson n "$requests" 'if $n > 0 then $d / $n | . * 100 | round / 100 else "-" end')
	fi
	read -r load _ </proc/loadavg
	p50=$(jq -r '.p50_ns / 1e6 | . * 100 | round / 100' <<<"$json")
	p99=$(jq -r '.p99_ns / 1e6 | . * 100 | round / 100' <<<"$json")
	errs=$(jq -r '.errors | to_entries | map("\(.key)=\(.value)") | join(",") | if . == "" then "0" else . end' <<<"$json")
	answers=$(jq -r '.decisions | to_entries | map("\(.key)=\(.value)") | join(",")' <<<"$json")
	[[ $errs == 0 ]] || { status=1; ok=false; }
	[[ $verdict == BAD* || $chains == *"NOT VALID"* || $chains != *VALID* ]] && ok=false
	printf '%-8s %5s %-8s %-8s %8s %7s %7s %7s %6s %5s %5s %5s %5s %5s %-8s %-24s %-7s  %s\n' "$label" "$round" "$name" "$shape" "$replicas" "$rps" "$p50" "$p99" "$srv" "$pg" "$stmt" "$rt" "$prep" "$load" "$errs" "$answers" "$chains" "$reviews"
	jq -nc --arg build "$label" --arg store "$name" --arg shape "$shape" --argjson replicas "$replicas" --argjson round "$round" \
		--argjson rps "$(jq -r '.rps' <<<"$json")" --argjson p50 "$p50" --argjson p99 "$p99" --arg srv "$srv" --arg pg "$pg" \
		--arg stmt "$stmt" --arg rt "$rt" --arg prep "$prep" --argjson load "$load" --argjson ok "$ok" \
		'{$build, $store, $shape, $replicas, $round, $rps, $p50, $p99, srv: ($srv | tonumber? // null), pg: ($pg | tonumber? // null),
		  stmt: ($stmt | tonumber? // null), rt: ($rt | tonumber? // null), prep: ($prep | tonumber? // null), $load, $ok}' >>"$work/results.ndjson"
}

# proxied: the URL with its host and port replaced by the counting proxy's.
proxied() {
	local url=$1 rest
	rest=${url#*://}
	local userinfo=
	[[ $rest == *@* ]] && userinfo="${rest%%@*}@"
	rest=${rest#*@}
	echo "${url%%://*}://$userinfo$pg_proxy/${rest#*/}"
}

# wire_counts: "statements round_trips prepares" the counting proxy saw so
# far (prepares: 0 from a proxy that does not count them).
wire_counts() {
	curl -sf "$pg_counts" | awk '{ print $2, $4, ($8 == "" ? 0 : $8) }'
}

# tenant_rows (TENANTS=1): one server with --tenants-dir, tenants a and b
# each in a database of its own ({tenant}); tenant b's calm callers
# (CALM, default 4) alone, then while tenant a's callers (CLIENTS) flood,
# side by side: b's req/s, p50 and p99 in both, a's flood beside them, and
# the server's CPU per 1000 answers. FAIR (default "off on") runs it with
# the tenants' fair share off (--tenant-fair-share=false) and on (the
# defaults); slots=N,max=N runs it on with --tenant-slots and
# --tenant-max-in-flight; none passes no flag, for a binary without them.
tenant_rows() {
	local calm=${CALM:-4} tdir=$work/tenants t i fair
	echo
	echo "tenants on one PostgreSQL server, a database each: tenant b ($calm callers) alone, then while tenant a ($clients callers) floods"
	echo "srv: the server's CPU seconds per 1000 answers of the row (while a floods: per 1000 answers of both tenants)"
	printf '%-6s %-34s %7s %7s %7s %6s %s\n' fair row 'req/s' 'p50 ms' 'p99 ms' srv errors
	for fair in ${FAIR:-off on}; do
		tenant_fair_rows "$fair"
	done
}

tenant_fair_rows() { # off|on|none
	local fair=$1 calm=${CALM:-4} tdir=$work/tenants-${1//[=,]/} t i fargs=()
	case $fair in
	off) fargs=(--tenant-fair-share=false) ;;
	on | none) ;;
	*)
		local kv
		for kv in ${fair//,/ }; do
			case $kv in
			slots=[1-9]*) fargs+=(--tenant-slots "${kv#slots=}") ;;
			max=[1-9]*) fargs+=(--tenant-max-in-flight "${kv#max=}") ;;
			*)
				echo "storebench: FAIR holds off, on, none or slots=N,max=N (got $fair)" >&2
				exit 2
				;;
			esac
		done
		;;
	esac
	for t in a b; do
		mkdir -p "$tdir/$t"
		cp -r "$work/events" "$tdir/$t/events"
		psql "$pg_admin" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS ${bench_db}_$t WITH (FORCE)" -c "CREATE DATABASE ${bench_db}_$t" >/dev/null
		"$bin" store migrate --store "${base%/*}/${bench_db}_$t$query" >/dev/null 2>"$work/migrate.log" || { cat "$work/migrate.log" >&2; exit 1; }
	done
	serve "$work/server-tenants-${fair//[=,]/}.log" "$bin" --tenants-dir "$tdir" --tenant-claim org --store "${base%/*}/${bench_db}_{tenant}$query" "${fargs[@]}" || exit 1
	local url="http://$addr/mcp" flood=() quiet=() spid=${pids[-1]}
	for i in $(seq 0 $((clients - 1))); do
		"$work/loadtest" mint-hs256 --secret-file "$work/secret" --issuer "$issuer" --audience "$url" --scope "trace:read trace:guard" \
			--sub "$(printf 'bench-agent-%02d' "$i")" --claim org=a >"$work/token-a-$i"
		flood+=("$work/token-a-$i")
	done
	for i in $(seq 0 $((calm - 1))); do
		"$work/loadtest" mint-hs256 --secret-file "$work/secret" --issuer "$issuer" --audience "$url" --scope "trace:read trace:guard" \
			--sub "$(printf 'bench-agent-%02d' "$i")" --claim org=b >"$work/token-b-$i"
		quiet+=("$work/token-b-$i")
	done
	load() { # tokens clients
		"$work/loadtest" --url "$url" --token-file "$1" --duration "$duration" --clients "$2" --tool check_before_pay \
			--args-file "$work/questions-distinct.ndjson" --args-per-client 2 --json
	}
	local alone during flooding c0 c1 c2 ticks
	ticks=$(getconf CLK_TCK)
	c0=$(cpu_ticks "$spid")
	alone=$(load "$(IFS=,; echo "${quiet[*]}")" "$calm") || status=1
	c1=$(cpu_ticks "$spid")
	load "$(IFS=,; echo "${flood[*]}")" "$clients" >"$work/flood.json" &
	local fpid=$!
	during=$(load "$(IFS=,; echo "${quiet[*]}")" "$calm") || status=1
	wait "$fpid" || status=1
	c2=$(cpu_ticks "$spid")
	flooding=$(cat "$work/flood.json")
	stop_servers
	local row j srv
	for row in "tenant b alone" "tenant b while a floods" "tenant a flooding"; do
		case $row in
		"tenant b alone") j=$alone srv=$(jq -nr --argjson u "$(cpu_used "$c0" "$c1")" --argjson t "$ticks" --argjson n "$(jq .requests <<<"$alone")" '$u / $t / ($n / 1000) | . * 100 | round / 100') ;;
		"tenant b while a floods") j=$during srv=$(jq -nr --argjson u "$(cpu_used "$c1" "$c2")" --argjson t "$ticks" --argjson n "$(jq -n --argjson a "$during" --argjson b "$flooding" '$a.requests + $b.requests')" '$u / $t / ($n / 1000) | . * 100 | round / 100') ;;
		*) j=$flooding srv=- ;;
		esac
		printf '%-6s %-34s %7s %7s %7s %6s %s\n' "$fair" "$row" "$(jq -r '.rps | floor' <<<"$j")" "$(jq -r '.p50_ns / 1e6 | . * 100 | round / 100' <<<"$j")" \
			"$(jq -r '.p99_ns / 1e6 | . * 100 | round / 100' <<<"$j")" "$srv" "$(jq -r '.errors | to_entries | map("\(.key)=\(.value)") | join(",") | if . == "" then "0" else . end' <<<"$j")"
		[[ $(jq -r '.errors | length' <<<"$j") == 0 ]] || status=1
	done
	for t in a b; do
		psql "$pg_admin" -qX -c "DROP DATABASE IF EXISTS ${bench_db}_$t WITH (FORCE)" >/dev/null || true
	done
}

echo "check_before_pay, $clients callers, $duration a row, $rounds round(s), $(nproc) cores; each caller asks of one payee allowed and one sent to review"
echo "builds: ${builds[*]}"
echo "cpu: CPU seconds per 1000 answers (srv: the servers; pg: PostgreSQL's backends of the benchmark's database); stmt, rt: statements and round trips per answer; prep: of those round trips, the ones that only prepared statements; load: the 1-minute load average after the row"
printf '%-8s %5s %-8s %-8s %8s %7s %7s %7s %6s %5s %5s %5s %5s %5s %-8s %-24s %-7s  %s\n' build round store shape replicas 'req/s' 'p50 ms' 'p99 ms' 'srv' 'pg' stmt rt prep load errors answers chains 'reviews (by rules)'
if [[ -n $pg_admin ]]; then
	# The benchmark's database: the admin URL with its database replaced.
	base=${pg_admin%%\?*}
	query=
	[[ $pg_admin == *\?* ]] && query="?${pg_admin#*\?}"
	bench_url="${base%/*}/$bench_db$query"
	hostport=${base#*://}
	hostport=${hostport#*@}
	hostport=${hostport%%/*}
	[[ $hostport == *:* ]] || hostport="$hostport:5432"
	"$work/pgcount" --upstream "$hostport" >"$work/pgcount.out" 2>"$work/pgcount.log" &
	pids_proxy=$!
	trap 'stop_servers; kill "$pids_proxy" 2>/dev/null; rm -rf "$work"' EXIT
	for _ in $(seq 1 100); do
		read -r _ pg_proxy _ pg_counts <"$work/pgcount.out" 2>/dev/null && [[ -n ${pg_counts:-} ]] && break
		sleep 0.05
	done
	if [[ -z ${pg_counts:-} ]]; then
		cat "$work/pgcount.log" >&2
		echo "storebench: the counting proxy did not start" >&2
		exit 1
	fi
fi
for round in $(seq 1 "$rounds"); do
	if [[ -z ${SKIP_FILE:-} ]]; then
		for shape in $shapes; do
			for build in "${builds[@]}"; do
				label=${build%%=*} bin=${build#*=}
				run_row file "$shape" 1 "" "$round"
			done
		done
	fi
	[[ -n $pg_admin ]] || continue
	for n in $replica_counts; do
		for shape in $shapes; do
			for build in "${builds[@]}"; do
				label=${build%%=*} bin=${build#*=}
				psql "$pg_admin" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $bench_db WITH (FORCE)" -c "CREATE DATABASE $bench_db" >/dev/null
				"$bin" store migrate --store "$bench_url" >/dev/null 2>"$work/migrate.log" || { cat "$work/migrate.log" >&2; exit 1; }
				run_row postgres "$shape" "$n" "$bench_url" "$round"
			done
		done
	done
done
if [[ -z $pg_admin ]]; then
	echo "(PostgreSQL rows skipped: set HAIA_BENCH_POSTGRES to a postgres:// URL whose role may CREATE DATABASE)"
else
	psql "$pg_admin" -qX -c "DROP DATABASE IF EXISTS $bench_db WITH (FORCE)" >/dev/null || true
	[[ -n ${TENANTS:-} ]] && { label=${builds[0]%%=*} bin=${builds[0]#*=}; tenant_rows; }
fi

# The summary: per build and row, the median over the rounds and the
# spread; per build and replica count, distinct / shared req/s by round
# and of the medians.
read -r -d '' summary <<'JQ' || true
	def median: sort | if length == 0 then null elif length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
	def r($d): if . == null then "-" else (. * $d | round / $d | tostring) end;
	def med($k): map(.[$k]) | map(select(. != null)) | median;
	if $part == "rows" then
	  "build\tstore\treplicas\tshape\treq/s (min–max)\tp50 ms\tp99 ms\tsrv\tpg\tstmt\trt\tprep\tcheck",
	  (group_by([.build, .store, .replicas, .shape])[]
	   | "\(.[0].build)\t\(.[0].store)\t\(.[0].replicas)\t\(.[0].shape)\t\(med("rps") | r(1)) (\(map(.rps) | min | r(1))–\(map(.rps) | max | r(1)))\t\(med("p50") | r(10))\t\(med("p99") | r(10))\t\(med("srv") | r(100))\t\(med("pg") | r(100))\t\(med("stmt") | r(10))\t\(med("rt") | r(10))\t\(med("prep") | r(100))\t\(if all(.ok) then "exact" else "NOT EXACT" end)")
	elif $part == "ratios" then
	  "build\tstore\treplicas\tby round\tof the medians\t1.3× (the median of the rounds)",
	  (group_by([.build, .store, .replicas])[] | select(any(.shape == "distinct") and any(.shape == "shared"))
	   | (map(select(.shape == "distinct")) | map({(.round | tostring): .rps}) | add) as $d
	   | (map(select(.shape == "shared")) | map({(.round | tostring): .rps}) | add) as $s
	   | ([$d | keys[] | select($s[.] != null and $s[.] > 0) | $d[.] / $s[.]]) as $ratios
	   | ((map(select(.shape == "distinct")) | med("rps")) / (map(select(.shape == "shared")) | med("rps"))) as $of
	   | "\(.[0].build)\t\(.[0].store)\t\(.[0].replicas)\t\($ratios | map(r(100)) | join(", "))\t\($of | r(100))\t\(if ($ratios | median) >= 1.3 then "reached" else "not reached" end) (\($ratios | median | r(100)))")
	else
	  "load average (1 min) after the rows: \(map(.load) | min)–\(map(.load) | max)"
	end
JQ
table() { if command -v column >/dev/null; then column -t -s $'\t'; else cat; fi; }
if [[ -s $work/results.ndjson ]]; then # no rows but the tenants' (REPLICAS=" " SKIP_FILE=1 TENANTS=1): no summary
	echo
	echo "the median of each row over its $rounds round(s):"
	jq -rs --arg part rows "$summary" "$work/results.ndjson" | table
	echo
	echo "distinct / shared req/s:"
	jq -rs --arg part ratios "$summary" "$work/results.ndjson" | table
	jq -rs --arg part load "$summary" "$work/results.ndjson"
fi
exit $status
