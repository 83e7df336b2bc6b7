#!/usr/bin/env bash
# Performance figures of haia-trace-mcp on the shared benchmark data
# (../shared/bench: gen_run.py and pyfloor.py), generated into a temporary
# directory that is removed at the end:
#
#   build  the 108k-event, 64 MB run (gen_run.py big.ndjson 30000): the build
#          command and the Python floor (pyfloor.py) back to back, RUNS times,
#          whole process (wall, CPU, peak RSS from /usr/bin/time when present);
#          the ratio is median build / median floor, measured in the same run
#   list   the large root (60 runs of gen_run.py … 1400 N, ~300k events):
#          go test benchmarks in process, then tools/benchlist over stdio
#          (cold, warm p50/p99, after +1,000 lines p50/p99, peak RSS)
#   huge   (HUGE=1) the same listing figures on a root ten times larger
#          (600 runs, ~3M events, ~1.7 GB of disk in the temp directory),
#          served with --index-max-mb ${HUGE_INDEX_MB:-4096} so that it fits
#
#   tools/bench.sh [RUNS=5]        SHARED=../shared by default; HUGE=1 for the 3M root
#
# The Python floor needs only python3 (no packages; PyPI is not needed).
set -euo pipefail

runs=${1:-5}
repo=$(cd "$(dirname "$0")/.." && pwd)
shared=${SHARED:-$repo/../shared}
gen="$shared/bench/gen_run.py"
floor="$shared/bench/pyfloor.py"
[[ -f $gen && -f $floor ]] || { echo "bench: $shared/bench/{gen_run.py,pyfloor.py} not found (set SHARED)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "bench: python3 is needed for the generators and the floor" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$repo" && go build -o "$work/haia-trace-mcp" ./cmd/haia-trace-mcp && go build -o "$work/benchlist" ./tools/benchlist)

# root DIR RUNS: RUNS runs of 1,400 operations, seeds 0..RUNS-1.
root() {
	mkdir -p "$1/events"
	for ((n = 0; n < $2; n++)); do
		python3 "$gen" "$1/events/$(printf '17940000%05d' "$n").ndjson" 1400 "$n" >/dev/null
	done
}

# timed CMD...: prints "wall_s cpu_s peak_kib" for one run of CMD (output discarded).
timed() {
	if [[ -x /usr/bin/time ]]; then
		/usr/bin/time -f '%e %U %S %M' -o "$work/t" "$@" >/dev/null
		awk '{printf "%s %.2f %s\n", $1, $2 + $3, $4}' "$work/t"
	else
		local t0 t1
		t0=$(date +%s.%N)
		"$@" >/dev/null
		t1=$(date +%s.%N)
		echo "$(echo "$t1 - $t0" | bc) - -"
	fi
}

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

echo "== build: 108k-event run, $runs pairs (build, then the Python floor) =="
python3 "$gen" "$work/big.ndjson" 30000 >/dev/null
"$work/haia-trace-mcp" build "$work/big.ndjson" >/dev/null # warm the page cache
: >"$work/b" && : >"$work/f"
for ((i = 0; i < runs; i++)); do
	timed "$work/haia-trace-mcp" build "$work/big.ndjson" >>"$work/b"
	timed python3 "$floor" "$work/big.ndjson" >>"$work/f"
done
bw=$(cut -d' ' -f1 "$work/b" | median)
bc_=$(cut -d' ' -f2 "$work/b" | median)
bm=$(cut -d' ' -f3 "$work/b" | median)
fw=$(cut -d' ' -f1 "$work/f" | median)
fm=$(cut -d' ' -f3 "$work/f" | median)
awk -v bw="$bw" -v bc="$bc_" -v bm="$bm" -v fw="$fw" -v fm="$fm" 'BEGIN {
	printf "build  wall %.3f s  cpu %.3f s  peak %.0f MiB\n", bw, bc, bm / 1024
	printf "floor  wall %.3f s  peak %.0f MiB\n", fw, fm / 1024
	printf "ratio  build/floor (wall, medians) %.3f\n", bw / fw }'

echo "== list: the large root (60 runs) =="
root "$work/large" 60
(cd "$repo" && HAIA_BENCH_ROOT="$work/large" go test -run '^$' -bench 'BenchmarkList' -benchtime 20x -benchmem ./server | grep '^Benchmark')
cp -r "$work/large" "$work/large-grow"
"$work/benchlist" --bin "$work/haia-trace-mcp" --dir "$work/large-grow" --label large
rm -rf "$work/large-grow"

if [[ ${HUGE:-} == 1 ]]; then
	echo "== list: the 3M-event root (600 runs), --index-max-mb ${HUGE_INDEX_MB:-4096} =="
	root "$work/huge" 600
	"$work/benchlist" --bin "$work/haia-trace-mcp" --dir "$work/huge" --label huge --calls 100 --appends 10 \
		--index-max-mb "${HUGE_INDEX_MB:-4096}"
fi
