#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz and runs fuzz_config
# for the given number of seconds (default 60) over a copy of the seed
# corpus, so that the corpus the fuzzer grows never lands in the repository.
# Exits non-zero when the fuzzer finds a crash; the input is left in
# build-fuzz/artifacts/.
set -euo pipefail

seconds="${1:-60}"
if ! [[ "$seconds" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [seconds, default 60]" >&2
  exit 2
fi
if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz.sh: clang not found; install it with: apt-get install clang" >&2
  exit 2
fi

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build-fuzz"

CC=clang cmake -S "$root" -B "$build" -DCUDALLOC_BUILD_FUZZ=ON \
  -DCUDALLOC_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target fuzz_config -j "$(nproc)" >/dev/null

corpus="$build/corpus_config"
mkdir -p "$corpus" "$build/artifacts"
cp -n "$root"/tests/fuzz/corpus_config/* "$corpus"/

log="$build/fuzz_config.log"
rc=0
"$build/tests/fuzz/fuzz_config" -max_total_time="$seconds" \
  -print_final_stats=1 -artifact_prefix="$build/artifacts/" "$corpus" \
  >"$log" 2>&1 || rc=$?

runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$log" >&2
  echo "fuzz.sh: fuzz_config FAILED (exit $rc) after ${runs:-?} executions;" \
    "input in $build/artifacts/, log in $log" >&2
  exit 1
fi
echo "fuzz.sh: fuzz_config ran ${seconds} s, ${runs:-?} executions, no crash;" \
  "corpus now $(ls "$corpus" | wc -l) inputs in $corpus"
