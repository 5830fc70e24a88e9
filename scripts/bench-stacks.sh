#!/usr/bin/env bash
# The cost of allocation stacks on a GPU machine: bench_stacks (a warm
# cudaMalloc+cudaFree pair from a call chain 24 frames deep) without
# cudalloc, and under cudalloc with backtrace_depth 0, 8 and 16. The
# settings take turns, REPEAT rounds of each (default 5), so that drift in
# the machine's speed spreads over all of them; prints every run, then the
# median of each setting.
#   scripts/bench-stacks.sh [build-dir]   (needs nvcc and a built libcudalloc.so)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
repeat="${REPEAT:-5}"
bin="$build/bench_stacks"
nvcc -O2 -g -arch=sm_90 -o "$bin" "$root/tests/bench/bench_stacks.cu"
lib="$build/libcudalloc.so"
runs=$(mktemp)

ns_of() { sed -n 's/^bench_stacks: \([0-9.]*\) ns.*/\1/p'; }

echo "setting,run,ns_per_pair"
for r in $(seq "$repeat"); do
  echo "no cudalloc,$r,$("$bin" 20000 | ns_of)" | tee -a "$runs"
  for depth in 0 8 16; do
    echo "backtrace_depth:$depth,$r,$(env CUDALLOC_CONF="backtrace_depth:$depth,leak_report:0" \
      LD_PRELOAD="$lib" "$bin" | ns_of)" | tee -a "$runs"
  done
done
echo
echo "setting,median_ns_per_pair"
for setting in "no cudalloc" backtrace_depth:0 backtrace_depth:8 backtrace_depth:16; do
  grep "^$setting," "$runs" | cut -d, -f3 | sort -n |
    awk -v s="$setting" '{v[NR]=$1} END {print s "," v[int((NR+1)/2)]}'
done
rm -f "$runs"
