#!/usr/bin/env bash
# Builds cudalloc and runs the demo under LD_PRELOAD=libcudalloc.so:
#   1. pool_demo, a training-loop-like program: the pool at work (driver
#      calls avoided, cache hits, time per call);
#   2. leaky_loop (examples/leaky_loop.cu), the classic leak: the report at
#      exit names the cudaMalloc line that leaked 100 MiB; then its fixed
#      twin, which reports no leaks.
# On a machine without a GPU it runs against the project's mock driver
# (tests/mockcuda) and, for leaky_loop, the mock CUDA runtime, and says so
# (scripts/demo-lib.sh). leaky_loop needs nvcc (the CUDA toolkit); without
# it that part is skipped.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
# shellcheck source=scripts/demo-lib.sh
. scripts/demo-lib.sh
ca_ensure_deps
echo "demo: building with cmake, a C compiler, uthash and the CUDA headers (all here)"
# shellcheck disable=SC2086 # a list of package names
later=$(ca_missing_deps $CA_TEST_DEPS)
[[ -z $later ]] || echo "demo: the tests need more, which the demo does not:" \
  "scripts/test.sh installs $later (as root; otherwise it prints the apt-get line)"

# Only errors: a missing test dependency (cmocka) is said above, for the
# test command to install.
cmake --log-level=ERROR -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

lib="$root/build/libcudalloc.so"
ca_demo_driver "$root/build" || exit 1

echo
echo "== pool_demo without cudalloc"
build/examples/pool_demo
echo
echo "== pool_demo with cudalloc (LD_PRELOAD=build/libcudalloc.so)"
LD_PRELOAD="$lib" build/examples/pool_demo

# The leak report, from the leaky_loop build this driver can run.
echo
ca_demo_leaky "$root/build" || exit 0
echo "== leaky_loop with cudalloc (CUDALLOC_CONF=backtrace_depth:16): 100 x 1 MiB, never freed"
CUDALLOC_CONF=backtrace_depth:16 LD_PRELOAD="$lib" "$leaky"
echo
echo "== leaky_loop --fixed with cudalloc (CUDALLOC_CONF=backtrace_depth:16): each buffer freed"
CUDALLOC_CONF=backtrace_depth:16 LD_PRELOAD="$lib" "$leaky" --fixed
