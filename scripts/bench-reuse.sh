#!/usr/bin/env bash
# What cudalloc's reuse policies cost a program, on a GPU machine (issue 5;
# the workloads of issue 6).
#
# Part 1, tests/bench/bench_mixed.cu (static CUDA runtime): 20,000 random
# allocations and frees over 64 slots, 256 B to 64 MiB, a small kernel every
# 64 operations; µs per operation, median of 5 rounds per run. Settings:
# plain cudaMalloc/cudaFree, the driver's stream-ordered pool
# (cudaMallocAsync, a reference), and cudalloc with reuse_policy safe,
# immediate and device_sync.
# Part 2, tests/bench/resnet_step.py: a ResNet-50 training step (batch 64,
# fp32, SGD), median of 20 steps after 5 of warm-up, and the peak memory in
# use (NVML's figure, as nvidia-smi shows it). Settings: PyTorch's caching
# allocator (the reference), PYTORCH_NO_CUDA_MEMORY_CACHING=1 alone (a
# cudaMalloc per tensor), and that under cudalloc with reuse_policy safe and
# immediate.
#
# The settings of a part take turns, REPEAT runs of each for part 1
# (default 5) and RESNET_REPEAT for part 2 (default 3), so that drift in the
# machine's speed spreads over all of them; prints every run as CSV, then
# the median of each setting. A run that fails prints "error" (its output
# goes to stderr) and the script exits 1 at the end.
#   scripts/bench-reuse.sh [build-dir]   (needs nvcc and a built libcudalloc.so;
#                                         PARTS="mixed resnet" by default)
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
repeat="${REPEAT:-5}"
resnet_repeat="${RESNET_REPEAT:-3}"
parts="${PARTS:-mixed resnet}"
lib="$build/libcudalloc.so"
bin="$build/bench_mixed"
failed=0
CMD=()
export PYTHONDONTWRITEBYTECODE=1
unset LD_PRELOAD CUDALLOC_CONF

if [[ ! -f $lib ]]; then
  echo "bench-reuse: $lib not found: build the library first" >&2
  exit 2
fi
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT

# median_of SETTING COLUMN: the median of COLUMN over SETTING's numeric rows.
median_of() {
  awk -F, -v s="$1" -v c="$2" '$1 == s && $c ~ /^[0-9.]+$/ { print $c }' "$runs" |
    sort -n |
    awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "error" }'
}

# value_or_error OUTPUT SED_EXPR: the number SED_EXPR extracts, or "error".
value_or_error() {
  local v
  v=$(sed -n "$2" <<<"$1" | tail -n1)
  if [[ $v =~ ^[0-9.]+$ ]]; then echo "$v"; else echo error; fi
}

# ---- Part 1: the mixed workload ----------------------------------------

mixed_settings=("cudaMalloc" "cudaMallocAsync" "cudalloc safe" "cudalloc immediate"
  "cudalloc device_sync")

# mixed_cmd SETTING: the command of SETTING, in CMD.
mixed_cmd() {
  case $1 in
  cudaMalloc) CMD=("$bin" sync) ;;
  cudaMallocAsync) CMD=("$bin" async) ;;
  "cudalloc "*)
    CMD=(env CUDALLOC_CONF="reuse_policy:${1#cudalloc },leak_report:0"
      LD_PRELOAD="$lib" "$bin" sync)
    ;;
  esac
}

part_mixed() {
  nvcc -O2 -arch=sm_90 -cudart=static -o "$bin" "$root/tests/bench/bench_mixed.cu" ||
    { echo "bench-reuse: building bench_mixed failed" >&2; failed=1; return; }
  echo "setting,run,us_per_op"
  local r s out v
  for r in $(seq "$repeat"); do
    for s in "${mixed_settings[@]}"; do
      mixed_cmd "$s"
      out=$(timeout 300 "${CMD[@]}" 2>&1)
      v=$(value_or_error "$out" 's/^bench_mixed: \([0-9.]*\) us per op.*/\1/p')
      [[ $v == error ]] && { failed=1; printf '%s\n' "$out" >&2; }
      echo "$s,$r,$v" | tee -a "$runs"
    done
  done
  echo
  echo "setting,median_us_per_op"
  for s in "${mixed_settings[@]}"; do
    echo "$s,$(median_of "$s" 3)"
  done
}

# ---- Part 2: a ResNet-50 training step ----------------------------------

resnet_settings=("pytorch caching" "no caching" "cudalloc safe" "cudalloc immediate")

# resnet_cmd SETTING: the command of SETTING, in CMD.
resnet_cmd() {
  local py=(python3 "$root/tests/bench/resnet_step.py")
  case $1 in
  "pytorch caching") CMD=(env -u PYTORCH_NO_CUDA_MEMORY_CACHING "${py[@]}") ;;
  "no caching") CMD=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "${py[@]}") ;;
  "cudalloc "*)
    CMD=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1
      CUDALLOC_CONF="reuse_policy:${1#cudalloc },leak_report:0"
      LD_PRELOAD="$lib" "${py[@]}")
    ;;
  esac
}

part_resnet() {
  echo "setting,run,ms_per_step,peak_gib"
  local r s out ms gib
  : >"$runs" # the medians below must not see part 1's rows
  for r in $(seq "$resnet_repeat"); do
    for s in "${resnet_settings[@]}"; do
      resnet_cmd "$s"
      out=$(timeout 600 "${CMD[@]}" 2>&1)
      ms=$(value_or_error "$out" 's/^resnet_step: \([0-9.]*\) ms .*/\1/p')
      gib=$(value_or_error "$out" 's/^resnet_step: peak in use \([0-9.]*\) GiB.*/\1/p')
      [[ $ms == error ]] && { failed=1; printf '%s\n' "$out" >&2; }
      echo "$s,$r,$ms,$gib" | tee -a "$runs"
    done
  done
  echo
  echo "setting,median_ms_per_step,median_peak_gib"
  for s in "${resnet_settings[@]}"; do
    echo "$s,$(median_of "$s" 3),$(median_of "$s" 4)"
  done
}

for part in $parts; do
  case $part in
  mixed) part_mixed ;;
  resnet) part_resnet ;;
  *) echo "bench-reuse: unknown part '$part' (mixed, resnet)" >&2; exit 2 ;;
  esac
  echo
done
exit "$failed"
