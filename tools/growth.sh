#!/usr/bin/env bash
# The growth benchmark of issue 14: check_before_pay and get_review_status
# over a guard that has run for a long time (100,000 reviews, 1,000,000
# signed receipts by default) against an empty guard/, each in its own
# process so that peak RSS is the benchmark's own.
#
#   tools/growth.sh [DIR] [REVIEWS] [RECEIPTS]
#
# DIR (default $TMPDIR/haia-growth) is built once with tools/growthgen and
# reused; the benchmark appends its own answers to it, as a server would.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-${TMPDIR:-/tmp}/haia-growth}
reviews=${2:-100000}
receipts=${3:-1000000}
if [[ ! -d $dir/.trace ]]; then
	go run ./tools/growthgen -dir "$dir" -reviews "$reviews" -receipts "$receipts"
fi
for which in empty grown; do
	HAIA_GROWTH_DIR="$dir" go test ./guard/engine/ -run '^$' -bench "^BenchmarkGrowth/$which\$" -benchtime 400x -count 1 | grep '^Benchmark'
done
for verb in audit; do
	/usr/bin/env time -f "$verb: %e s, peak RSS %M KiB" go run ./cmd/haia-trace-mcp "$verb" --dir "$dir/.trace" --reviewers "$dir/reviewers.json" | tail -1
done
