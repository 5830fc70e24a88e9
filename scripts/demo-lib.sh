# Sourced by scripts/demo.sh and by its test (tests/demo_test.sh): which
# CUDA driver and which leaky_loop build the demo runs, each said in one line.
#
#   ca_demo_driver BUILD   gpu=1 where nvidia-smi sees a GPU; else gpu=0 and
#                          the project's mock driver (BUILD/tests/mockcuda)
#                          first on LD_LIBRARY_PATH; status 1 where there is
#                          neither, with one line saying what to do
#   ca_demo_leaky BUILD    leaky= the leaky_loop build to run on that driver;
#                          status 1 where none was built, with one line

ca_demo_driver() {
  local build=$1 mock=$1/tests/mockcuda
  if nvidia-smi -L >/dev/null 2>&1; then
    echo "demo: running on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    gpu=1
  elif [[ -f $mock/libcuda.so.1 ]]; then
    echo "demo: no GPU here: running against the project's mock driver (tests/mockcuda)"
    export LD_LIBRARY_PATH="$mock${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    gpu=0
  else
    echo "demo: no GPU driver here and no mock driver built ($mock): run" \
      "cmake -B $build -DCUDALLOC_BUILD_TESTS=ON (the mock comes with the tests) and" \
      "scripts/demo.sh again, or run the demo where nvidia-smi sees a GPU" >&2
    return 1
  fi
}

# On a GPU, the static-runtime build (nvcc's default); on the mock, the
# -cudart shared one: the mock driver serves only the mock's CUDA runtime
# (libcudart.so.13, beside it), which a static build never loads.
# shellcheck disable=SC2034 # leaky is the caller's
ca_demo_leaky() {
  local examples=$1/examples
  if [[ ! -x $examples/leaky_loop ]]; then
    echo "demo: leaky_loop skipped: no CUDA compiler found; install the CUDA toolkit's nvcc" \
      "(CUDA 13: /usr/local/cuda/bin/nvcc) and run scripts/demo.sh again"
    return 1
  fi
  leaky=$examples/leaky_loop
  ((gpu)) && return
  leaky=$examples/leaky_loop_shared
  echo "demo: no GPU: leaky_loop runs as leaky_loop_shared, its -cudart shared build, because" \
    "the mock driver serves only the mock CUDA runtime (libcudart.so.13), which the static" \
    "build (nvcc's default) does not load; kernels do not run"
}
