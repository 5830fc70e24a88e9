#!/usr/bin/env bash
# bench-gpu.sh: the GPU benchmark suite, in one command, on a GPU machine.
#
# Why: cudalloc is worth preloading only if it is faster than what a
# program would otherwise use, so every figure here is set beside its peers
# measured in the same run: plain cudaMalloc/cudaFree, the driver's
# stream-ordered pool (cudaMallocAsync) and, for PyTorch, its own caching
# allocator. Parts (PARTS, all by default, in this order):
#   latency  tests/bench/bench_latency.cu: one warm allocate+free pair, by
#            size (256 B to 1 GiB), ns per pair: cudaMalloc, cudaMallocAsync,
#            cudalloc (default settings) and cudalloc with immediate reuse;
#   mixed    tests/bench/bench_mixed.cu, static and shared CUDA runtime:
#            20,000 random operations over 64 slots, 256 B to 64 MiB, a
#            kernel every 64 operations; us per operation: cudaMalloc,
#            cudaMallocAsync, cudalloc under each reuse_policy;
#   threads  tests/bench/bench_threads.cu: 1, 2, 4 and 8 host threads
#            allocating and freeing through device 0's primary context;
#            operations per second, and each setting against its own
#            1-thread figure;
#   stacks   bench_mixed --deep (the workload at the bottom of a call chain
#            24 frames deep) under cudalloc with backtrace_depth 0, 8, 16:
#            what a call stack costs per allocation;
#   fence    tests/bench/bench_fence.cu: the driver calls a fence is made of,
#            each alone and together, ns per call (what the default reuse
#            policy pays, layer by layer, on top of immediate reuse);
#   resnet   tests/bench/resnet_step.py: a ResNet-50/152 training step, fp32
#            and bf16 autocast; ms per step and peak memory in use (NVML):
#            PyTorch's caching allocator, no caching, PyTorch on
#            cudaMallocAsync, and no caching under cudalloc (safe, immediate);
#   copies   tests/bench/bench_copies.c: small async copies and memsets
#            through the driver API, whose ranges the library checks, ns per
#            call: plain, preloaded with enabled:0 (the hooks alone) and
#            preloaded (hooks and checks); and a memset one byte past its
#            block, a random one or the same each time, which the library
#            refuses itself (the hook and the check alone);
#   slot     GPT-2 small (bf16), ResNet-50 and ResNet-152 (fp32) training
#            steps (tests/bench/slot_steps.py) with an allocator in PyTorch's
#            allocator slot: cudalloc (as it comes, with expandable segments,
#            with memcheck) and the floor (tests/bench/slot_floor.c, the
#            least any allocator in the slot can cost), beside PyTorch's
#            caching allocator, plain and with expandable segments; ms per
#            step (median and spread) and peak memory in use (NVML), with a
#            PASS/MISS cell per target (slot step <= 1.00x caching's, slot
#            peak <= 0.95x caching's, with expandable segments <= 0.95x
#            caching expandable's, memcheck step <= 1.3x the slot's) and one
#            "slot-summary <case>:" line per case to grep for. The
#            cudaMallocAsync and preloaded settings (async, preload) are
#            there to ask for. One process per setting and round runs all
#            the cases (PyTorch's start is most of a run's seconds).
#
# Each figure is the median of repeated runs; within a part the settings
# take turns in every repeat, so that drift in the machine's speed spreads
# over all of them. Every run is printed as a CSV row as it ends; each part
# then prints a markdown table of medians with ratios against its peers and
# a PASS/MISS column per target. This is a benchmark report, not a test: a
# MISS does not change the exit status. A run that fails or prints no figure
# is recorded as "error" (its output is shown and kept) and the suite goes
# on; the exit status is then 1. It is 2 when nothing could be measured
# (bad knobs, the library does not build).
#
#   scripts/bench-gpu.sh [build-dir]      (default: build-bench)
#
# Builds the library and the benchmark programs with CMake (Release; the
# programs are tests/bench's CUDA targets, static runtime unless _shared),
# with what it shares with gpu-check.sh (scripts/gpu-lib.sh); when PARTS
# holds only resnet and slot, just the library and libslot_floor.so.
# Knobs (environment):
#   REPEAT=5           runs of each setting: latency, mixed, threads, stacks
#   RESNET_REPEAT=3    runs of each setting: resnet
#   SLOT_REPEAT=3      rounds of the slot part (each runs every setting once)
#   PARTS="latency mixed threads stacks fence copies resnet slot"
#   SLOT_CASES="gpt2 resnet50 resnet152"  (and the order they run in)
#   SLOT_SETTINGS="caching caching_exp slot slot_exp slot_memcheck floor"
#                      (and async, preload: cudaMallocAsync, cudalloc preloaded)
#   SLOT_TOGETHER=1    one process per slot setting and round for all the
#                      cases; 0: one per case (fresh processes, 3x the starts)
#   SLOT_DEADLINE_S=0  seconds into the script past which the slot part
#                      begins no new round (0: no limit): a machine lent for
#                      600 s a command gets its tables from the rounds done
#   SLOT_FLOOR_GIB=60  the floor's region, GiB (read by libslot_floor.so)
#   RESNET_CASES="resnet50-fp32 resnet50-bf16 resnet152-fp32 resnet152-bf16"
#   RESNET_SETTINGS="caching nocache async safe immediate" (nocache, PyTorch
#                      without any cache, is slow: leave it out to save time)
#   RESNET_ARGS=""     more arguments for resnet_step.py (--steps, --batch)
#   BENCH_OUT=<dir>    where the results go (default: a new temporary folder)
#   CUDAARCHS=90       the GPU architectures the programs are built for
#   PYTHON=python3     the interpreter that runs resnet_step.py
# Writes into BENCH_OUT: <part>.csv (every run), <part>.log (every run's
# full output, with its command), summary.md (the tables), env.txt (the
# machine, the commit, the library's build), build.log, bench-gpu.log
# (everything printed).
# Time with the defaults, estimated from earlier H200 figures: a few minutes
# without resnet; resnet some 20-40 s a run, 60 runs; slot 18 runs (6
# settings, 3 rounds) of some 25-35 s (PyTorch's start 15-25 s, the three
# cases' steps some 10 s), 8-10 minutes. Split a long session with PARTS,
# RESNET_CASES and SLOT_CASES (and one BENCH_OUT per piece).

set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
repeat=${REPEAT:-5}
resnet_repeat=${RESNET_REPEAT:-3}
parts=${PARTS:-latency mixed threads stacks fence copies resnet slot}
slot_repeat=${SLOT_REPEAT:-3}
slot_cases=${SLOT_CASES:-gpt2 resnet50 resnet152}
slot_keys=${SLOT_SETTINGS:-caching caching_exp slot slot_exp slot_memcheck floor}
slot_together=${SLOT_TOGETHER:-1}
slot_deadline=${SLOT_DEADLINE_S:-0}
slot_run_keys="" slot_rounds=0
resnet_cases=${RESNET_CASES:-resnet50-fp32 resnet50-bf16 resnet152-fp32 resnet152-bf16}
resnet_keys=${RESNET_SETTINGS:-caching nocache async safe immediate}
resnet_args=${RESNET_ARGS:-}
python=${PYTHON:-python3}
out=${BENCH_OUT:-}
lib="" bin=""
failed=0
CMD=()
RUN_OUT=""
CA_GPU_TAG=bench-gpu
# shellcheck source=scripts/gpu-lib.sh
. "$root/scripts/gpu-lib.sh"

# The programs measured must see no setting but the one a run gives them.
unset LD_PRELOAD CUDALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING PYTORCH_CUDA_ALLOC_CONF
export PYTHONDONTWRITEBYTECODE=1
# The package `cudalloc`, for the steps that plug it into PyTorch's slot.
export PYTHONPATH="$root/scripts/python${PYTHONPATH:+:$PYTHONPATH}"

# open_folders: the build folder and the results folder, made absolute;
# from then on everything printed also goes to bench-gpu.log.
open_folders() {
  mkdir -p "$build" || return 1
  build=$(cd "$build" && pwd)
  lib=$build/libcudalloc.so
  bin=$build/tests/bench
  if [[ -z $out ]]; then
    out=$(mktemp -d "${TMPDIR:-/tmp}/bench-gpu.XXXXXX") || return 1
  fi
  mkdir -p "$out" || return 1
  out=$(cd "$out" && pwd)
  ca_gpu_log_to "$out/bench-gpu.log"
}

say() { ca_gpu_say "$@"; }

# ---------------------------------------------------------------------------
# Numbers: medians, ratios and verdicts, in awk (the shell has no floats).

awk_lib='function isnum(x) { return x ~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ }'

# values FILE COL [N=VALUE]...: the numbers in column COL of the CSV FILE's
# rows (its header left out) whose column N is VALUE for every N=VALUE.
values() {
  local file=$1 col=$2
  shift 2
  awk -F, -v col="$col" "$awk_lib"'
    BEGIN {
      n = ARGC - 2
      for (i = 1; i <= n; i++) {
        eq = index(ARGV[i], "=")
        want_col[i] = substr(ARGV[i], 1, eq - 1) + 0
        want_val[i] = substr(ARGV[i], eq + 1)
        delete ARGV[i]
      }
    }
    FNR > 1 {
      for (i = 1; i <= n; i++)
        if ($(want_col[i]) != want_val[i])
          next
      if (isnum($col))
        print $col
    }' "$@" "$file"
}

# median FILE COL [N=VALUE]...: the median of those values, or "error".
median() {
  values "$@" | sort -g |
    awk '{ v[NR] = $1 }
      END {
        if (NR == 0) print "error"
        else if (NR % 2) printf "%.10g\n", v[(NR + 1) / 2]
        else printf "%.10g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2
      }'
}

# spread FORMAT DIVISOR FILE COL [N=VALUE]...: "min–max" of those values,
# each divided by DIVISOR, in FORMAT.
spread() {
  local f=$1 d=$2
  shift 2
  values "$@" | sort -g |
    awk -v f="$f" -v d="$d" 'NR == 1 { lo = $1 } { hi = $1 }
      END { if (NR) printf f "–" f, lo / d, hi / d; else printf "-" }'
}

# num FORMAT VALUE: VALUE in the printf FORMAT, or VALUE as is when it is
# not a number ("error").
num() {
  awk -v f="$1" -v v="$2" "$awk_lib"'
    BEGIN { if (isnum(v)) printf f, v; else printf "%s", v }'
}

# ratio A B: A / B as "N×" (one decimal from 10 on, two below), or "-".
ratio() {
  awk -v a="$1" -v b="$2" "$awk_lib"'
    BEGIN {
      if (!isnum(a) || !isnum(b) || b == 0) { printf "-"; exit }
      r = a / b
      f = r >= 10 ? "%.1f×" : "%.2f×"
      printf f, r
    }'
}

# change A B: how much A is above B, as a signed percentage, or "-".
change() {
  awk -v a="$1" -v b="$2" "$awk_lib"'
    BEGIN {
      if (isnum(a) && isnum(b) && b != 0) printf "%+.1f%%", (a / b - 1) * 100
      else printf "-"
    }'
}

# quotient A B: A / B as a plain number, or "error".
quotient() {
  awk -v a="$1" -v b="$2" "$awk_lib"'
    BEGIN { if (isnum(a) && isnum(b) && b != 0) printf "%.10g", a / b; else printf "error" }'
}

# verdict A OP B: PASS when A OP B holds (OP is <= or >=), MISS when it
# does not, "n/a" when a figure is missing.
verdict() {
  awk -v a="$1" -v op="$2" -v b="$3" "$awk_lib"'
    BEGIN {
      if (!isnum(a) || !isnum(b)) { printf "n/a"; exit }
      if (op == "<=") ok = a + 0 <= b + 0
      else ok = a + 0 >= b + 0
      printf "%s", ok ? "PASS" : "MISS"
    }'
}

# ---------------------------------------------------------------------------
# Runs and their records.

# md LINE...: a line of the summary, printed and kept in summary.md.
md() { printf '%s\n' "$*" | tee -a "$out/summary.md"; }

# csv_begin PART HEADER: starts PART's CSV file and prints its header.
csv_begin() {
  printf '%s\n' "$2" >"$out/$1.csv"
  echo
  printf '%s\n' "$2"
}

# csv_row PART ROW: one run's row, printed and kept.
csv_row() { printf '%s\n' "$2" | tee -a "$out/$1.csv"; }

# run_cmd PART LIMIT: runs CMD (stderr with stdout, into RUN_OUT) under
# `timeout LIMIT` and keeps its output in PART's log. Returns its status.
run_cmd() {
  local part=$1 limit=$2 rc
  RUN_OUT=$(timeout "$limit" "${CMD[@]}" 2>&1)
  rc=$?
  {
    printf '== %s (exit %d)\n' "${CMD[*]}" "$rc"
    printf '%s\n' "$RUN_OUT"
  } >>"$out/$part.log"
  return "$rc"
}

# run_failed PART WHAT STATUS: records a run that failed or printed no
# figure, and shows the end of its output.
run_failed() {
  failed=1
  say "$1: error in $2 (exit $3; full output in $out/$1.log):"
  printf '%s\n' "$RUN_OUT" | tail -n 15 | sed 's/^/  | /'
}

# pick SED_EXPR: the number SED_EXPR extracts from RUN_OUT, or "error".
pick() {
  local v
  v=$(sed -n "$1" <<<"$RUN_OUT" | tail -n 1)
  if [[ $v =~ ^[0-9]+(\.[0-9]+)?$ ]]; then echo "$v"; else echo error; fi
}

# preload CONF PROGRAM...: CMD runs PROGRAM under cudalloc with CUDALLOC_CONF.
preload() {
  local conf=$1
  shift
  CMD=(env LD_PRELOAD="$lib" CUDALLOC_CONF="$conf" "$@")
}

# ---------------------------------------------------------------------------
# Building: CMake brings the library and every benchmark program up to date
# on each invocation (ca_gpu_build), so no stale program is measured.

# need PROGRAM...: whether the build made them; says which it did not.
need() {
  local p ok=0
  for p in "$@"; do
    [[ -x $bin/$p ]] && continue
    say "error: $bin/$p was not built (see $out/build.log)"
    failed=1 ok=1
  done
  return "$ok"
}

# ---------------------------------------------------------------------------
# The machine, the commit, the library.

facts() {
  local type
  type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null)
  ca_gpu_facts "$root"
  echo "library: $lib (CMAKE_BUILD_TYPE ${type:-unknown})"
  echo "repeats: REPEAT=$repeat RESNET_REPEAT=$resnet_repeat SLOT_REPEAT=$slot_repeat" \
    "SLOT_TOGETHER=$slot_together SLOT_DEADLINE_S=$slot_deadline SLOT_FLOOR_GIB=${SLOT_FLOOR_GIB:-60}"
}

# ---------------------------------------------------------------------------
# Part latency: one warm allocate+free pair, by size.

latency_sizes=(256 4096 65536 1048576 16777216 268435456 1073741824)
latency_settings=("cudaMalloc" "cudaMallocAsync" "cudalloc" "cudalloc immediate")

# size_name BYTES: 256 B, 4 KiB, ... 1 GiB.
size_name() {
  awk -v b="$1" 'BEGIN {
    split("B KiB MiB GiB", u, " ")
    i = 1
    while (b >= 1024 && i < 4) { b /= 1024; i++ }
    printf "%g %s", b, u[i]
  }'
}

latency_cmd() {
  local prog=$bin/bench_latency
  case $1 in
  cudaMalloc) CMD=("$prog" sync) ;;
  cudaMallocAsync) CMD=("$prog" async) ;;
  cudalloc) preload leak_report:0 "$prog" sync ;;
  "cudalloc immediate") preload reuse_policy:immediate,leak_report:0 "$prog" sync ;;
  esac
}

latency_run() {
  local s=$1 r=$2 rc size v bad=0
  latency_cmd "$s"
  run_cmd latency 120
  rc=$?
  for size in "${latency_sizes[@]}"; do
    v=$(pick "s/^bench_latency: $size B \([0-9.]*\) ns per pair.*/\1/p")
    ((rc == 0)) || v=error
    [[ $v == error ]] && bad=1
    csv_row latency "$s,$size,$r,$v"
  done
  if ((bad)); then run_failed latency "$s, run $r" "$rc"; fi
}

latency_table() {
  local f=$out/latency.csv size m a c i
  md
  md "### latency: one warm allocate+free pair, ns (median of $repeat runs)"
  md
  md "| size | cudaMalloc | cudaMallocAsync | cudalloc | cudalloc immediate" \
    "| cudalloc speed-up vs cudaMallocAsync | cudalloc speed-up vs cudaMalloc" \
    "| target ≤ 300 ns | target ≥ 2× faster than cudaMallocAsync |"
  md "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for size in "${latency_sizes[@]}"; do
    m=$(median "$f" 4 1=cudaMalloc 2="$size")
    a=$(median "$f" 4 1=cudaMallocAsync 2="$size")
    c=$(median "$f" 4 1=cudalloc 2="$size")
    i=$(median "$f" 4 "1=cudalloc immediate" 2="$size")
    md "| $(size_name "$size") | $(num %.0f "$m") | $(num %.0f "$a") | $(num %.0f "$c")" \
      "| $(num %.0f "$i") | $(ratio "$a" "$c") | $(ratio "$m" "$c")" \
      "| $(verdict "$c" '<=' 300) | $(verdict "$(quotient "$a" "$c")" '>=' 2) |"
  done
  md
  md "cudalloc: default settings (reuse_policy safe); cudaMallocAsync: the device's" \
    "default pool, release threshold UINT64_MAX; static CUDA runtime."
}

part_latency() {
  need bench_latency || return
  csv_begin latency "setting,bytes,run,ns_per_pair"
  local r s
  for r in $(seq "$repeat"); do
    for s in "${latency_settings[@]}"; do
      latency_run "$s" "$r"
    done
  done
  latency_table
}

# ---------------------------------------------------------------------------
# Part mixed: the mixed workload, static and shared runtime.

mixed_settings=("cudaMalloc" "cudaMallocAsync" "cudalloc safe" "cudalloc immediate"
  "cudalloc device_sync")
mixed_runtimes=(static shared)

# mixed_cmd RUNTIME SETTING: the command, in CMD.
mixed_cmd() {
  local prog=$bin/bench_mixed
  [[ $1 == shared ]] && prog=$bin/bench_mixed_shared
  case $2 in
  cudaMalloc) CMD=("$prog" sync) ;;
  cudaMallocAsync) CMD=("$prog" async) ;;
  "cudalloc "*) preload "reuse_policy:${2#cudalloc },leak_report:0" "$prog" sync ;;
  esac
}

mixed_run() {
  local rt=$1 s=$2 r=$3 rc v
  mixed_cmd "$rt" "$s"
  run_cmd mixed 300
  rc=$?
  v=$(pick 's/^bench_mixed: \([0-9.]*\) us per op.*/\1/p')
  ((rc == 0)) || v=error
  csv_row mixed "$rt,$s,$r,$v"
  if [[ $v == error ]]; then run_failed mixed "$s ($rt runtime), run $r" "$rc"; fi
}

mixed_table() {
  local rt=$1 f=$out/mixed.csv s v m a t1 t2 t3
  m=$(median "$f" 4 1="$rt" 2=cudaMalloc)
  a=$(median "$f" 4 1="$rt" 2=cudaMallocAsync)
  md
  md "### mixed workload, $rt CUDA runtime: µs per operation (median of $repeat runs)"
  md
  md "| setting | µs per op | runs | speed-up vs cudaMalloc | speed-up vs cudaMallocAsync" \
    "| target ≤ 0.35 µs/op | target ≥ 2× faster than cudaMallocAsync" \
    "| target ≥ 40× faster than cudaMalloc |"
  md "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for s in "${mixed_settings[@]}"; do
    v=$(median "$f" 4 1="$rt" 2="$s")
    t1=- t2=- t3=-
    if [[ $s == "cudalloc safe" || $s == "cudalloc immediate" ]]; then
      t1=$(verdict "$v" '<=' 0.35)
      t2=$(verdict "$(quotient "$a" "$v")" '>=' 2)
      t3=$(verdict "$(quotient "$m" "$v")" '>=' 40)
    fi
    md "| $s | $(num %.3f "$v") | $(spread %.3f 1 "$f" 4 1="$rt" 2="$s")" \
      "| $(ratio "$m" "$v") | $(ratio "$a" "$v") | $t1 | $t2 | $t3 |"
  done
}

part_mixed() {
  need bench_mixed bench_mixed_shared || return
  csv_begin mixed "runtime,setting,run,us_per_op"
  local r rt s
  for r in $(seq "$repeat"); do
    for rt in "${mixed_runtimes[@]}"; do
      for s in "${mixed_settings[@]}"; do
        mixed_run "$rt" "$s" "$r"
      done
    done
  done
  for rt in "${mixed_runtimes[@]}"; do
    mixed_table "$rt"
  done
  md
  md "20,000 random operations over 64 slots, 256 B–64 MiB log-uniform, a kernel every" \
    "64 operations; median of 5 rounds per run. cudaMallocAsync: the default pool," \
    "release threshold UINT64_MAX."
}

# ---------------------------------------------------------------------------
# Part threads: throughput against host threads.

thread_counts=(1 2 4 8)
thread_settings=("cudalloc safe" "cudalloc immediate" "cudaMallocAsync" "cudaMalloc")

# threads_cmd SETTING THREADS: the command, in CMD. Plain cudaMalloc gets
# fewer operations: each costs tens of microseconds.
threads_cmd() {
  local prog=$bin/bench_threads
  case $1 in
  cudaMalloc) CMD=("$prog" sync "$2" 2000) ;;
  cudaMallocAsync) CMD=("$prog" async "$2" 200000) ;;
  "cudalloc "*)
    preload "reuse_policy:${1#cudalloc },leak_report:0" "$prog" sync "$2" 200000
    ;;
  esac
}

threads_run() {
  local s=$1 t=$2 r=$3 rc v
  threads_cmd "$s" "$t"
  run_cmd threads 300
  rc=$?
  v=$(pick 's/^bench_threads: \([0-9.]*\) ops per s.*/\1/p')
  ((rc == 0)) || v=error
  csv_row threads "$s,$t,$r,$v"
  if [[ $v == error ]]; then run_failed threads "$s, $t threads, run $r" "$rc"; fi
}

threads_table() {
  local f=$out/threads.csv s t v one a m target
  md
  md "### threads: operations per second, all threads together (median of $repeat runs)"
  md
  md "| setting | threads | M ops/s | runs, M ops/s | vs its 1 thread" \
    "| vs cudaMallocAsync | vs cudaMalloc | target: 8 threads ≥ 4× 1 thread |"
  md "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for s in "${thread_settings[@]}"; do
    one=$(median "$f" 4 1="$s" 2=1)
    for t in "${thread_counts[@]}"; do
      v=$(median "$f" 4 1="$s" 2="$t")
      a=$(median "$f" 4 1=cudaMallocAsync 2="$t")
      m=$(median "$f" 4 1=cudaMalloc 2="$t")
      target=-
      [[ $s == cudalloc* && $t == 8 ]] && target=$(verdict "$(quotient "$v" "$one")" '>=' 4)
      md "| $s | $t | $(num %.3f "$(quotient "$v" 1e6)")" \
        "| $(spread %.3f 1e6 "$f" 4 1="$s" 2="$t")" \
        "| $(ratio "$v" "$one") | $(ratio "$v" "$a") | $(ratio "$v" "$m") | $target |"
    done
  done
  md
  md "Each thread: cudaSetDevice(0) (the primary context), 16 live blocks of 256 B–64 KiB," \
    "free one and allocate one per step; cudaMallocAsync: a non-blocking stream per" \
    "thread, the default pool, release threshold UINT64_MAX."
}

part_threads() {
  need bench_threads || return
  csv_begin threads "setting,threads,run,ops_per_s"
  local r t s
  for r in $(seq "$repeat"); do
    for t in "${thread_counts[@]}"; do
      for s in "${thread_settings[@]}"; do
        threads_run "$s" "$t" "$r"
      done
    done
  done
  threads_table
}

# ---------------------------------------------------------------------------
# Part stacks: what backtrace_depth costs, from a deep call chain.

stack_depths=(0 8 16)
stack_ops=20000

stacks_run() {
  local d=$1 r=$2 rc v n
  preload "backtrace_depth:$d,leak_report:0" "$bin/bench_mixed" --deep sync "$stack_ops"
  run_cmd stacks 300
  rc=$?
  v=$(pick 's/^bench_mixed: \([0-9.]*\) us per op.*/\1/p')
  n=$(pick 's/^bench_mixed: .* per round \([0-9]*\) allocations.*/\1/p')
  ((rc == 0)) || v=error
  csv_row stacks "backtrace_depth:$d,$r,$v,$n"
  if [[ $v == error ]]; then run_failed stacks "backtrace_depth:$d, run $r" "$rc"; fi
}

stacks_table() {
  local f=$out/stacks.csv d v base allocs cost target
  base=$(median "$f" 3 1=backtrace_depth:0)
  allocs=$(median "$f" 4 1=backtrace_depth:0)
  md
  md "### stacks: the mixed workload 24 frames deep, under cudalloc (median of $repeat runs)"
  md
  md "| setting | µs per op | runs | vs depth 0 | cost per allocation vs depth 0" \
    "| target: < 2 µs per allocation |"
  md "| --- | --- | --- | --- | --- | --- |"
  for d in "${stack_depths[@]}"; do
    v=$(median "$f" 3 1="backtrace_depth:$d")
    cost=$(awk -v v="$v" -v b="$base" -v n="$allocs" -v ops="$stack_ops" "$awk_lib"'
      BEGIN {
        if (isnum(v) && isnum(b) && isnum(n) && n > 0) printf "%.0f", (v - b) * 1000 * ops / n
        else printf "error"
      }')
    target=-
    ((d > 0)) && target=$(verdict "$cost" '<=' 2000)
    md "| backtrace_depth:$d | $(num %.3f "$v") | $(spread %.3f 1 "$f" 3 1="backtrace_depth:$d")" \
      "| $(change "$v" "$base") | $(num '%+.0f ns' "$cost") | $target |"
  done
  md
  md "Static CUDA runtime, reuse_policy safe, $stack_ops operations per round" \
    "($(num %.0f "$allocs") of them allocations): only an allocation captures a stack," \
    "so the difference per round over its allocations is the cost of one capture."
}

part_stacks() {
  need bench_mixed || return
  csv_begin stacks "setting,run,us_per_op,allocations_per_round"
  local r d
  for r in $(seq "$repeat"); do
    for d in "${stack_depths[@]}"; do
      stacks_run "$d" "$r"
    done
  done
  stacks_table
}

# ---------------------------------------------------------------------------
# Part fence: the driver calls of a fence, each alone and together.

fence_cases=("cuCtxGetCurrent" "cuStreamIsCapturing(legacy)" "cuStreamIsCapturing(per-thread)"
  "cuEventRecord(legacy)" "cuEventRecord(non-blocking)" "cuStreamWaitEvent(legacy)"
  "cuStreamWaitEvent(non-blocking)" "cuEventQuery" "fence, no non-blocking stream"
  "fence, one non-blocking stream")

# case_rows PART STATUS ROW WHAT CASE...: after a run of bench_PART (its
# output in RUN_OUT, its exit status STATUS), one CSV row per case: ROW with
# %i the case's index, then the ns per call the program printed for it
# ("bench_PART: <case> <ns> ns per call"); a run that failed or left a
# figure out is said as WHAT.
case_rows() {
  local part=$1 rc=$2 row=$3 what=$4 i v bad=0
  shift 4
  local cases=("$@")
  for i in "${!cases[@]}"; do
    v=$(pick "s/^bench_$part: ${cases[$i]//[()]/.} \([0-9.]*\) ns per call.*/\1/p")
    ((rc == 0)) || v=error
    [[ $v == error ]] && bad=1
    csv_row "$part" "${row//%i/$i}$v"
  done
  if ((bad)); then run_failed "$part" "$what" "$rc"; fi
}

fence_run() {
  local r=$1
  CMD=("$bin/bench_fence")
  run_cmd fence 120
  case_rows fence $? "%i,$r," "run $r" "${fence_cases[@]}"
}

# The CSV names each call by its index in fence_cases (the names hold commas).
fence_table() {
  local f=$out/fence.csv i
  md
  md "### fence: driver calls on an idle device, ns per call (median of $repeat runs)"
  md
  md "| call | ns |"
  md "| --- | --- |"
  for i in "${!fence_cases[@]}"; do
    md "| ${fence_cases[$i]} | $(num %.1f "$(median "$f" 3 1="$i")") |"
  done
}

part_fence() {
  need bench_fence || return
  csv_begin fence "case,run,ns_per_call"
  local r
  for r in $(seq "$repeat"); do
    fence_run "$r"
  done
  fence_table
}

# ---------------------------------------------------------------------------
# Part copies: small async copies and memsets, and the range check on each.

copies_cases=("cuMemsetD8Async 64 B" "cuMemcpyDtoDAsync 64 B"
  "cuMemsetD8Async 1 B past a block's end (refused)"
  "cuMemsetD8Async 1 B past the same block's end (refused)")
copies_settings=(plain hooks checks)

copies_run() {
  local s=$1 r=$2
  case $s in
  plain) CMD=("$bin/bench_copies") ;;
  hooks) preload enabled:0 "$bin/bench_copies" ;;
  checks) preload leak_report:0 "$bin/bench_copies" ;;
  esac
  run_cmd copies 120
  case_rows copies $? "$s,%i,$r," "$s, run $r" "${copies_cases[@]}"
}

# The CSV names each case by its index in copies_cases.
copies_table() {
  local f=$out/copies.csv i p h c
  md
  md "### copies: ns per call through the driver API (median of $repeat runs)"
  md
  md "| call | plain | hooks (enabled:0) | hooks and checks | the check (checks − hooks; refused: checks)" \
    "| checks vs plain | target ≤ 30 ns a check | target ≤ 5% on the loop |"
  md "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for i in "${!copies_cases[@]}"; do
    p=$(median "$f" 4 1=plain 2="$i")
    h=$(median "$f" 4 1=hooks 2="$i")
    c=$(median "$f" 4 1=checks 2="$i")
    # Refused, the call under the library is the hook and the check alone.
    local cost=$c loop="n/a"
    if ((i < 2)); then
      cost=$(awk -v a="$c" -v b="$h" "$awk_lib"'BEGIN { if (isnum(a) && isnum(b)) printf "%.1f", a - b; else printf "error" }')
      loop=$(verdict "$(quotient "$c" "$p")" '<=' 1.05)
    fi
    md "| ${copies_cases[$i]} | $(num %.1f "$p") | $(num %.1f "$h") | $(num %.1f "$c")" \
      "| $cost | $(change "$c" "$p") | $(verdict "$cost" '<=' 30) | $loop |"
  done
  md
  md "4,096 live blocks of 4 KiB, 64 B at a random one's middle each call, a stream" \
    "synchronization every 256 calls; the refused memset never reaches the driver" \
    "under the library (the driver refuses it too, plain)."
}

part_copies() {
  need bench_copies || return
  csv_begin copies "setting,case,run,ns_per_call"
  local r s
  for r in $(seq "$repeat"); do
    for s in "${copies_settings[@]}"; do
      copies_run "$s" "$r"
    done
  done
  copies_table
}

# ---------------------------------------------------------------------------
# Part resnet: a PyTorch training step.

# resnet_name KEY: the setting's name in the records.
resnet_name() {
  case $1 in
  caching) echo "pytorch caching" ;;
  nocache) echo "no caching" ;;
  async) echo "cudaMallocAsync" ;;
  safe | immediate) echo "cudalloc $1" ;;
  *) return 1 ;;
  esac
}

# resnet_cmd CASE KEY: the command, in CMD.
resnet_cmd() {
  local model=${1%-*} amp=none args=()
  [[ $1 == *-bf16 ]] && amp=bf16
  read -r -a args <<<"$resnet_args"
  local py=("$python" "$root/tests/bench/resnet_step.py" --model "$model" --amp "$amp"
    ${args[@]+"${args[@]}"})
  case $2 in
  caching) CMD=("${py[@]}") ;;
  nocache) CMD=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "${py[@]}") ;;
  async) CMD=(env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync "${py[@]}") ;;
  safe | immediate)
    CMD=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$lib"
      CUDALLOC_CONF="reuse_policy:$2,leak_report:0" "${py[@]}")
    ;;
  esac
}

# steps_all PART REPEAT CASES KEYS: every case under every setting, REPEAT
# times, the settings taking turns in each repeat, into PART's CSV.
steps_all() {
  local part=$1 r c k
  csv_begin "$part" "case,setting,run,ms_per_step,peak_gib"
  for r in $(seq "$2"); do
    for c in $3; do
      for k in $4; do
        step_run "$part" "$c" "$k" "$r"
      done
    done
  done
}

# step_run PART CASE KEY RUN: one training-step run of PART (resnet):
# its command from PART_cmd, its setting's name from PART_name; the median
# step and the peak that *_step.py printed, as a CSV row.
step_run() {
  local part=$1 c=$2 k=$3 r=$4 rc ms gib name
  name=$("${part}_name" "$k")
  "${part}_cmd" "$c" "$k"
  run_cmd "$part" 600
  rc=$?
  ms=$(pick 's/^[a-z0-9_]*_step: \([0-9.]*\) ms .*/\1/p')
  gib=$(pick 's/^[a-z0-9_]*_step: peak in use \([0-9.]*\) GiB.*/\1/p')
  ((rc == 0)) || ms=error gib=error
  csv_row "$part" "$c,$name,$r,$ms,$gib"
  if [[ $ms == error || $gib == error ]]; then run_failed "$part" "$c, $name, run $r" "$rc"; fi
}

# resnet_targets KEY MS PEAK CACHING_MS CACHING_PEAK ASYNC_PEAK: the two
# verdict cells of a cudalloc row ("- | -" for the others).
resnet_targets() {
  case $1 in
  immediate)
    printf '%s | %s' "≤ +2%: $(verdict "$2" '<=' "$(awk -v c="$4" 'BEGIN { print c * 1.02 }')")" \
      "≤ cudaMallocAsync: $(verdict "$3" '<=' "$6")"
    ;;
  safe)
    printf '%s | %s' "≤ +5%: $(verdict "$2" '<=' "$(awk -v c="$4" 'BEGIN { print c * 1.05 }')")" \
      "≤ pytorch caching: $(verdict "$3" '<=' "$5")"
    ;;
  *) printf -- '- | -' ;;
  esac
}

resnet_table() {
  local c=$1 f=$out/resnet.csv k name ms gib cms cgib agib
  cms=$(median "$f" 4 1="$c" "2=pytorch caching")
  cgib=$(median "$f" 5 1="$c" "2=pytorch caching")
  agib=$(median "$f" 5 1="$c" 2=cudaMallocAsync)
  md
  md "### resnet: $c training step (median of $resnet_repeat runs)"
  md
  md "| setting | ms per step | peak in use, GiB | step vs pytorch caching" \
    "| peak vs pytorch caching | peak vs cudaMallocAsync | target: step | target: peak |"
  md "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for k in $resnet_keys; do
    name=$(resnet_name "$k")
    ms=$(median "$f" 4 1="$c" 2="$name")
    gib=$(median "$f" 5 1="$c" 2="$name")
    md "| $name | $(num %.2f "$ms") | $(num %.2f "$gib") | $(change "$ms" "$cms")" \
      "| $(ratio "$gib" "$cgib") | $(ratio "$gib" "$agib")" \
      "| $(resnet_targets "$k" "$ms" "$gib" "$cms" "$cgib" "$agib") |"
  done
}

part_resnet() {
  steps_all resnet "$resnet_repeat" "$resnet_cases" "$resnet_keys"
  local c
  for c in $resnet_cases; do
    resnet_table "$c"
  done
  md
  md "Batch 64, 224×224, SGD with momentum; bf16: torch.autocast. Peak: device memory in" \
    "use as NVML reports it (nvidia-smi), sampled after each step. cudaMallocAsync:" \
    "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync. no caching:" \
    "PYTORCH_NO_CUDA_MEMORY_CACHING=1; the cudalloc rows run that under" \
    "LD_PRELOAD=libcudalloc.so."
}

# ---------------------------------------------------------------------------
# Part slot: training steps with an allocator in PyTorch's allocator slot
# (cudalloc, plain, with expandable segments and with memcheck, and the
# floor: tests/bench/slot_floor.c), beside PyTorch's own allocators.

# slot_name KEY: the setting's name in the records (no commas: the CSV).
slot_name() {
  case $1 in
  caching) echo "pytorch caching" ;;
  caching_exp) echo "pytorch caching expandable" ;;
  async) echo "cudaMallocAsync" ;;
  preload) echo "cudalloc preloaded" ;;
  slot) echo "cudalloc slot" ;;
  slot_exp) echo "cudalloc slot expandable" ;;
  slot_memcheck) echo "cudalloc slot memcheck" ;;
  floor) echo "floor" ;;
  *) return 1 ;;
  esac
}

# slot_cmd KEY CASE...: the command that runs CASEs under setting KEY, in
# one process (tests/bench/slot_steps.py), in CMD.
slot_cmd() {
  local k=$1
  shift
  local py=("$python" "$root/tests/bench/slot_steps.py" "$@")
  local plugged=(env CUDALLOC_LIBRARY="$lib")
  case $k in
  caching) CMD=("${py[@]}") ;;
  caching_exp) CMD=(env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "${py[@]}") ;;
  async) CMD=(env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync "${py[@]}") ;;
  preload)
    CMD=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$lib"
      CUDALLOC_CONF=leak_report:0 "${py[@]}")
    ;;
  slot) CMD=("${plugged[@]}" CUDALLOC_CONF=leak_report:0 "${py[@]}" --slot) ;;
  slot_exp)
    CMD=("${plugged[@]}" CUDALLOC_CONF="leak_report:0,expandable_segments:1" "${py[@]}" --slot)
    ;;
  slot_memcheck) CMD=("${plugged[@]}" CUDALLOC_CONF="leak_report:0,memcheck:1" "${py[@]}" --slot) ;;
  floor) CMD=("${py[@]}" --plug "$bin/libslot_floor.so") ;;
  esac
}

# slot_run KEY RUN CASE...: one process of setting KEY running CASEs, one
# CSV row per case. A case whose figures were printed keeps them though a
# later one failed (slot_steps.py prints a case's lines once it is done).
slot_run() {
  local k=$1 r=$2 rc c ms gib before name bad=0
  shift 2
  name=$(slot_name "$k")
  slot_cmd "$k" "$@"
  # A hang must not eat the session: a start takes 15-25 s, a case 5-10.
  run_cmd slot $((60 + 60 * $#))
  rc=$?
  for c in "$@"; do
    ms=$(pick "s/^slot_steps: $c \([0-9.]*\) ms .*/\1/p")
    gib=$(pick "s/^slot_steps: $c peak in use \([0-9.]*\) GiB.*/\1/p")
    before=$(pick "s/^slot_steps: $c in use before \([0-9.]*\) GiB.*/\1/p")
    [[ $ms == error || $gib == error ]] && bad=1
    csv_row slot "$c,$name,$r,$ms,$gib,$before"
  done
  if ((bad || rc != 0)); then run_failed slot "$name ($*), run $r" "$rc"; fi
}

# slot_all: SLOT_REPEAT rounds; round r runs every setting once before round
# r+1 begins, so drift in the machine's speed spreads over all settings.
# With SLOT_TOGETHER=1 a run is one process per setting for all the cases
# (a third of the starts); with 0, one process per case and setting, the
# settings of a case in turn. A round is not begun past SLOT_DEADLINE_S
# seconds of the script (when the last round's length would overrun it):
# the tables then give the rounds done.
slot_all() {
  local r k c t0 last=0 cases keys
  read -r -a cases <<<"$slot_cases"
  read -r -a keys <<<"$slot_run_keys"
  csv_begin slot "case,setting,run,ms_per_step,peak_gib,before_gib"
  slot_rounds=0
  for r in $(seq "$slot_repeat"); do
    if ((slot_deadline > 0 && r > 1 && SECONDS + last > slot_deadline)); then
      say "slot: round $r of $slot_repeat not begun: it would end past" \
        "SLOT_DEADLINE_S=$slot_deadline s (now $SECONDS s, a round $last s)"
      break
    fi
    t0=$SECONDS
    if ((slot_together)); then
      for k in ${keys[@]+"${keys[@]}"}; do
        slot_run "$k" "$r" "${cases[@]}"
      done
    else
      for c in "${cases[@]}"; do
        for k in ${keys[@]+"${keys[@]}"}; do
          slot_run "$k" "$r" "$c"
        done
      done
    fi
    last=$((SECONDS - t0))
    slot_rounds=$r
    say "slot: round $r of $slot_repeat done in $last s"
  done
}

# slot_fig CASE KEY COL: the median of COL over CASE's runs of setting KEY
# ("error" when it has none: left out of SLOT_SETTINGS, or failed).
slot_fig() {
  median "$out/slot.csv" "$3" 1="$1" 2="$(slot_name "$2")"
}

# slot_target A OP B WHAT: "WHAT: PASS" (or MISS, n/a), A and B as verdict
# takes them.
slot_target() { printf '%s: %s' "$4" "$(verdict "$1" "$2" "$3")"; }

slot_table() {
  local c=$1 f=$out/slot.csv k name ms gib peer tstep tpeak peak_vs
  local cms cgib xgib sms sgib egib mms fms
  cms=$(slot_fig "$c" caching 4)
  cgib=$(slot_fig "$c" caching 5)
  xgib=$(slot_fig "$c" caching_exp 5)
  sms=$(slot_fig "$c" slot 4)
  sgib=$(slot_fig "$c" slot 5)
  egib=$(slot_fig "$c" slot_exp 5)
  mms=$(slot_fig "$c" slot_memcheck 4)
  fms=$(slot_fig "$c" floor 4)
  # The targets, as plain quotients.
  local q_step q_peak q_exp q_mem q_floor
  q_step=$(quotient "$sms" "$cms")
  q_peak=$(quotient "$sgib" "$cgib")
  q_exp=$(quotient "$egib" "$xgib")
  q_mem=$(quotient "$mms" "$sms")
  q_floor=$(quotient "$sms" "$fms")
  md
  md "### slot: $c training step (median of $slot_rounds runs, spread min–max)"
  md
  md "| setting | ms per step | spread | peak in use, GiB | step vs pytorch caching" \
    "| peak vs pytorch caching | against its peer | target: step | target: peak |"
  md "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  for k in $slot_keys; do
    name=$(slot_name "$k")
    ms=$(median "$f" 4 1="$c" 2="$name")
    gib=$(median "$f" 5 1="$c" 2="$name")
    peer=- tstep=- tpeak=- peak_vs=$(ratio "$gib" "$cgib")
    case $k in
    slot)
      peer="step $(ratio "$sms" "$fms") floor's"
      tstep=$(slot_target "$q_step" '<=' 1.00 "≤ 1.00× caching")
      tpeak=$(slot_target "$q_peak" '<=' 0.95 "≤ 0.95× caching")
      ;;
    slot_exp)
      peer="peak $(ratio "$egib" "$xgib") caching expandable's"
      tpeak=$(slot_target "$q_exp" '<=' 0.95 "≤ 0.95× caching expandable")
      ;;
    slot_memcheck)
      peer="step $(ratio "$mms" "$sms") slot's"
      tstep=$(slot_target "$q_mem" '<=' 1.3 "≤ 1.3× slot")
      ;;
    floor) peak_vs="- (its region)" ;;
    esac
    md "| $name | $(num %.2f "$ms") | $(spread %.2f 1 "$f" 4 1="$c" 2="$name") | $(num %.2f "$gib")" \
      "| $(change "$ms" "$cms") | $peak_vs | $peer | $tstep | $tpeak |"
  done
  # One line to grep for (slot-summary), with the table's quotients.
  say "slot-summary $c:" \
    "slot/caching step $(num %.4f "$q_step") $(verdict "$q_step" '<=' 1.00) (<= 1.00)," \
    "peak $(num %.3f "$q_peak") $(verdict "$q_peak" '<=' 0.95) (<= 0.95);" \
    "slot_exp/caching_exp peak $(num %.3f "$q_exp") $(verdict "$q_exp" '<=' 0.95) (<= 0.95);" \
    "slot_memcheck/slot step $(num %.3f "$q_mem") $(verdict "$q_mem" '<=' 1.3) (<= 1.3);" \
    "slot/floor step $(num %.3f "$q_floor");" \
    "ms caching $(num %.2f "$cms") slot $(num %.2f "$sms") floor $(num %.2f "$fms");" \
    "GiB caching $(num %.2f "$cgib") slot $(num %.2f "$sgib") caching_exp $(num %.2f "$xgib")" \
    "slot_exp $(num %.2f "$egib") ($slot_rounds runs)"
}

part_slot() {
  local k c
  # The floor is a library of its own: without it, its runs are not
  # started (the table says "error" for it), and the suite reports a failure.
  slot_run_keys=""
  for k in $slot_keys; do
    if [[ $k == floor && ! -f $bin/libslot_floor.so ]]; then
      say "error: $bin/libslot_floor.so was not built (see $out/build.log): no floor runs"
      failed=1
      continue
    fi
    slot_run_keys+="$k "
  done
  slot_all
  for c in $slot_cases; do
    slot_table "$c"
  done
  local grouping="one process per setting and round runs the cases in turn (SLOT_TOGETHER=1),
each case's memory freed and the cache emptied before the next"
  ((slot_together)) || grouping="one process per case, setting and round (SLOT_TOGETHER=0)"
  md
  md "Cases: gpt2, tests/bench/gpt2_step.py: GPT-2 124M, bf16 autocast, batch 8 of 512" \
    "tokens, AdamW, 15 timed steps after 3; resnet50, tests/bench/resnet_step.py: fp32," \
    "batch 64, SGD with momentum, 20 timed steps after 5; resnet152: the same, 15 timed" \
    "steps after 4 (fewer, to save time: a step is twice ResNet-50's). Runs:" \
    "tests/bench/slot_steps.py, $grouping; each round runs every setting once." \
    "Each run's figure is its median step; the table gives the median of the runs and" \
    "their spread. Peak: device memory in use (NVML), sampled after each step, the CUDA" \
    "context and what earlier cases of the process left (slot.csv, before_gib) included."
  md
  md "Settings: pytorch caching: PyTorch's own caching allocator, as it comes;" \
    "pytorch caching expandable: the same with" \
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; cudalloc slot: cudalloc in" \
    "PyTorch's allocator slot (cudalloc.torch.use(), CUDALLOC_CONF=leak_report:0)," \
    "nothing preloaded; cudalloc slot expandable: the same with expandable_segments:1;" \
    "cudalloc slot memcheck: the same with memcheck:1 (red zones, poisoned frees, a" \
    "quarantine); floor: tests/bench/slot_floor.c in the slot, a bump region and" \
    "exact-size free lists with no stream ordering (right for these single-stream steps" \
    "only), the least any allocator in the slot costs: its peak is its region" \
    "(SLOT_FLOOR_GIB, 60 GiB by default), not a figure to compare; cudaMallocAsync:" \
    "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; cudalloc preloaded:" \
    "PYTORCH_NO_CUDA_MEMORY_CACHING=1 under LD_PRELOAD=libcudalloc.so."
  md
  md "Targets: the slot's step ≤ 1.00× and its peak ≤ 0.95× PyTorch caching's; with" \
    "expandable segments, its peak ≤ 0.95× PyTorch's with them; memcheck's step ≤ 1.3×" \
    "the slot's. The slot's step against the floor's is what cudalloc itself costs" \
    "over what any allocator in the slot pays (PyTorch's bookkeeping)."
  slot_pairs
}

# What one tensor's allocation and free cost the host (tests/bench/slot_pair.py):
# PyTorch's caching allocator, the floor in the slot (PyTorch's bookkeeping
# around any plug-in) and cudalloc in the slot; one line each.
slot_pairs() {
  local k us
  md
  md "### slot: one 4 KiB tensor made and dropped (tests/bench/slot_pair.py, best of 3 x 200,000)"
  md
  md "| setting | µs per allocation and free |"
  md "| --- | --- |"
  for k in caching floor slot; do
    case $k in
    caching) CMD=("$python" "$root/tests/bench/slot_pair.py") ;;
    floor) CMD=("$python" "$root/tests/bench/slot_pair.py" --plug "$bin/libslot_floor.so") ;;
    slot) CMD=(env CUDALLOC_LIBRARY="$lib" CUDALLOC_CONF=leak_report:0
      "$python" "$root/tests/bench/slot_pair.py" --slot) ;;
    esac
    run_cmd slot 300
    us=$(pick 's/^slot_pair: .* \([0-9.]*\) us per .*/\1/p')
    md "| $(slot_name "$k") | $us |"
  done
}

# ---------------------------------------------------------------------------
# Knobs checked before anything runs: a typo must not cost a long session.

check_knobs() {
  local p c k ok=1
  for p in $parts; do
    [[ $p =~ ^(latency|mixed|threads|stacks|fence|copies|resnet|slot)$ ]] ||
      { say "unknown part '$p' (latency, mixed, threads, stacks, fence, copies, resnet, slot)"; ok=0; }
  done
  for c in $resnet_cases; do
    [[ $c =~ ^resnet(50|152)-(fp32|bf16)$ ]] ||
      { say "unknown resnet case '$c' (resnet50|resnet152 - fp32|bf16)"; ok=0; }
  done
  for k in $resnet_keys; do
    resnet_name "$k" >/dev/null ||
      { say "unknown resnet setting '$k' (caching, nocache, async, safe, immediate)"; ok=0; }
  done
  for c in $slot_cases; do
    [[ $c =~ ^(gpt2|resnet50|resnet152)$ ]] ||
      { say "unknown slot case '$c' (gpt2, resnet50, resnet152)"; ok=0; }
  done
  for k in $slot_keys; do
    slot_name "$k" >/dev/null ||
      { say "unknown slot setting '$k' (caching, caching_exp, slot, slot_exp," \
        "slot_memcheck, floor, async, preload)"; ok=0; }
  done
  [[ $slot_together =~ ^[01]$ ]] || { say "SLOT_TOGETHER must be 0 or 1"; ok=0; }
  [[ $slot_deadline =~ ^[0-9]+$ ]] ||
    { say "SLOT_DEADLINE_S must be a number of seconds (0: no limit)"; ok=0; }
  [[ $repeat =~ ^[1-9][0-9]*$ && $resnet_repeat =~ ^[1-9][0-9]*$ &&
    $slot_repeat =~ ^[1-9][0-9]*$ ]] ||
    { say "REPEAT, RESNET_REPEAT and SLOT_REPEAT must be positive integers"; ok=0; }
  ((ok))
}

main() {
  check_knobs || ca_gpu_finish 2
  open_folders || ca_gpu_finish 2
  say "results go to $out"
  : >"$out/summary.md"
  : >"$out/build.log"
  if [[ " $parts " =~ \ (latency|mixed|threads|stacks|fence)\  ]] && ! command -v nvcc >/dev/null; then
    say "nvcc not found: put the CUDA toolkit's bin folder on PATH"
    ca_gpu_finish 2
  fi
  # Parts that run only PyTorch need only the library and the floor: no
  # CUDA program is compiled (minutes of a lent machine).
  local targets=()
  [[ " $parts " =~ \ (latency|mixed|threads|stacks|fence|copies)\  ]] || targets=(cudalloc slot_floor)
  ca_gpu_build "$root" "$build" Release "$out/build.log" ${targets[@]+"${targets[@]}"} ||
    say "the build had errors (see $out/build.log): parts whose programs are missing fail"
  if [[ ! -f $lib ]]; then
    say "libcudalloc.so was not built: see $out/build.log"
    ca_gpu_finish 2
  fi
  facts | tee "$out/env.txt"
  { echo '```'; cat "$out/env.txt"; echo '```'; } >>"$out/summary.md"
  local p
  for p in $parts; do
    say "part $p"
    case $p in
    latency) part_latency ;;
    mixed) part_mixed ;;
    threads) part_threads ;;
    stacks) part_stacks ;;
    fence) part_fence ;;
    copies) part_copies ;;
    resnet) part_resnet ;;
    slot) part_slot ;;
    esac
  done
  echo
  say "results in $out (summary.md, <part>.csv, <part>.log)"
  ((failed)) && say "some runs failed: see the 'error' rows above"
  ca_gpu_finish "$failed"
}

main
