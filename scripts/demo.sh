#!/usr/bin/env bash
# Builds cudalloc and runs the demo: a training-loop-like program under
# LD_PRELOAD=libcudalloc.so, showing the pool at work (driver calls avoided,
# cache hits, time per call) and the device memory still live at the end.
# On a machine without a GPU the demo runs against the project's mock driver
# (tests/mockcuda), and says so.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh
ca_ensure_deps

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" >/dev/null

if nvidia-smi -L >/dev/null 2>&1; then
  echo "demo: running on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
else
  echo "demo: no GPU here: running against the project's mock driver (tests/mockcuda)"
  export LD_LIBRARY_PATH="$root/build/tests/mockcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

echo
echo "== without cudalloc"
build/examples/pool_demo
echo
echo "== with cudalloc (LD_PRELOAD=build/libcudalloc.so)"
LD_PRELOAD="$root/build/libcudalloc.so" build/examples/pool_demo
