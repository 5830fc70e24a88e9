#!/usr/bin/env bash
# gpu-check.sh: every GPU check, in one go, on a GPU machine.
#
# Why: the preload tests in CI run against a mock driver; the GPU checks
# prove on real hardware that LD_PRELOAD=libcudalloc.so serves a program's
# device memory from the pool whichever way it reaches the driver, and that
# results do not change. The checks are ctest tests labelled gpu
# (tests/gpu/CMakeLists.txt lists them; tests/gpu/gpu_*.py say what each
# runs and how it is judged); this script configures and builds what they
# run, runs them at once (ctest -j, each check's programs counted against
# the cores; a check that fills the device runs alone), and writes the
# table. It needs no network and nothing beyond the machine's CUDA toolkit
# (nvcc, cmake, ninja), driver and python3 with PyTorch, CuPy, JAX; uthash
# comes along in .deps/include (git-ignored).
#
#   OUT=/some/dir scripts/gpu-check.sh      (OUT defaults to ./gpu-out)
#   scripts/gpu-check.sh --tree             the tree hash alone (below)
#
# The tree hash names what ran: a hash of every file that builds the
# library and the checks' programs or judges them (scripts/gpu-lib.sh,
# ca_gpu_tree_files), the same in a copy without .git, unchanged by docs.
# A green run counts for a commit when their hashes are equal; --tree
# prints it without a GPU and without building.
#
# Parts: GPU_CHECK_PARTS="general leaks reuse identity slot group" (the default: all)
# runs only the parts named (ctest labels gpu_<part>). Time: each program
# run stops after 120 s, and no run starts past GPU_CHECK_BUDGET_S seconds
# (default 400; the whole check takes about 100 on the H200) from the
# start: it is recorded as FAIL (not run) instead. GPU_CHECK_JOBS: ctest's
# -j, the process slots the checks share (default: the cores).
# Build folder: BUILD (default ./build-gpu, RelWithDebInfo).
# Writes into OUT: env.txt (the machine, the tree), build.log, ctest.log,
# logs/*.log (one per run), work/<check>/ (what a check's programs wrote
# for it to judge, emptied as the check starts), results/<check>.tsv (the rows) and
# <check>.fail.md (the last lines of a failed row's logs), results.tsv (all
# rows, in order), summary.md (the table printed at the end, each failed
# row's log tail, each check's time), gpu-check.log (everything printed).
# Exit status: non-zero if any row failed or was skipped (no GPU: the
# checks say so and ctest counts them skipped).

set -uo pipefail

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
CA_GPU_TAG=gpu-check
# shellcheck source=scripts/gpu-lib.sh
. scripts/gpu-lib.sh
if [[ ${1:-} == --tree && $# -eq 1 ]]; then
  ca_gpu_tree "$ROOT"
  exit
fi
if (($#)); then
  echo "usage: [OUT=DIR] [GPU_CHECK_PARTS=...] scripts/gpu-check.sh | scripts/gpu-check.sh --tree" >&2
  exit 2
fi
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
BUDGET=${GPU_CHECK_BUDGET_S:-400}
JOBS=${GPU_CHECK_JOBS:-$(nproc)}
START=$(date +%s)
TREE=$(ca_gpu_tree "$ROOT")
unset LD_PRELOAD CUDALLOC_CONF

labels='^gpu$'
if [[ -n ${GPU_CHECK_PARTS:-} ]]; then
  for p in $GPU_CHECK_PARTS; do
    [[ $p =~ ^(general|leaks|reuse|identity|slot|group)$ ]] ||
      { ca_gpu_say "unknown part '$p' (general, leaks, reuse, identity, slot, group)"; ca_gpu_finish 2; }
  done
  labels="^gpu_($(tr ' ' '|' <<<"$GPU_CHECK_PARTS" | sed 's/^|*//; s/|*$//; s/||*/|/g'))\$"
fi

ca_gpu_log_to "$OUT/gpu-check.log"
rm -rf "$OUT/results" "$OUT/logs" "$OUT/results.tsv"
ca_gpu_say "tree $TREE"
# The machine's facts (the frameworks imported) while the build runs.
ca_gpu_facts "$ROOT" >"$OUT/env.txt" 2>&1 &
FACTS=$!

FAILED=0
mkdir -p "$OUT/results"
if ca_gpu_build "$ROOT" "$BUILD" RelWithDebInfo "$OUT/build.log" gpu_check_programs; then
  printf 'build\t-\t-\t-\t-\tPASS\tthe library and the programs the checks run built\n' \
    >"$OUT/results/build.tsv"
else
  printf 'build\t-\t-\t-\t-\tFAIL\tthe build had errors: see build.log\n' >"$OUT/results/build.tsv"
  grep -m 20 -E 'error|Error' "$OUT/build.log"
fi
BUILT=$(date +%s)
wait "$FACTS"
cat "$OUT/env.txt"
if [[ -f $BUILD/tests/gpu/CTestTestfile.cmake ]]; then
  export GPU_CHECK_OUT=$OUT GPU_CHECK_DEADLINE=$((START + BUDGET))
  ca_gpu_say "running ctest -L '$labels' -j $JOBS -> $OUT/ctest.log"
  (cd "$BUILD" && ctest -L "$labels" -j "$JOBS" --output-log "$OUT/ctest.log") |
    grep -E '^ *[0-9]+/[0-9]+ Test'
else
  printf 'checks\t-\t-\t-\t-\tFAIL\tno GPU checks configured (no CUDA compiler or python3?): see build.log\n' \
    >>"$OUT/results/build.tsv"
fi

# The rows, in the order tests/gpu/CMakeLists.txt gives the checks; a check
# that left none failed.
CHECKS=()
[[ -f $BUILD/CTestTestfile.cmake ]] &&
  mapfile -t CHECKS < <(cd "$BUILD" && ctest -N -L "$labels" | sed -n 's/^ *Test *#[0-9]*: gpu_//p')
{
  cat "$OUT/results/build.tsv"
  for check in "${CHECKS[@]}"; do
    if [[ -s $OUT/results/$check.tsv ]]; then cat "$OUT/results/$check.tsv"
    else printf '%s\t-\t-\t-\t-\tFAIL\tno rows: see ctest.log\n' "$check"; fi
  done
} >"$OUT/results.tsv"
FAILED=$(awk -F'\t' '$6 == "FAIL" || $6 == "SKIP"' "$OUT/results.tsv" | wc -l)

{
  echo "# cudalloc GPU checks"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); tree $TREE (git: $(ca_gpu_commit "$ROOT"))"
  echo "- GPU, driver, memory: $(ca_gpu_line)"
  sed -n 's/^\(nvcc\|torch\|cupy\|jax\):* /- \1 /p' "$OUT/env.txt"
  echo "- total time: $(($(date +%s) - START)) s (build $((BUILT - START)) s, then the checks at" \
    "once, $JOBS programs at most); failed: $FAILED"
  echo
  echo "| check | runtime | preloaded | interception path | pooled allocs/backend allocs | result | notes |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  while IFS=$'\t' read -r name runtime pre path pooled result note; do
    ((${#note} > 160)) && note="${note:0:157}..."
    echo "| $name | $runtime | $pre | $path | $pooled | $result | ${note//|/\\|} |"
  done <"$OUT/results.tsv"
  echo
  echo "Full notes: results.tsv; output of each run: logs/<row>.log."
  if [[ -n $(cat "$OUT"/results/*.fail.md 2>/dev/null) ]]; then
    echo
    echo "## Failed rows, with the last lines of their logs"
    echo
    for check in "${CHECKS[@]}"; do
      [[ -s $OUT/results/$check.fail.md ]] && cat "$OUT/results/$check.fail.md"
    done
  fi
  echo
  echo "## Time of each check (seconds, in the order they ended)"
  echo
  sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: gpu_\([a-z0-9_]*\) \.*\** *\([A-Za-z* ]*[a-z]\) *\([0-9.]*\) sec$/- \1: \3 (\2)/p' \
    "$OUT/ctest.log" 2>/dev/null
} >"$OUT/summary.md"
echo
cat "$OUT/summary.md"
echo
if ((FAILED > 0)); then
  ca_gpu_say "$FAILED row(s) FAILED or SKIPPED; tree $TREE; logs in $OUT/logs"
  ca_gpu_finish 1
fi
ca_gpu_say "all checks passed; tree $TREE; $(($(date +%s) - START)) s; logs in $OUT/logs"
ca_gpu_finish 0
