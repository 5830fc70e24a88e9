#!/usr/bin/env bash
# The cost of allocation stacks on a GPU machine: bench_stacks (a warm
# cudaMalloc+cudaFree pair from a call chain 24 frames deep) under
# cudalloc with backtrace_depth 0, 8 and 16, and without cudalloc, each run
# REPEAT times; prints one line per setting with the median.
#   scripts/bench-stacks.sh [build-dir]   (needs nvcc and a built libcudalloc.so)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
repeat="${REPEAT:-3}"
bin="$build/bench_stacks"
nvcc -O2 -g -arch=sm_90 -o "$bin" "$root/tests/bench/bench_stacks.cu"
lib="$build/libcudalloc.so"

median_of() { # command...: runs it $repeat times, prints the median ns
  for _ in $(seq "$repeat"); do
    "$@" | sed -n 's/^bench_stacks: \([0-9.]*\) ns.*/\1/p'
  done | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'
}

echo "setting,ns_per_pair"
echo "no cudalloc,$(median_of "$bin" 20000)"
for depth in 0 8 16; do
  echo "backtrace_depth:$depth,$(median_of env \
    CUDALLOC_CONF=backtrace_depth:$depth LD_PRELOAD="$lib" "$bin")"
done
