#!/usr/bin/env bash
# The pool's own cost on the CPU, over the fake backend (no GPU needed):
# wall time from bench_pool, and instructions counted by callgrind, which
# repeat exactly run to run. Instructions are counted inside ca_pool_alloc
# and ca_pool_free only (callees included), so set-up is left out; the
# address index's look-up (ca_pool_bounds) likewise; then the
# same for counting live bytes by site (bench_sites: what stacks add). Then the
# memory the pool reserves for real training loops: allocation traces of
# ResNet-50/152 training steps and the GPT-2 varying-length loop recorded on
# an H200 (tests/bench/traces, see tests/bench/trace_alloc.c), and, through
# PyTorch's allocator slot with each call's stream (tests/bench/slot_trace.c),
# the GPT-2 step bench-gpu.sh times and a ResNet-50 step fed from a side
# stream with record_stream (tests/bench/sidestream_step.py), replayed by
# bench_replay, with plain and with expandable segments, and with each
# request and free on its stream as through the allocator slot
# (+stream: streams' free blocks), the least any placement that 2 MiB-aligned
# blocks over 1 MiB, as the driver does, could reserve for the same trace,
# and what PyTorch's caching allocator's placement reserves for it
# (tests/bench/pytorch_policy.py, a model checked against the H200).
# Both repeat exactly. Then the instructions the library adds to a cached
# cuMemAlloc and cuMemFree through its hooks (bench_hooks over the mock
# driver; exact too). Last, what the range check
# of a small async memset or copy costs (bench_copies against the mock
# driver, whose own call is cheap: plain, hooks only with enabled:0, hooks
# and checks; wall time, so it varies a little run to run),
# so scripts/test.sh runs this last and a regression shows in CI's log.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
ca_ensure_deps valgrind

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target bench_pool bench_replay bench_sites bench_copies bench_hooks cudalloc mockcuda -j "$(nproc)" >/dev/null
bench=build/tests/bench/bench_pool

echo "== wall time (1,000,000 operations each)"
"$bench" pair 1000000
"$bench" mixed 1000000

per_op() { # operations, functions (a,b), command... -> instructions per operation
  local ops=$1 fns toggles=() total
  IFS=, read -ra fns <<<"$2"
  shift 2
  for fn in "${fns[@]}"; do toggles+=(--toggle-collect="$fn"); done
  total=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "${toggles[@]}" "$@" 2>&1 |
    sed -n 's/.*Collected : *//p')
  awk -v t="$total" -v n="$ops" 'BEGIN { printf "%.0f", t / n }'
}

count() { # mode, operations, reuse[, expandable] -> instructions per operation
  per_op "$2" ca_pool_alloc,ca_pool_free "$bench" "$1" "$2" "$3" ${4:+"$4"}
}

echo
echo "== instructions (callgrind, inside ca_pool_alloc and ca_pool_free)"
for reuse in immediate safe; do
  printf 'pair  %-9s %s instructions per allocate+free pair\n' "$reuse" "$(count pair 200000 "$reuse")"
  printf 'mixed %-9s %s instructions per operation\n' "$reuse" "$(count mixed 200000 "$reuse")"
done
for reuse in immediate safe; do # expandable_segments:1
  printf 'pair  %-9s %s instructions per allocate+free pair, expandable segments\n' "$reuse" \
    "$(count pair 200000 "$reuse" expandable)"
done

echo
echo "== which live block holds an address (the look-up behind range checks; ca_pool_bounds)"
"$bench" locate 2000000 safe
printf 'locate %s instructions per look-up (the three spreads together)\n' \
  "$(per_op 600000 ca_pool_bounds "$bench" locate 200000 safe)"

echo
echo "== live bytes by allocation site, with stacks on (callgrind, inside ca_sites_alloc and ca_sites_free)"
for growth in off growth; do
  printf 'sites growth %-3s %s instructions per allocate+free pair\n' "${growth/growth/on}" \
    "$(per_op 200000 ca_sites_alloc,ca_sites_free build/tests/bench/bench_sites 200000 "$growth")"
done

echo
echo "== memory reserved for real training loops (bench_replay, traces of 6 steps)"
for trace in tests/bench/traces/*.trace.gz; do
  for reuse in immediate safe immediate+expandable safe+expandable safe+stream \
    safe+expandable+stream; do
    printf '%-19s %-22s ' "$(basename "$trace" .trace.gz)" "$reuse"
    replay=$(zcat "$trace" | build/tests/bench/bench_replay - "$reuse")
    sed -n 's/^bench_replay: peak requested \([0-9.]*\) GiB.*reserved \([0-9.]*\) GiB.*/held \1 GiB, reserved \2 GiB/p' <<<"$replay" | tr -d '\n'
    sed -n 's/^bench_replay: overhead \([0-9.]*%\).*/ (+\1)/p' <<<"$replay"
  done
  # The same for any placement: it depends on the trace alone.
  printf '%-19s %-22s %s\n' "$(basename "$trace" .trace.gz)" "driver's alignment" \
    "$(sed -n 's/^bench_replay: blocks over 1 MiB .* at least \([0-9.]*\) GiB.*/reserved at least \1 GiB, by any placement/p' <<<"$replay")"
  # The peer: PyTorch's caching allocator's placement on the same trace.
  printf '%-19s %-22s %s\n' "$(basename "$trace" .trace.gz)" "PyTorch's placement" \
    "$(python3 tests/bench/pytorch_policy.py "$trace" | sed -n 's/^pytorch_policy: [^ ]* peak requested \([0-9.]*\) GiB, reserved \([0-9.]*\) GiB, overhead \(.*\)/held \1 GiB, reserved \2 GiB (+\3)/p')"
done

echo
echo "== what the library adds to a cached cuMemAlloc and cuMemFree (callgrind, bench_hooks over the mock driver)"
# Counted inside the library's cuMemAlloc_v2 and cuMemFree_v2, callees
# included (the mock's own functions of those names excluded: callgrind
# toggles off inside them); valgrind cannot map the mock's default 64 GiB
# of addresses, hence MOCKCUDA_SPAN_MB. "own" leaves out what the driver's
# cuCtxGetCurrent costs inside them: the library asks it once per
# allocation, its cost is the driver's, and the mock's takes a lock. Under
# reuse_policy:safe (the default) a 4 KiB request takes back a block freed
# many requests ago, behind a fence the mock makes at once; a 16 MiB one
# is counted too: a large block merges as it comes back, so its way back
# is not the small one's, and a change can cost one and not the other.
# The layers composed around the pool are the defaults' unless the settings
# name more (concerns/compose.c).
hook_counts() { # conf, function[, bytes] -> "all own" instructions per call
  local out=/tmp/cudalloc_bench_hooks.$$ total driver
  total=$(MOCKCUDA_SPAN_MB=8192 LD_LIBRARY_PATH="$mock_dir" CUDALLOC_CONF="$1" \
    LD_PRELOAD="$root/build/libcudalloc.so" valgrind --tool=callgrind --callgrind-out-file="$out" \
    --toggle-collect="$2" build/tests/bench/bench_hooks 100000 "${3:-4096}" 2>&1 |
    sed -n 's/.*Collected : *//p')
  driver=$(callgrind_annotate --inclusive=yes --auto=no "$out" 2>/dev/null | awk '/:cuCtxGetCurrent /{gsub(",", "", $1); print $1; exit}')
  rm -f "$out"
  awk -v t="$total" -v d="${driver:-0}" 'BEGIN { printf "%.0f %.0f", t / 100000, (t - d) / 100000 }'
}
mock_dir="$(dirname "$(find build/tests/mockcuda -name 'libcuda.so.1' | head -1)")"
for conf in reuse_policy:immediate reuse_policy:safe reuse_policy:immediate,backtrace_depth:8 enabled:0; do
  for fn in cuMemAlloc_v2 cuMemFree_v2; do
    read -r all own <<<"$(hook_counts "$conf" "$fn")"
    printf '%-40s %-14s %4s instructions per call, %4s own\n' "$conf" "$fn" "$all" "$own"
  done
done
for fn in cuMemAlloc_v2 cuMemFree_v2; do
  read -r all own <<<"$(hook_counts reuse_policy:safe "$fn" $((16 << 20)))"
  printf '%-40s %-14s %4s instructions per call, %4s own\n' "reuse_policy:safe, 16 MiB" "$fn" "$all" "$own"
done

echo
echo "== range checks on small async memsets and copies (bench_copies, mock driver)"
mock="$(dirname "$(find build/tests/mockcuda -name 'libcuda.so.1' | head -1)")"
for mode in plain hooks checks; do
  case $mode in
  plain) env=() ;;
  hooks) env=(LD_PRELOAD="$root/build/libcudalloc.so" CUDALLOC_CONF=enabled:0) ;;
  checks) env=(LD_PRELOAD="$root/build/libcudalloc.so" CUDALLOC_CONF=leak_report:0) ;;
  esac
  env LD_LIBRARY_PATH="$mock" "${env[@]}" build/tests/bench/bench_copies | sed "s/^bench_copies: /$mode  /"
done
