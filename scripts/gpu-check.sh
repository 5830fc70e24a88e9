#!/usr/bin/env bash
# gpu-check.sh: every GPU check, in one go, on the GPU machine.
#
# Why: the preload tests in CI run against a mock driver; this proves on real
# hardware that LD_PRELOAD=libcudalloc.so serves a program's device memory
# from the pool whichever way the program reaches the driver (the runtime's
# dlsym + cuGetProcAddress, a program linked to libcuda, JAX's dlsym of exact
# names) and that results do not change. It needs no network and no packages
# beyond what the machine has: CUDA 13 (nvcc, cmake, ninja), driver, python3
# with PyTorch, CuPy, JAX; uthash comes along in .deps/include (git-ignored).
#
# Steps: machine facts; build the library (CMake, tests off: no cmocka) and
# the test programs (nvcc, sm_90); then each check, see tests/gpu/*:
#   alloc_fill (static runtime, and -cudart=shared), driver_api (linked to
#     libcuda): without the library, preloaded (pooling required), and
#     preloaded with CUDALLOC_CONF=enabled:0 (nothing pooled, still correct);
#   torch_cnn (PYTORCH_NO_CUDA_MEMORY_CACHING=1): without and preloaded,
#     losses compared to a relative 1e-5;
#   cupy_check (CuPy's pool off): without and preloaded;
#   jax_check (XLA_PYTHON_CLIENT_PREALLOCATE=false): without, preloaded, and
#     preloaded with XLA_PYTHON_CLIENT_ALLOCATOR=platform (pooling recorded);
#   alloc_fill under compute-sanitizer memcheck, without and preloaded;
#   the leak report (docs/LEAKS.md), from examples/leaky_loop.cu, built in
#     the library's build with the static runtime and with -cudart shared:
#     the group, its first frame (the line marked "LEAK: this line") and
#     the SUMMARY with backtrace_depth:16; --fixed reporting no leaks; the
#     grouping by size without stacks; the JSON document in a log_path
#     file; leak_exitcode; and examples/torch_leak.py (no caching), whose
#     report at the end of training must show a group of one allocation
#     per step, and --fixed none (and, with examples/torch.supp, nothing
#     leaked at exit); cudaDeviceReset in mid-program (reset_leak.cu)
#     reported at the reset and correct after it;
#   stream-safe reuse (issue 5, CUDALLOC_CONF=reuse_policy:...):
#     hazard.cu (a kernel still writing a freed block, the new block used
#     on another stream) without the library, under the default, safe and
#     device_sync: never overwritten; under immediate: the count, INFO;
#     graph_replay.cu (a captured graph with memory nodes, replayed with
#     allocations around it) without the library and under each policy;
#     oom_limit.cu under memory_limit_mb:1024, and without it (--max 24);
#     torch_streams.py (two streams, tensors freed while still read):
#     without and preloaded, results compared to a relative 1e-6.
#
# Run from anywhere (it moves to the repository root; a relative OUT is
# taken from there):
#   OUT=/some/dir scripts/gpu-check.sh        (OUT defaults to ./gpu-out)
# Writes: $OUT/env.txt (machine facts), $OUT/logs/*.log (one per build step
# and check), $OUT/*.json (PyTorch losses and results),
# $OUT/logs/leak.<pid>.json (the JSON leak report), $OUT/summary.md (the
# table printed at the end), $OUT/results.tsv (the same rows with untruncated notes),
# $OUT/gpu-check.log (everything this script printed).
#
# Each check is judged by its content: the program's own verdict line (it
# computes and compares its results, and holds the library's statistics to
# an expectation), and the script's reading of its output: the pooled count
# parsed from the "pooled:" line, the way the allocations reached the library
# (CUDALLOC_CONF=verbose:2 makes the library log every hook it hands out),
# and, for PyTorch, the two runs' losses compared here. Exit status: non-zero
# if any check failed. The compute-sanitizer rows and hazard under
# reuse_policy:immediate are informative only.
#
# Parts: GPU_CHECK_PARTS="general leaks reuse identity" (the default: all)
# runs only the parts named, after the machine facts and the builds:
#   general   sections 4 (CUDA C, driver API, PyTorch, CuPy, JAX, sanitizer)
#   leaks     section 5 (the leak report)
#   reuse     section 6 (stream-safe reuse, graphs, out of memory)
#   identity  section 7 (a pooled block looks like its own allocation:
#             CUDA IPC, pointer queries, free memory; driver facts)
#
# Time: each check runs under `timeout` (120 s at most), and the whole script
# keeps within GPU_CHECK_BUDGET_S seconds (default 400): a check that would
# start past the budget is recorded as FAIL (not run) instead.

set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/logs
BUILD=$ROOT/build-gpu
BIN=$BUILD/gpu-tests
LIB=$BUILD/libcudalloc.so
BUDGET=${GPU_CHECK_BUDGET_S:-400}
CHECK_TIMEOUT=120
START=$SECONDS

# Everything printed also goes to $OUT/gpu-check.log.
exec > >(tee "$OUT/gpu-check.log") 2>&1
TEE_PID=$!

# Ends the script once tee has written everything.
finish() {
  exec >&- 2>&-
  wait "$TEE_PID" 2>/dev/null
  exit "$1"
}

export PYTHONDONTWRITEBYTECODE=1 # keep tests/gpu free of __pycache__
unset LD_PRELOAD CUDALLOC_CONF

RESULTS=$OUT/results.tsv
: >"$RESULTS"
FAILED=0

say() { printf '[gpu-check %3ds] %s\n' $((SECONDS - START)) "$*"; }

# Whether part $1 is to run: every part (general leaks reuse identity)
# unless GPU_CHECK_PARTS names some.
want() { [[ -z ${GPU_CHECK_PARTS:-} || " $GPU_CHECK_PARTS " == *" $1 "* ]]; }

# record NAME RUNTIME PRELOADED PATH POOLED RESULT NOTE
# RESULT: PASS, FAIL (counts against the exit status) or INFO (does not).
record() {
  local note=${7//$'\t'/ }
  note=${note//$'\n'/; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" "$6" \
    "$note" >>"$RESULTS"
  [[ $6 == FAIL ]] && FAILED=$((FAILED + 1))
  say "$1: $6${7:+ ($note)}"
}

# Seconds a step may still take: CHECK_TIMEOUT, less near the budget's end.
time_left() {
  local left=$((BUDGET - (SECONDS - START) - 10))
  ((left > CHECK_TIMEOUT)) && left=$CHECK_TIMEOUT
  ((left < 1)) && left=1
  echo "$left"
}

# ---------------------------------------------------------------------------
# 1. The machine

say "environment -> $OUT/env.txt"
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -srm)"
  echo "glibc: $(ldd --version 2>&1 | head -n1)"
  echo "== nvidia-smi"
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv || echo "nvidia-smi failed"
  echo "== nvcc"
  nvcc --version || echo "nvcc not found"
  echo "== cmake / ninja"
  cmake --version | head -n1 || echo "cmake not found"
  echo "ninja $(ninja --version 2>/dev/null || echo 'not found')"
  echo "== compute-sanitizer"
  compute-sanitizer --version 2>&1 | tail -n1 || echo "compute-sanitizer not found"
  echo "== python"
  python3 --version
  timeout 60 python3 -c '
try:
    import torch
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "cudnn", torch.backends.cudnn.version(),
          "available", torch.cuda.is_available())
except Exception as e:
    print("torch: not importable:", e)
try:
    import torchvision
    print("torchvision", torchvision.__version__)
except Exception as e:
    print("torchvision: not importable:", e)
' || echo "torch: version query failed"
  timeout 60 python3 -c '
try:
    import cupy
    print("cupy", cupy.__version__,
          "runtime", cupy.cuda.runtime.runtimeGetVersion(),
          "driver", cupy.cuda.runtime.driverGetVersion())
except Exception as e:
    print("cupy: not importable:", e)
' || echo "cupy: version query failed"
  timeout 60 python3 -c '
try:
    import jax, jaxlib
    print("jax", jax.__version__, "jaxlib", jaxlib.__version__)
except Exception as e:
    print("jax: not importable:", e)
' || echo "jax: version query failed"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
GPU_LINE=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader 2>/dev/null | head -n1)

# ---------------------------------------------------------------------------
# 2. The library

say "building libcudalloc.so -> $LOGS/build-lib.log"
# Reuse the generator of an existing build folder; else prefer Ninja (the
# machine may have no make).
GEN=()
if [[ ! -f $BUILD/CMakeCache.txt ]] && command -v ninja >/dev/null; then
  GEN=(-G Ninja)
fi
# The same build makes the CUDA examples (examples/CMakeLists.txt, built
# when it finds nvcc: named here so an older cache cannot hide it). The
# library is built on its own first, so a failing example fails one row.
NVCC_BIN=$(command -v nvcc || true)
CUDA_OPT=()
[[ -n $NVCC_BIN ]] && CUDA_OPT=(-DCMAKE_CUDA_COMPILER="$NVCC_BIN")
if timeout "$(time_left)" cmake -S . -B "$BUILD" ${GEN[@]+"${GEN[@]}"} \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCUDALLOC_BUILD_TESTS=OFF \
  ${CUDA_OPT[@]+"${CUDA_OPT[@]}"} \
  -DCUDALLOC_UTHASH_DIR="$ROOT/.deps/include" >"$LOGS/build-lib.log" 2>&1 &&
  timeout "$(time_left)" cmake --build "$BUILD" --target cudalloc -j "$(nproc)" \
    >>"$LOGS/build-lib.log" 2>&1 && [[ -f $LIB ]]; then
  missing=""
  for sym in cuMemAlloc_v2 cuMemFree_v2 cuGetProcAddress cuGetProcAddress_v2 \
    dlsym cudalloc_get_stats; do
    nm -D --defined-only "$LIB" 2>/dev/null | awk '{print $NF}' |
      grep -qx "$sym" || missing="$missing $sym"
  done
  if [[ -z $missing ]]; then
    record build_lib - - - - PASS "exports the driver names, dlsym, cudalloc_get_stats"
  else
    record build_lib - - - - FAIL "exports missing:$missing"
  fi
else
  record build_lib - - - - FAIL "build failed: see logs/build-lib.log"
  LIB=""
fi

# ---------------------------------------------------------------------------
# 3. The test programs

CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "${NVCC_BIN:-/usr/local/cuda/bin/nvcc}")")")}
CUDA_LIBDIR=$CUDA_HOME/lib64
[[ -d $CUDA_LIBDIR ]] || CUDA_LIBDIR=$CUDA_HOME/lib
STUBS=()
[[ -d $CUDA_LIBDIR/stubs ]] && STUBS=(-L"$CUDA_LIBDIR/stubs")
mkdir -p "$BIN"
NVCC_FLAGS=(-O2 -lineinfo -I"$ROOT/include" -Xcompiler -Wall)

# needs FILE LIBRARY: whether FILE lists LIBRARY (a prefix) as DT_NEEDED.
needs() { readelf -d "$1" 2>/dev/null | grep -q "NEEDED.*\[$2"; }

build_prog() { # NAME LOGNAME nvcc-args...
  local name=$1 logname=$2
  shift 2
  say "building $name -> $LOGS/$logname.log"
  timeout "$(time_left)" nvcc "$@" >"$LOGS/$logname.log" 2>&1 && [[ -x $BIN/$name ]]
}

BUILT_STATIC=0 BUILT_SHARED=0 BUILT_DRIVER=0
notes=()
if build_prog alloc_fill_static build-alloc_fill_static -arch=sm_90 \
  "${NVCC_FLAGS[@]}" -o "$BIN/alloc_fill_static" tests/gpu/alloc_fill.cu -ldl; then
  if needs "$BIN/alloc_fill_static" libcudart.so; then
    notes+=("alloc_fill_static links libcudart.so")
  else BUILT_STATIC=1; fi
else notes+=("alloc_fill_static failed"); fi
if build_prog alloc_fill_shared build-alloc_fill_shared -arch=sm_90 -cudart=shared \
  "${NVCC_FLAGS[@]}" -Xlinker -rpath -Xlinker "$CUDA_LIBDIR" \
  -o "$BIN/alloc_fill_shared" tests/gpu/alloc_fill.cu -ldl; then
  if needs "$BIN/alloc_fill_shared" libcudart.so; then BUILT_SHARED=1
  else notes+=("alloc_fill_shared does not link libcudart.so"); fi
else notes+=("alloc_fill_shared failed"); fi
if build_prog driver_api build-driver_api "${NVCC_FLAGS[@]}" \
  -o "$BIN/driver_api" tests/gpu/driver_api.c ${STUBS[@]+"${STUBS[@]}"} -lcuda -ldl; then
  if needs "$BIN/driver_api" libcuda.so.1; then BUILT_DRIVER=1
  else notes+=("driver_api does not link libcuda.so.1"); fi
else notes+=("driver_api failed"); fi
if ((BUILT_STATIC && BUILT_SHARED && BUILT_DRIVER)); then
  record build_programs - - - - PASS "static runtime, shared runtime (libcudart.so), driver API (libcuda.so.1)"
else
  record build_programs - - - - FAIL "${notes[*]}; see logs/build-*.log"
fi

# The Python checks read the statistics through a ctypes mirror of
# cudalloc_device_stats: its size and offsets must be the C compiler's.
say "comparing the ctypes mirror of cudalloc_device_stats with the header"
if python3 tests/gpu/cudalloc_stats.py --c-layout >"$BIN/stats_layout.c" &&
  timeout "$(time_left)" nvcc -I"$ROOT/include" -o "$BIN/stats_layout" \
    "$BIN/stats_layout.c" >"$LOGS/stats_layout.log" 2>&1 &&
  "$BIN/stats_layout" >"$BIN/stats_layout.c.txt" &&
  python3 tests/gpu/cudalloc_stats.py --py-layout >"$BIN/stats_layout.py.txt" &&
  diff "$BIN/stats_layout.c.txt" "$BIN/stats_layout.py.txt" >>"$LOGS/stats_layout.log"; then
  record stats_layout - - - - PASS "$(head -n1 "$BIN/stats_layout.c.txt"), offsets match"
else
  record stats_layout - - - - FAIL "tests/gpu/cudalloc_stats.py does not match include/cudalloc.h; see logs/stats_layout.log"
fi

# The leak examples (examples/leaky_loop.cu), in the library's build: the
# static runtime (leaky_loop) and the shared one (leaky_loop_shared).
LL_STATIC=$BUILD/examples/leaky_loop
LL_SHARED=$BUILD/examples/leaky_loop_shared
say "building the leak examples -> $LOGS/build-examples.log"
if [[ -z $NVCC_BIN ]]; then
  record build_examples - - - - FAIL "nvcc not found: the leak examples are not built"
elif timeout "$(time_left)" cmake --build "$BUILD" --target leaky_loop leaky_loop_shared \
  -j "$(nproc)" >"$LOGS/build-examples.log" 2>&1 && [[ -x $LL_STATIC && -x $LL_SHARED ]]; then
  if needs "$LL_STATIC" libcudart.so; then
    record build_examples - - - - FAIL "leaky_loop links libcudart.so; want the static runtime"
  elif ! needs "$LL_SHARED" libcudart.so; then
    record build_examples - - - - FAIL "leaky_loop_shared does not link libcudart.so"
  else
    record build_examples - - - - PASS "leaky_loop (static runtime), leaky_loop_shared (libcudart.so)"
  fi
else
  record build_examples - - - - FAIL "build failed: see logs/build-examples.log"
fi

# ---------------------------------------------------------------------------
# Running and judging one check

# How allocations reached the library, from the verbose:2 log: the ways that
# handed out our cuMemAlloc_v2 hook; "export" when none did yet the pool
# served allocations (the program bound the exported name at load time).
path_of() { # LOG ALLOCS
  local ways
  ways=$(sed -n 's/^cudalloc: hooked cuMemAlloc_v2 via \([A-Za-z_]*\).*/\1/p' "$1" |
    sort -u | paste -sd+ -)
  if [[ -n $ways ]]; then echo "$ways"
  elif [[ $2 =~ ^[0-9]+$ ]] && (($2 > 0)); then echo export
  else
    ways=$(sed -n 's/^cudalloc: hooked .* via \([A-Za-z_]*\).*/\1/p' "$1" |
      sort -u | paste -sd+ -)
    echo "${ways:+hooks via $ways, no cuMemAlloc_v2}${ways:-none seen}"
  fi
}

# judge_run LOG TAG RC LIMIT: adds to WHY what no run may show: a timeout
# (RC 124 or 137, after LIMIT seconds) or another non-zero exit, and no
# "TAG: PASS" line (the program's first "TAG: FAIL" line, when it has one).
judge_run() {
  local verdict
  if (($3 == 124 || $3 == 137)); then WHY+=("timed out after ${4}s")
  elif (($3 != 0)); then WHY+=("exit status $3"); fi
  if ! grep -qx "$2: PASS" "$1"; then
    verdict=$(grep -E "^$2: FAIL" "$1" | head -n1)
    WHY+=("${verdict:-no \"$2: PASS\" line}")
  fi
}

# judge_no_library LOG POOLED: adds to WHY what a run without the library
# may not show: a "pooled:" line (POOLED, its last) other than "pooled:
# none", or any line of the library's.
judge_no_library() {
  [[ $2 == "pooled: none"* ]] || WHY+=("expected no library, saw: ${2:-no pooled line}")
  if grep -q '^cudalloc: ' "$1"; then WHY+=("library output in a run without it"); fi
}

# run_check NAME RUNTIME MODE POOLING TAG -- COMMAND...
#   MODE     plain (no library), pool (preloaded, verbose:2), off (preloaded,
#            enabled:0), sanitizer-plain / sanitizer-pool (under
#            compute-sanitizer; result INFO, never FAIL)
#   POOLING  required: the pool must have served > MIN_ALLOCS allocations
#            with backend_allocs < 10% of them; recorded: numbers only
#   TAG      the program's verdict prefix ("TAG: PASS")
# MIN_ALLOCS (default 100) may be set in the environment of the call.
run_check() {
  local name=$1 runtime=$2 mode=$3 pooling=$4 tag=$5
  shift 6
  local log=$LOGS/$name.log preloaded=no info=0 env_add=() prefix=()
  case $mode in
  pool) preloaded=yes env_add=(LD_PRELOAD="$LIB" CUDALLOC_CONF=verbose:2) ;;
  off) preloaded="yes, enabled:0"
    env_add=(LD_PRELOAD="$LIB" "CUDALLOC_CONF=enabled:0,verbose:2") ;;
  sanitizer-plain) info=1 prefix=(compute-sanitizer --tool memcheck) ;;
  sanitizer-pool) info=1 preloaded=yes
    env_add=(LD_PRELOAD="$LIB" CUDALLOC_CONF=verbose:2)
    prefix=(compute-sanitizer --tool memcheck) ;;
  esac
  local fail_word=FAIL
  ((info)) && fail_word=INFO
  if [[ $preloaded != no && -z $LIB ]]; then
    record "$name" "$runtime" "$preloaded" - - "$fail_word" "not run: library not built"
    return
  fi
  if [[ ! -e $1 && ! $1 =~ ^python ]]; then
    record "$name" "$runtime" "$preloaded" - - "$fail_word" "not run: $1 not built"
    return
  fi
  local limit
  limit=$(time_left)
  if ((limit < 15)); then
    record "$name" "$runtime" "$preloaded" - - "$fail_word" "not run: time budget (${BUDGET}s) spent"
    return
  fi
  say "running $name (timeout ${limit}s) -> $log"
  {
    echo "# $name: ${env_add[*]:-} ${prefix[*]:-} $*"
    echo "# started $(date -u '+%H:%M:%S')"
  } >"$log"
  local t0=$SECONDS rc
  # LD_PRELOAD goes to the program (and compute-sanitizer, which passes it
  # on to its target), never to timeout or the shell.
  timeout -k 10 "$limit" env -u LD_PRELOAD -u CUDALLOC_CONF \
    ${env_add[@]+"${env_add[@]}"} ${prefix[@]+"${prefix[@]}"} "$@" >>"$log" 2>&1
  rc=$?
  local secs=$((SECONDS - t0))

  # What the output shows.
  local WHY=() pooled allocs=- backend=- hits=-
  pooled=$(grep -E '^pooled: ' "$log" | tail -n1)
  if [[ $pooled =~ allocs=([0-9]+)\ backend_allocs=([0-9]+)\ cache_hits=([0-9]+) ]]; then
    allocs=${BASH_REMATCH[1]} backend=${BASH_REMATCH[2]} hits=${BASH_REMATCH[3]}
  fi
  judge_run "$log" "$tag" "$rc" "$limit"
  case $mode in
  plain | sanitizer-plain) judge_no_library "$log" "$pooled" ;;
  off)
    [[ $allocs == 0 ]] || WHY+=("enabled:0 should pool nothing, saw: ${pooled:-no pooled line}")
    ;;
  pool | sanitizer-pool)
    if [[ $allocs == - ]]; then
      WHY+=("no pool statistics: ${pooled:-no pooled line}")
    elif [[ $pooling == required ]]; then
      ((allocs > ${MIN_ALLOCS:-100})) || WHY+=("only $allocs allocations pooled")
      ((backend * 10 < allocs)) || WHY+=("backend_allocs $backend not below 10% of $allocs")
    fi
    ;;
  esac
  local path=-
  [[ $preloaded != no ]] && path=$(path_of "$log" "$allocs")
  local note="${secs}s"
  [[ $hits != - ]] && note="$note, cache hits $hits"
  local others
  others=$(grep '^cudalloc: ' "$log" | grep -vc '^cudalloc: hooked ')
  ((others > 0)) && note="$note, $others other library line(s) in the log"
  if [[ $mode == sanitizer-* ]]; then
    local summary
    summary=$(grep -E 'ERROR SUMMARY: [0-9]+ error' "$log" | tail -n1 | sed 's/^=* *//')
    note="$note, memcheck: ${summary:-no ERROR SUMMARY line (tool incompatible?)}"
  fi
  ((${#WHY[@]})) && note="$note; $(printf '%s; ' "${WHY[@]}")"
  note=${note%; }
  local result=PASS
  ((${#WHY[@]})) && result=$fail_word
  record "$name" "$runtime" "$preloaded" "$path" "$allocs/$backend" "$result" "$note"
}

# ---------------------------------------------------------------------------
# 4. Checks
if want general; then

# A preloaded process that never touches CUDA prints nothing and exits 0.
if [[ -n $LIB ]]; then
  true_out=$(env LD_PRELOAD="$LIB" /bin/true 2>&1)
  true_rc=$?
  if ((true_rc == 0)) && [[ -z $true_out ]]; then
    record preload_true none yes - - PASS "/bin/true: silent, exit 0"
  else
    record preload_true none yes - - FAIL "/bin/true: exit $true_rc, output: ${true_out:0:200}"
  fi
fi

AF_STATIC=$BIN/alloc_fill_static
AF_SHARED=$BIN/alloc_fill_shared
DRV=$BIN/driver_api

run_check alloc_fill_static_plain static plain recorded alloc_fill -- "$AF_STATIC" plain
run_check alloc_fill_static_pool static pool required alloc_fill -- "$AF_STATIC" pooled
run_check alloc_fill_static_off static off recorded alloc_fill -- "$AF_STATIC" passthrough
run_check alloc_fill_shared_plain shared plain recorded alloc_fill -- "$AF_SHARED" plain
run_check alloc_fill_shared_pool shared pool required alloc_fill -- "$AF_SHARED" pooled
run_check alloc_fill_shared_off shared off recorded alloc_fill -- "$AF_SHARED" passthrough
run_check driver_api_plain driver plain recorded driver_api -- "$DRV" plain
run_check driver_api_pool driver pool required driver_api -- "$DRV" pooled
run_check driver_api_off driver off recorded driver_api -- "$DRV" passthrough

# PyTorch: its caching allocator off, so every tensor is a cudaMalloc; the
# two runs' losses must agree.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
rm -f "$OUT/torch_plain.json" "$OUT/torch_pool.json"
run_check torch_cnn_plain torch plain recorded torch_cnn -- \
  python3 tests/gpu/torch_cnn.py "$OUT/torch_plain.json" --expect plain
run_check torch_cnn_pool torch pool required torch_cnn -- \
  python3 tests/gpu/torch_cnn.py "$OUT/torch_pool.json" --expect pooled
unset PYTORCH_NO_CUDA_MEMORY_CACHING
cmp_out=$(python3 - "$OUT/torch_plain.json" "$OUT/torch_pool.json" <<'EOF' 2>&1
import json, math, sys
try:
    a = json.load(open(sys.argv[1]))["losses"]
    b = json.load(open(sys.argv[2]))["losses"]
except Exception as e:
    print("FAIL cannot read both loss files: %s" % e)
    sys.exit(0)
if len(a) != len(b) or not a:
    print("FAIL %d losses without the library, %d with" % (len(a), len(b)))
    sys.exit(0)
worst = max(abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in zip(a, b))
same = all(x == y for x, y in zip(a, b))
ok = all(math.isclose(x, y, rel_tol=1e-5, abs_tol=0.0) for x, y in zip(a, b))
print("%s %d losses, max relative difference %.3g, %s" % (
    "PASS" if ok else "FAIL", len(a), worst,
    "bit-identical" if same else "not bit-identical"))
EOF
)
say "torch loss comparison: $cmp_out"
if [[ $cmp_out == "PASS "* ]]; then
  record torch_cnn_losses_match torch "no vs yes" - - PASS "${cmp_out#PASS }"
else
  record torch_cnn_losses_match torch "no vs yes" - - FAIL "${cmp_out#FAIL }"
fi

# CuPy: static runtime, its memory pool off.
run_check cupy_plain cupy plain recorded cupy_check -- \
  python3 tests/gpu/cupy_check.py --expect plain
run_check cupy_pool cupy pool required cupy_check -- \
  python3 tests/gpu/cupy_check.py --expect pooled

# JAX: no preallocation; then the platform allocator (a driver allocation
# per buffer). Pooling is recorded, not required.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
run_check jax_plain jax plain recorded jax_check -- \
  python3 tests/gpu/jax_check.py --expect plain
run_check jax_pool jax pool recorded jax_check -- \
  python3 tests/gpu/jax_check.py --expect any
export XLA_PYTHON_CLIENT_ALLOCATOR=platform
run_check jax_platform_pool "jax (platform allocator)" pool recorded jax_check -- \
  python3 tests/gpu/jax_check.py --expect any
unset XLA_PYTHON_CLIENT_PREALLOCATE XLA_PYTHON_CLIENT_ALLOCATOR

# compute-sanitizer memcheck on a short alloc_fill (300 iterations, sizes
# below 4 MiB), without and with the library: informative only.
if command -v compute-sanitizer >/dev/null; then
  run_check sanitizer_alloc_fill_plain static sanitizer-plain recorded alloc_fill -- \
    "$AF_STATIC" plain 300 22
  run_check sanitizer_alloc_fill_pool static sanitizer-pool recorded alloc_fill -- \
    "$AF_STATIC" any 300 22
else
  record sanitizer_alloc_fill static - - - INFO "compute-sanitizer not found"
fi

fi # general
# ---------------------------------------------------------------------------
# 5. The leak report
#
# Judged by its content, against the form docs/LEAKS.md gives it: the leak
# groups, the first frame of a group, the SUMMARY line, the JSON document,
# the exit code. leaky_loop leaks 100 buffers of 1 MiB, all from the
# cudaMalloc line marked "LEAK: this line" in examples/leaky_loop.cu (its
# number is read from the source here); --fixed frees every one.
# torch_leak.py keeps two tensors per training step and prints the report
# itself at the end of training (Python frees everything before exit).

LEAK_BYTES=104857600
LEAK_COUNT=100
LEAK_GROUP_RE='^cudalloc: [0-9]+ bytes leaked in [0-9]+ allocation\(s\)'
# The same groups in the report printed on request (cudalloc_print_report),
# which calls the blocks live rather than leaked.
LIVE_GROUP_RE='^cudalloc: [0-9]+ bytes live in [0-9]+ allocation\(s\)'
LEAK_MARKER=$(grep -n 'LEAK: this line' examples/leaky_loop.cu | cut -d: -f1)
[[ $LEAK_MARKER =~ ^[0-9]+$ ]] || LEAK_MARKER="" # none, or several
TORCH_STEPS=40
WHY=()

# leak_record NAME RUNTIME CONF RESULT NOTE (CONF "-": run without the
# library). The JSON log path is shown relative to $OUT.
leak_record() {
  local pre=no
  [[ $3 != - ]] && pre="yes${3:+, ${3//$LOGS/logs}}"
  record "$1" "$2" "$pre" - - "$4" "$5"
}

# preload_run NAME LOG CONF LIMIT KILL COMMAND...: runs COMMAND with the
# library preloaded and CUDALLOC_CONF=CONF ("-": without the library, "":
# empty) under `timeout -k KILL LIMIT`, its output in LOG after a line
# saying what ran. Returns COMMAND's exit status.
preload_run() {
  local name=$1 log=$2 conf=$3 limit=$4 kill=$5
  shift 5
  local env_add=(LD_PRELOAD="$LIB" CUDALLOC_CONF="$conf")
  [[ $conf == - ]] && env_add=()
  say "running $name (timeout ${limit}s) -> $log"
  echo "# $name: ${env_add[*]:-(no library)} $*" >"$log"
  timeout -k "$kill" "$limit" env -u LD_PRELOAD -u CUDALLOC_CONF \
    ${env_add[@]+"${env_add[@]}"} "$@" >>"$log" 2>&1
}

# leak_run NAME RUNTIME CONF COMMAND...: runs COMMAND with the library
# preloaded and CUDALLOC_CONF=CONF ("-": without the library, "": empty),
# its output in LEAK_LOG ($LOGS/NAME.log), its exit status in LEAK_RC.
# Returns 1, and records NAME as FAIL, when it cannot run.
leak_run() {
  local name=$1 runtime=$2 conf=$3
  shift 3
  LEAK_LOG=$LOGS/$name.log LEAK_RC=-
  WHY=()
  local skip="" limit
  limit=$(time_left)
  if [[ $conf != - && -z $LIB ]]; then skip="library not built"
  elif ! [[ -x $1 ]] && ! command -v "$1" >/dev/null; then skip="$1 not built"
  elif [[ -z $LEAK_MARKER ]]; then skip="no single 'LEAK: this line' in examples/leaky_loop.cu"
  elif ((limit < 15)); then skip="time budget (${BUDGET}s) spent"
  fi
  if [[ -n $skip ]]; then
    leak_record "$name" "$runtime" "$conf" FAIL "not run: $skip"
    return 1
  fi
  preload_run "$name" "$LEAK_LOG" "$conf" "$limit" 10 "$@"
  LEAK_RC=$?
}

# leak_verdict NAME RUNTIME CONF PASS_NOTE [FACTS]: PASS when no WHY was
# given; FACTS (what the output showed) go in the note either way.
leak_verdict() {
  local note
  if ((${#WHY[@]})); then
    note="${5:+$5; }$(printf '%s; ' "${WHY[@]}")"
    leak_record "$1" "$2" "$3" FAIL "${note%; }"
  else
    note="$4${5:+; $5}"
    leak_record "$1" "$2" "$3" PASS "${note#; }"
  fi
}

expect_rc() { # WANT
  [[ $LEAK_RC == "$1" ]] && return
  if [[ $LEAK_RC == 124 || $LEAK_RC == 137 ]]; then WHY+=("timed out")
  else WHY+=("exit status $LEAK_RC, want $1"); fi
}

expect_groups() { # WANT: how many leak groups the text report shows
  local n
  n=$(grep -cE "$LEAK_GROUP_RE" "$LEAK_LOG")
  ((n == $1)) || WHY+=("$n leak group(s), want $1")
}

expect_summary() {
  local want="cudalloc: SUMMARY: $LEAK_BYTES bytes leaked in $LEAK_COUNT allocations"
  grep -qxF "$want" "$LEAK_LOG" || WHY+=("no line \"$want\"")
}

# 1, 2: with stacks, one group whose first frame is the marked line.
check_leak_stacks() { # NAME RUNTIME PROGRAM
  local conf=backtrace_depth:16 frame0=""
  leak_run "$1" "$2" "$conf" "$3" || return
  local want="cudalloc: $LEAK_BYTES bytes leaked in $LEAK_COUNT allocation(s) on device 0, allocated from:"
  local frame_re="^cudalloc: +#0 .*leaky_loop\.cu:${LEAK_MARKER}([^0-9]|$)"
  expect_rc 0
  expect_groups 1
  if grep -qxF "$want" "$LEAK_LOG"; then
    frame0=$(awk -v want="$want" 'hit { print; exit } $0 == want { hit = 1 }' "$LEAK_LOG")
    [[ $frame0 =~ $frame_re ]] ||
      WHY+=("frame #0 is not leaky_loop.cu:$LEAK_MARKER${frame0:+ (shown above)}")
  else
    WHY+=("no line \"$want\"")
  fi
  expect_summary
  local shown=${frame0#cudalloc:}
  shown=${shown#"${shown%%[! ]*}"} # without the prefix and the indent
  leak_verdict "$1" "$2" "$conf" "" "frame #0: ${shown:--}"
}

# 3: the fixed twin leaks nothing.
check_leak_fixed() { # NAME RUNTIME PROGRAM
  local conf=backtrace_depth:16 line
  leak_run "$1" "$2" "$conf" "$3" --fixed || return
  expect_rc 0
  line=$(grep -m1 -E '^cudalloc: no device memory leaks' "$LEAK_LOG")
  [[ -n $line ]] || WHY+=("no line \"cudalloc: no device memory leaks ...\"")
  if grep -qE '^cudalloc: SUMMARY: ' "$LEAK_LOG"; then WHY+=("a SUMMARY of leaks"); fi
  expect_groups 0
  leak_verdict "$1" "$2" "$conf" "${line#cudalloc: }"
}

# 4: without stacks, leaks are grouped by size, with the hint.
check_leak_nostack() { # NAME RUNTIME PROGRAM
  local want_re="^cudalloc: $LEAK_BYTES bytes leaked in $LEAK_COUNT allocation\(s\) of 1048576 bytes on device 0:?$"
  leak_run "$1" "$2" "" "$3" || return
  expect_rc 0
  expect_groups 1
  grep -qE "$want_re" "$LEAK_LOG" ||
    WHY+=("no line \"cudalloc: $LEAK_BYTES bytes leaked in $LEAK_COUNT allocation(s) of 1048576 bytes on device 0:\"")
  grep -qE '^cudalloc: .*CUDALLOC_CONF=backtrace_depth' "$LEAK_LOG" ||
    WHY+=("no hint line about backtrace_depth")
  expect_summary
  leak_verdict "$1" "$2" "" "grouped by size, hint present"
}

# 5: the JSON report, in the log_path file, one document per line.
check_leak_json() { # NAME RUNTIME PROGRAM
  local conf="backtrace_depth:16,report_format:json,log_path:$LOGS/leak.%p.json" verdict
  if [[ $LOGS == *,* ]]; then # CUDALLOC_CONF items are split at commas
    leak_record "$1" "$2" "$conf" FAIL "not run: the path of OUT contains a comma"
    return
  fi
  rm -f "$LOGS"/leak.*.json
  leak_run "$1" "$2" "$conf" "$3" || return
  expect_rc 0
  if grep -q '^cudalloc: ' "$LEAK_LOG"; then WHY+=("library output on stderr despite log_path"); fi
  verdict=$(python3 - "$LOGS" "$LEAK_MARKER" "$LEAK_BYTES" "$LEAK_COUNT" <<'PYEOF' 2>&1
import glob, json, sys
logs, marker, want_bytes, want_count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
files = sorted(glob.glob(logs + "/leak.*.json"))
bad, docs = [], []
for name in files:
    with open(name) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except ValueError as e:
                    bad.append("%s line %d is not JSON (%s)" % (name.split("/")[-1], n, e))
exits = [d for d in docs if isinstance(d, dict) and d.get("event") == "exit"]
if not files:
    bad.append("no logs/leak.<pid>.json written")
elif len(exits) != 1:
    bad.append("%d documents with event exit in %d file(s), want 1" % (len(exits), len(files)))
else:
    doc = exits[0]
    leaks = [g for g in doc.get("leaks", []) if not g.get("suppressed")]
    if len(leaks) != 1:
        bad.append("%d leak groups, want 1" % len(leaks))
    groups = [g for g in leaks if g.get("count") == want_count and g.get("bytes") == want_bytes]
    if not groups:
        bad.append("no group of count %d and bytes %d: %s" % (
            want_count, want_bytes, [(g.get("count"), g.get("bytes")) for g in leaks]))
    else:
        frames = groups[0].get("frames") or []
        if not any(str(f.get("file") or "").endswith("leaky_loop.cu") and f.get("line") == marker
                   for f in frames):
            bad.append("no frame at leaky_loop.cu:%d; frames: %s" % (marker, [
                "%s:%s" % (f.get("file"), f.get("line")) for f in frames[:4]]))
    summary = doc.get("summary") or {}
    if summary.get("bytes") != want_bytes or summary.get("count") != want_count:
        bad.append("summary %s" % json.dumps(summary))
print("FAIL " + "; ".join(bad) if bad else
      "PASS %d document(s), one group of %d, a frame at leaky_loop.cu:%d"
      % (len(docs), want_count, marker))
PYEOF
  )
  local note=${verdict#PASS }
  [[ $verdict == "PASS "* ]] || { WHY+=("${verdict#FAIL }") && note=""; }
  leak_verdict "$1" "$2" "$conf" "$note"
}

# 7: leak_exitcode turns a leak into an exit status, and only a leak.
check_leak_exitcode() { # NAME RUNTIME PROGRAM WANT ARGS...
  local name=$1 runtime=$2 prog=$3 want=$4 conf=leak_exitcode:23
  shift 4
  leak_run "$name" "$runtime" "$conf" "$prog" "$@" || return
  expect_rc "$want"
  leak_verdict "$name" "$runtime" "$conf" "exit status $LEAK_RC"
}

# The examples themselves, without the library.
check_leak_plain() { # NAME RUNTIME PROGRAM
  leak_run "$1" "$2" - "$3" || return
  expect_rc 0
  grep -qE '^leaky_loop: 100 iterations' "$LEAK_LOG" || WHY+=("no 'leaky_loop: 100 iterations' line")
  if grep -q '^cudalloc: ' "$LEAK_LOG"; then WHY+=("library output in a run without it"); fi
  leak_verdict "$1" "$2" - "runs on the GPU"
}

# 6: torch_leak.py's report at the end of training: a group of one
# allocation per step (the kept outputs, the kept losses), and none with
# --fixed. Only the report the script prints counts, not the one at exit.
check_torch_leak() { # NAME ARGS...
  local name=$1 conf=backtrace_depth:16 fixed=0 section groups growth hits
  shift
  [[ $* == *--fixed* ]] && fixed=1
  leak_run "$name" torch "$conf" python3 examples/torch_leak.py --steps "$TORCH_STEPS" "$@" ||
    return
  expect_rc 0
  section=$(awk '/^torch_leak: cudalloc.s report/ { on = 1; next }
                 /==[0-9]+== .*\(at exit\)/ { on = 0 } on' "$LEAK_LOG")
  groups=$(grep -oE "$LIVE_GROUP_RE" <<<"$section" | awk '{ print $6 "x" $2 "B" }' |
    paste -sd' ' -)
  hits=$(grep -oE "$LIVE_GROUP_RE" <<<"$section" |
    awk -v s="$TORCH_STEPS" '$6 > 0 && $6 % s == 0' | wc -l)
  growth=$(sed -n 's/.*(\([-+][0-9.]*\) MiB since step 1).*/\1/p' "$LEAK_LOG" | tail -n1)
  if ! grep -q '^cudalloc: ' <<<"$section"; then
    WHY+=("no report printed at the end of training")
  elif ((fixed && hits > 0)); then
    WHY+=("$hits group(s) of a multiple of $TORCH_STEPS allocations: $groups")
  elif ((!fixed && hits == 0)); then
    WHY+=("no group of a multiple of $TORCH_STEPS allocations: ${groups:-no groups}")
  fi
  leak_verdict "$name" torch "$conf" "" \
    "groups (count x bytes): ${groups:-none}; memory growth ${growth:-?} MiB over $TORCH_STEPS steps"
}

# 6b: at exit, PyTorch still holds what it keeps to the end by design (cuBLAS
# handles and workspaces); examples/torch.supp sets exactly that aside, so
# the fixed loop ends with the one line for no leaks, counting them apart.
check_torch_exit_suppressed() { # NAME
  local name=$1 conf=backtrace_depth:16,suppressions:examples/torch.supp line
  leak_run "$name" torch "$conf" python3 examples/torch_leak.py --steps "$TORCH_STEPS" --fixed ||
    return
  expect_rc 0
  line=$(grep -E '^cudalloc: no device memory leaks \(' "$LEAK_LOG" | tail -n1)
  [[ -n $line ]] || WHY+=("no 'no device memory leaks' line at exit")
  if grep -qE '^cudalloc: SUMMARY: [0-9]+ bytes leaked' "$LEAK_LOG"; then
    WHY+=("a SUMMARY of leaks at exit")
  fi
  leak_verdict "$name" torch "$conf" "${line#cudalloc: }"
}

# 8: cudaDeviceReset in mid-program (tests/gpu/reset_leak.cu): the blocks
# it kills unfreed are reported at the reset, the pool forgets their
# segments, and the program allocates and computes correctly afterwards.
check_reset_leak() { # NAME
  local name=$1 prog=$BIN/reset_leak
  build_prog reset_leak build-reset_leak -arch=sm_90 "${NVCC_FLAGS[@]}" \
    -o "$prog" tests/gpu/reset_leak.cu || true
  leak_run "$name" static "" "$prog" || return
  expect_rc 0
  grep -qx 'reset_leak: PASS' "$LEAK_LOG" || WHY+=("no 'reset_leak: PASS'")
  grep -qE '^cudalloc: ==[0-9]+== device memory leak report \(at context reset of device 0\)$' \
    "$LEAK_LOG" || WHY+=("no report at the context reset")
  grep -qxF 'cudalloc: 2097152 bytes leaked in 2 allocation(s) of 1048576 bytes on device 0:' \
    "$LEAK_LOG" || WHY+=("the reset report does not show the 2 unfreed blocks")
  grep -qE '^cudalloc: no device memory leaks \(' "$LEAK_LOG" ||
    WHY+=("no 'no device memory leaks' at exit")
  leak_verdict "$name" static "" "reported at the reset, correct after it"
}

if want leaks; then
check_leak_plain leaky_loop_static_plain static "$LL_STATIC"
check_leak_plain leaky_loop_shared_plain shared "$LL_SHARED"
check_leak_stacks leak_static_stacks static "$LL_STATIC"
check_leak_stacks leak_shared_stacks shared "$LL_SHARED"
check_leak_fixed leak_static_fixed static "$LL_STATIC"
check_leak_fixed leak_shared_fixed shared "$LL_SHARED"
check_leak_nostack leak_static_nostack static "$LL_STATIC"
check_leak_json leak_static_json static "$LL_STATIC"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
check_torch_leak leak_torch
check_torch_leak leak_torch_fixed --fixed
check_torch_exit_suppressed leak_torch_exit_suppressed
unset PYTORCH_NO_CUDA_MEMORY_CACHING
check_leak_exitcode leak_exitcode_leaky static "$LL_STATIC" 23
check_leak_exitcode leak_exitcode_fixed static "$LL_STATIC" 0 --fixed
check_reset_leak leak_reset
fi # leaks

# ---------------------------------------------------------------------------
# 6. Stream-safe reuse (issue 5)
#
# CUDALLOC_CONF=reuse_policy:safe|immediate|device_sync (default safe). A
# pooled free does not wait for the device as cudaFree does; these checks
# hold each policy to what it promises, by content:
#   hazard (tests/gpu/hazard.cu): a kernel on one stream still to write a
#     block when the host frees it, the new block used on another stream.
#     Without the library, under the default, reuse_policy:safe and
#     device_sync: no round may see the new block overwritten (the
#     program's "result" line, read here: overwritten=0), and under
#     device_sync no free may return before the kernel ended (pending=0).
#     Under immediate the overwritten rounds are the documented hazard: the
#     row is INFO with the count (FAIL only if the program itself failed);
#   graph_replay: a graph captured in global mode with memory nodes,
#     replayed 100 times with plain allocations and frees around it: correct
#     results without the library and under every policy;
#   oom_limit: under memory_limit_mb:1024, 64 MiB blocks until
#     cudaErrorMemoryAllocation (at least 14), the error cleared, memory
#     freed and obtained again, contents checked; without the library it
#     stops at --max 24 with no failure;
#   torch_streams (PYTORCH_NO_CUDA_MEMORY_CACHING=1): tensors crossing two
#     streams and dropped while the other stream reads them; the results
#     without and with the library must agree (relative 1e-6).
# Every preloaded run must show the pool served the program's allocations
# (its "pooled:" line), and the library must have accepted CUDALLOC_CONF
# (no "CUDALLOC_CONF: ..." complaint in the log).

HZ=$BIN/hazard GR=$BIN/graph_replay OOM=$BIN/oom_limit
notes=()
want reuse || notes=(skipped)
for prog in hazard graph_replay oom_limit; do
  want reuse || break
  if build_prog "$prog" "build-$prog" -arch=sm_90 -cudart=static "${NVCC_FLAGS[@]}" \
    -o "$BIN/$prog" "tests/gpu/$prog.cu" -ldl; then
    needs "$BIN/$prog" libcudart.so && notes+=("$prog links libcudart.so")
  else
    notes+=("$prog failed")
    rm -f "$BIN/$prog"
  fi
done
if [[ ${notes[*]} == skipped ]]; then
  :
elif ((${#notes[@]})); then
  record build_reuse_programs - - - - FAIL "${notes[*]}; see logs/build-*.log"
else
  record build_reuse_programs - - - - PASS "hazard, graph_replay, oom_limit (static runtime)"
fi

# reuse_run NAME RUNTIME CONF MAX_SECONDS TAG COMMAND...: runs COMMAND
# without the library (CONF "-") or preloaded with CUDALLOC_CONF=CONF (""
# for the default), for at most MAX_SECONDS. Its output goes to REUSE_LOG,
# the pooled line's numbers to REUSE_POOLED ("allocs/backend_allocs"), and
# to WHY whatever any run must not show: a non-zero exit, no "TAG: PASS",
# the library where it should be absent, or absent, idle or complaining
# about CUDALLOC_CONF where it should serve. Returns 1, recording NAME as
# FAIL, when it cannot run.
reuse_run() {
  local name=$1 runtime=$2 conf=$3 max_t=$4 tag=$5
  shift 5
  REUSE_LOG=$LOGS/$name.log REUSE_POOLED=-/-
  WHY=()
  local skip="" limit
  limit=$(time_left)
  ((limit > max_t)) && limit=$max_t
  if [[ $conf != - && -z $LIB ]]; then skip="library not built"
  elif ! [[ -x $1 ]] && ! command -v "$1" >/dev/null; then skip="$1 not built"
  elif ((limit < max_t && limit < 15)); then skip="time budget (${BUDGET}s) spent"
  fi
  if [[ -n $skip ]]; then
    reuse_record "$name" "$runtime" "$conf" FAIL "not run: $skip"
    return 1
  fi
  local t0=$SECONDS rc
  preload_run "$name" "$REUSE_LOG" "$conf" "$limit" 5 "$@"
  rc=$?
  REUSE_SECS=$((SECONDS - t0))
  judge_run "$REUSE_LOG" "$tag" "$rc" "$limit"
  reuse_check_library "$conf"
  return 0
}

# What the "pooled:" and "program:" lines show, against CONF (reuse_run).
reuse_check_library() {
  local pooled mine allocs=""
  pooled=$(grep -E '^pooled: ' "$REUSE_LOG" | tail -n1)
  mine=$(sed -n 's/^program: allocs=\([0-9]*\) .*/\1/p' "$REUSE_LOG" | tail -n1)
  if [[ $pooled =~ allocs=([0-9]+)\ backend_allocs=([0-9]+) ]]; then
    allocs=${BASH_REMATCH[1]}
    REUSE_POOLED=$allocs/${BASH_REMATCH[2]}
  fi
  if [[ $1 == - ]]; then
    judge_no_library "$REUSE_LOG" "$pooled"
    return
  fi
  if [[ -z $allocs ]]; then
    WHY+=("no pool statistics: ${pooled:-no pooled line}")
  elif [[ -n $mine ]] && ((allocs < mine)); then
    WHY+=("the pool served $allocs allocations, the program made $mine")
  elif ((allocs == 0)); then
    WHY+=("the pool served no allocation")
  fi
  local complaint
  complaint=$(grep -m1 -E '^(cudalloc: )?CUDALLOC_CONF: ' "$REUSE_LOG")
  [[ -z $complaint ]] || WHY+=("CUDALLOC_CONF=$1 not accepted: $complaint")
}

# reuse_record NAME RUNTIME CONF RESULT NOTE
reuse_record() {
  local pre=no
  [[ $3 != - ]] && pre="yes, ${3:-default}"
  record "$1" "$2" "$pre" - "$REUSE_POOLED" "$4" "$5"
}

# reuse_verdict NAME RUNTIME CONF RESULT FACTS: RESULT (PASS or INFO) when
# no WHY was given, FAIL otherwise; FACTS go in the note either way.
reuse_verdict() {
  local note="${REUSE_SECS:-?}s${5:+, $5}"
  if ((${#WHY[@]})); then
    reuse_record "$1" "$2" "$3" FAIL "$note; $(printf '%s; ' "${WHY[@]}" | sed 's/; $//')"
  else
    reuse_record "$1" "$2" "$3" "$4" "$note"
  fi
}

# check_hazard NAME CONF MODE: MODE safe (nothing overwritten), sync (also
# no free returned before the kernel ended) or report (INFO: the count).
check_hazard() {
  local name=$1 conf=$2 mode=$3 line rounds over reused pending arg=safe
  [[ $mode == report ]] && arg=report
  reuse_run "$name" static "$conf" 20 hazard "$HZ" "$arg" || return
  line=$(grep -E '^hazard: result ' "$REUSE_LOG" | tail -n1)
  if [[ $line =~ rounds=([0-9]+)\ overwritten=([0-9]+)\ reused=([0-9]+)\ pending=([0-9]+) ]]; then
    rounds=${BASH_REMATCH[1]} over=${BASH_REMATCH[2]}
    reused=${BASH_REMATCH[3]} pending=${BASH_REMATCH[4]}
    [[ $mode != report ]] && ((over > 0)) &&
      WHY+=("$over of $rounds rounds had the new block overwritten")
    [[ $mode == sync ]] && ((pending > 0)) &&
      WHY+=("$pending frees returned while the kernel still ran: no device wait")
  else
    WHY+=("no 'hazard: result' line")
  fi
  local result=PASS
  [[ $mode == report ]] && result=INFO
  reuse_verdict "$name" static "$conf" "$result" \
    "overwritten ${over:-?}/${rounds:-?} rounds, address reused ${reused:-?}, kernel still running after the free ${pending:-?}"
}

check_graph() { # NAME CONF
  reuse_run "$1" static "$2" 20 graph_replay "$GR" 100 || return
  local facts
  facts=$(sed -n 's/^graph_replay: \([0-9]* replays checked\).*/\1/p' "$REUSE_LOG" | tail -n1)
  reuse_verdict "$1" static "$2" PASS "${facts:-no replay count}"
}

check_oom() { # NAME CONF ARGS...
  local name=$1 conf=$2 line
  shift 2
  reuse_run "$name" static "$conf" 20 oom_limit "$OOM" "$@" || return
  line=$(sed -n 's/^oom_limit: result //p' "$REUSE_LOG" | tail -n1)
  [[ -n $line ]] || WHY+=("no 'oom_limit: result' line")
  reuse_verdict "$name" static "$conf" PASS "${line:-}"
}

if want reuse; then
check_hazard hazard_plain - safe
check_hazard hazard_default "" safe
check_hazard hazard_safe reuse_policy:safe safe
check_hazard hazard_device_sync reuse_policy:device_sync sync
check_hazard hazard_immediate reuse_policy:immediate report
# The same with the streams ordered only through the legacy stream (two
# blocking streams), and with a per-thread default stream: what the fence's
# one event on the legacy stream must order.
export HAZARD_STREAMS=blocking
check_hazard hazard_safe_blocking reuse_policy:safe safe
check_hazard hazard_immediate_blocking reuse_policy:immediate report
export HAZARD_STREAMS=perthread
check_hazard hazard_safe_perthread reuse_policy:safe safe
unset HAZARD_STREAMS

check_graph graph_replay_plain -
check_graph graph_replay_default ""
check_graph graph_replay_safe reuse_policy:safe
check_graph graph_replay_immediate reuse_policy:immediate
check_graph graph_replay_device_sync reuse_policy:device_sync

check_oom oom_limit_plain - --max 24
check_oom oom_limit_1024 memory_limit_mb:1024 --limit-mb 1024 --max 24

# PyTorch, two streams: the results without and with the library compared.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
rm -f "$OUT/torch_streams_plain.json" "$OUT/torch_streams_pool.json"
reuse_run torch_streams_plain torch - 30 torch_streams \
  python3 tests/gpu/torch_streams.py "$OUT/torch_streams_plain.json" --expect plain &&
  reuse_verdict torch_streams_plain torch - PASS ""
reuse_run torch_streams_pool torch "" 30 torch_streams \
  python3 tests/gpu/torch_streams.py "$OUT/torch_streams_pool.json" --expect pooled &&
  reuse_verdict torch_streams_pool torch "" PASS ""
unset PYTORCH_NO_CUDA_MEMORY_CACHING
cmp_out=$(python3 - "$OUT/torch_streams_plain.json" "$OUT/torch_streams_pool.json" <<'EOF' 2>&1
import json, math, sys
try:
    a = json.load(open(sys.argv[1]))["results"]
    b = json.load(open(sys.argv[2]))["results"]
except Exception as e:
    print("FAIL cannot read both result files: %s" % e)
    sys.exit(0)
if len(a) != len(b) or not a:
    print("FAIL %d results without the library, %d with" % (len(a), len(b)))
    sys.exit(0)
worst = max(abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in zip(a, b))
bad = [i for i, (x, y) in enumerate(zip(a, b))
       if not math.isclose(x, y, rel_tol=1e-6, abs_tol=0.0)]
print("%s %d results, max relative difference %.3g, %s%s" % (
    "FAIL" if bad else "PASS", len(a), worst,
    "bit-identical" if a == b else "not bit-identical",
    ", first differing step %d of %d differing" % (bad[0], len(bad)) if bad else ""))
EOF
)
say "torch_streams comparison: $cmp_out"
if [[ $cmp_out == "PASS "* ]]; then
  record torch_streams_match torch "no vs yes" - - PASS "${cmp_out#PASS }"
else
  record torch_streams_match torch "no vs yes" - - FAIL "${cmp_out#FAIL }"
fi
fi # reuse

# ---------------------------------------------------------------------------
# 7. A pooled block looks like its own allocation
#
# What a program asks the driver about its memory, instead of only using
# it, must get the answer it would get without the pool:
#   ipc_check.cu: CUDA IPC to a second process (blocks at and after a
#     segment's start; the importer with and without the library; a block
#     freed while an importer holds it must not be handed out again; a
#     stream-ordered pool's exported pointer), pointer queries on a 1000 B
#     block, and cudaMemGetInfo's free memory, less the margin the driver
#     itself needs (searched for without the library, then used with it),
#     allocated in one piece;
#   driver_probe (tests/mockcuda): without the library its output must be
#     driver_facts.txt, what the mock is diffed against in CI (the new
#     output is kept as $OUT/driver_facts.txt); with it, its answers about
#     allocations (attributes, ranges, SYNC_MEMOPS, IPC handles and an
#     importing process, free memory) must be the same;
#   torch_ipc.py (torch.multiprocessing, PyTorch's caching allocator on and
#     off) and cupy_ipc.py (CuPy's pool on and off): each without and with
#     the library, which must end as the run without it did.

# The verdict line a run ended with ("TAG: PASS", "TAG: UNSUPPORTED: ...",
# "TAG: FAIL: ..."), addresses blanked out; "none" when there is none.
verdict_of() {
  local v
  v=$(grep -E "^$2: (PASS|UNSUPPORTED|FAIL)" "$1" | tail -n1 | sed -E 's/0x[0-9a-f]+/0x?/g')
  echo "${v:-none}"
}

# pair_run NAME RUNTIME TAG [VAR=VALUE...] -- COMMAND...: COMMAND without
# and with the library (the environment given to both); PASS when the run
# with it ends with the verdict of the run without it, and that is no FAIL.
pair_run() {
  local name=$1 runtime=$2 tag=$3 envs=() limit t0=$SECONDS
  shift 3
  while [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  if [[ -z $LIB ]]; then
    record "$name" "$runtime" "no vs yes" - - FAIL "not run: library not built"
    return
  fi
  limit=$(time_left)
  preload_run "${name}_plain" "$LOGS/${name}_plain.log" - "$limit" 5 env ${envs[@]+"${envs[@]}"} "$@"
  limit=$(time_left)
  preload_run "${name}_pool" "$LOGS/${name}_pool.log" "" "$limit" 5 env ${envs[@]+"${envs[@]}"} "$@"
  local plain pool result=PASS
  plain=$(verdict_of "$LOGS/${name}_plain.log" "$tag")
  pool=$(verdict_of "$LOGS/${name}_pool.log" "$tag")
  [[ $pool == "$plain" && $plain != none && $plain != *": FAIL"* ]] || result=FAIL
  record "$name" "$runtime" "no vs yes" - - "$result" \
    "$((SECONDS - t0))s; without: ${plain#"$tag: "}; with: ${pool#"$tag: "}"
}

# The driver_probe lines about what describes an allocation.
identity_lines() {
  grep -E '^(attribute|attributes|refused attributes|BUFFER_ID|SYNC_MEMOPS|set |P2P_TOKENS|address range, NULL|ipc:|import:|cuMemAlloc\(free - 4 MiB\))' "$1"
}

if want identity; then
  IPC=$BIN/ipc_check PROBE=$BIN/driver_probe
  build_prog ipc_check build-ipc_check -arch=sm_90 "${NVCC_FLAGS[@]}" -o "$IPC" \
    tests/gpu/ipc_check.cu ${STUBS[@]+"${STUBS[@]}"} -lcuda -ldl || rm -f "$IPC"
  say "building driver_probe -> $LOGS/build-driver_probe.log"
  cc -std=c11 -D_GNU_SOURCE -I"$CUDA_HOME/include" -o "$PROBE" tests/mockcuda/driver_probe.c \
    tests/mockcuda/driver_probe_ipc.c ${STUBS[@]+"${STUBS[@]}"} -lcuda -ldl -lpthread \
    >"$LOGS/build-driver_probe.log" 2>&1 || rm -f "$PROBE"

  run_check ipc_check_plain static plain recorded ipc_check -- "$IPC" plain 0
  margin=$(sed -n 's/^ipc_check: free margin \([0-9]*\) MiB.*/\1/p' "$LOGS/ipc_check_plain.log" | tail -n1)
  run_check ipc_check_pool static pool recorded ipc_check -- "$IPC" any "${margin:-4}"

  if [[ -x $PROBE ]]; then
    say "running driver_probe -> $OUT/driver_facts.txt"
    timeout 120 "$PROBE" >"$OUT/driver_facts.txt" 2>"$LOGS/driver_probe.log"
    if diff -u tests/mockcuda/driver_facts.txt "$OUT/driver_facts.txt" >>"$LOGS/driver_probe.log"; then
      record driver_facts driver no - - PASS "the driver answers as tests/mockcuda/driver_facts.txt says"
    else
      record driver_facts driver no - - FAIL "answers differ from tests/mockcuda/driver_facts.txt: see logs/driver_probe.log; the new ones are in driver_facts.txt"
    fi
    if [[ -n $LIB ]]; then
      timeout 120 env LD_PRELOAD="$LIB" CUDALLOC_CONF=leak_report:0 "$PROBE" \
        >"$LOGS/driver_probe_pool.out" 2>"$LOGS/driver_probe_pool.log"
      if diff <(identity_lines "$OUT/driver_facts.txt") <(identity_lines "$LOGS/driver_probe_pool.out") \
        >>"$LOGS/driver_probe_pool.log"; then
        record driver_probe_pool driver yes - - PASS "$(identity_lines "$OUT/driver_facts.txt" | wc -l) answers about allocations the same as without the library"
      else
        record driver_probe_pool driver yes - - FAIL "answers about allocations differ from the run without the library: see logs/driver_probe_pool.log"
      fi
    fi
  else
    record driver_facts driver no - - FAIL "driver_probe not built: see logs/build-driver_probe.log"
  fi

  pair_run torch_ipc_caching torch torch_ipc -- python3 tests/gpu/torch_ipc.py
  pair_run torch_ipc_no_caching torch torch_ipc PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- \
    python3 tests/gpu/torch_ipc.py
  pair_run cupy_ipc_pool_off cupy cupy_ipc -- python3 tests/gpu/cupy_ipc.py
  pair_run cupy_ipc_pool_on cupy cupy_ipc -- python3 tests/gpu/cupy_ipc.py --pool
fi # identity

# ---------------------------------------------------------------------------
# 8. Summary

SUMMARY=$OUT/summary.md
{
  echo "# cudalloc GPU checks"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
  echo "- GPU, driver, memory: ${GPU_LINE:-unknown}"
  echo "- $(grep -m1 '^Cuda compilation tools' "$OUT/env.txt" || echo 'nvcc: unknown')"
  grep -E '^(torch|cupy|jax) ' "$OUT/env.txt" | sed 's/^/- /'
  echo "- total time: $((SECONDS - START)) s; failed: $FAILED"
  echo
  echo "| check | runtime | preloaded | interception path | pooled allocs/backend allocs | result | notes |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  while IFS=$'\t' read -r name runtime pre path pooled result note; do
    ((${#note} > 160)) && note="${note:0:157}..."
    echo "| $name | $runtime | $pre | $path | $pooled | $result | ${note//|/\\|} |"
  done <"$RESULTS"
  echo
  echo "Full notes: results.tsv; output of each step: logs/<check>.log."
} >"$SUMMARY"
echo
cat "$SUMMARY"
echo
if ((FAILED > 0)); then
  say "$FAILED check(s) FAILED; logs in $LOGS"
  finish 1
fi
say "all checks passed; logs in $LOGS"
finish 0
