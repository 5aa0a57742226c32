#!/usr/bin/env bash
# Runs the same benchmarks on two trees of this repository, alternating
# runs so that machine noise falls on both, and compares them with
# benchstat: a change's figures next to its base's, from one sitting.
#
#   hack/bench-compare.sh BASE_DIR NEW_DIR PACKAGE BENCH_REGEXP [COUNT] [BENCHTIME]
#
# BASE_DIR and NEW_DIR are checkouts (git worktree add /tmp/base <ref>).
# Results go to bench-compare-<package>.{base,new}.txt in the current
# directory; benchstat comes from the Go module proxy.
set -euo pipefail
base=$1 new=$2 pkg=$3 re=$4 count=${5:-3} benchtime=${6:-1x}
: "${KPNG_CONTROLPLANE_DIR:=$(bash "$new/hack/build-controlplane.sh" | tail -n 1)}"
export KPNG_CONTROLPLANE_DIR
name=$(echo "$pkg" | tr '/.' '__')
rm -f "bench-compare-$name.base.txt" "bench-compare-$name.new.txt"
for i in $(seq "$count"); do
  for side in base new; do
    dir=$base; [ "$side" = new ] && dir=$new
    echo "bench-compare: $side run $i of $count: $pkg $re" >&2
    (cd "$dir" && go test -run '^$' -bench "$re" -benchmem -benchtime="$benchtime" -count=1 -timeout 60m "$pkg") \
      | grep -E '^(Benchmark|goos|goarch|pkg|cpu)' >> "bench-compare-$name.$side.txt"
  done
done
go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da \
  "base=bench-compare-$name.base.txt" "new=bench-compare-$name.new.txt"
