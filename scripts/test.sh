#!/usr/bin/env bash
# Builds cudalloc and runs every test a machine without a GPU can run:
#   1. the unit tests (cmocka, fake backend) and the preload tests (mock
#      driver), in a RelWithDebInfo build;
#   2. the unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer;
#   3. the concurrency (stress) test under ThreadSanitizer;
#   4. the CUDALLOC_CONF fuzzer for a bounded time (FUZZ_SECONDS, default 30);
#   5. the CPU benchmark (scripts/bench-cpu.sh: instructions per operation,
#      memory reserved on recorded training traces), a report, not a test,
#      so that a regression shows in every CI log.
# GPU tests are not here: they need a GPU (scripts/gpu-check.sh).
# Installs missing Debian packages when run as root.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck disable=SC2086 # a list of package names
ca_ensure_deps $CA_TEST_DEPS

jobs="$(nproc)"
step() { printf '\n== %s\n' "$*"; }

# Each ctest run ends with its skipped tests and their reasons
# (scripts/test-lib.sh, run by ctest itself).
build_and_test() { # dir, ctest label ('' for all), cmake args...
  local dir="$1" label="$2"
  shift 2
  cmake -S . -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
  (cd "$dir" && ctest --output-on-failure ${label:+-L "$label"})
}

step "unit and preload tests"
build_and_test build "" -DCMAKE_BUILD_TYPE=RelWithDebInfo

step "unit tests under AddressSanitizer + UBSan"
build_and_test build-asan unit -DCMAKE_BUILD_TYPE=Debug \
  -DCUDALLOC_SANITIZE=address,undefined -DCUDALLOC_BUILD_BENCH=OFF

step "stress test under ThreadSanitizer"
build_and_test build-tsan stress -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCUDALLOC_SANITIZE=thread -DCUDALLOC_BUILD_BENCH=OFF

step "CUDALLOC_CONF fuzzer"
scripts/fuzz.sh "${FUZZ_SECONDS:-30}"

step "CPU benchmark (a report: figures in docs/BENCHMARKS.md)"
scripts/bench-cpu.sh

step "all test stages passed"
