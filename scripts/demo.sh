#!/usr/bin/env bash
# Builds cudalloc and runs the demo under LD_PRELOAD=libcudalloc.so:
#   1. pool_demo, a training-loop-like program: the pool at work (driver
#      calls avoided, cache hits, time per call);
#   2. leaky_loop (examples/leaky_loop.cu), the classic leak: the report at
#      exit names the cudaMalloc line that leaked 100 MiB; then its fixed
#      twin, which reports no leaks.
# On a machine without a GPU it runs against the project's mock driver
# (tests/mockcuda) and, for leaky_loop, the mock CUDA runtime, and says so.
# leaky_loop needs nvcc (the CUDA toolkit); without it that part is skipped.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
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
if nvidia-smi -L >/dev/null 2>&1; then
  echo "demo: running on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
  gpu=1
else
  echo "demo: no GPU here: running against the project's mock driver (tests/mockcuda)"
  export LD_LIBRARY_PATH="$root/build/tests/mockcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  gpu=0
fi

echo
echo "== pool_demo without cudalloc"
build/examples/pool_demo
echo
echo "== pool_demo with cudalloc (LD_PRELOAD=build/libcudalloc.so)"
LD_PRELOAD="$lib" build/examples/pool_demo

# The leak report. On a GPU, the static-runtime build (nvcc's default);
# without one, the shared-runtime build, whose libcudart.so.13 is then the
# mock's (same folder as the mock driver).
leaky=build/examples/leaky_loop
((gpu)) || leaky=build/examples/leaky_loop_shared
echo
if [[ ! -x $leaky ]]; then
  echo "demo: leaky_loop skipped: no CUDA compiler found; install the CUDA toolkit's nvcc" \
    "(CUDA 13: /usr/local/cuda/bin/nvcc) and run scripts/demo.sh again"
  exit 0
fi
if ((!gpu)) && [[ ! -f build/tests/mockcuda/libcudart.so.13 ]]; then
  echo "demo: leaky_loop skipped: no GPU, and the mock CUDA runtime was not built (CUDALLOC_BUILD_TESTS=OFF?)"
  exit 0
fi
((gpu)) || echo "demo: no GPU: leaky_loop is its -cudart shared build, run against the" \
  "mock CUDA runtime and driver (kernels do not run)"
echo "== leaky_loop with cudalloc (CUDALLOC_CONF=backtrace_depth:16): 100 x 1 MiB, never freed"
CUDALLOC_CONF=backtrace_depth:16 LD_PRELOAD="$lib" "$leaky"
echo
echo "== leaky_loop --fixed with cudalloc (CUDALLOC_CONF=backtrace_depth:16): each buffer freed"
CUDALLOC_CONF=backtrace_depth:16 LD_PRELOAD="$lib" "$leaky" --fixed
