#!/usr/bin/env bash
# demo_test.sh CHECK ROOT BUILD: what scripts/demo.sh says of the driver and
# the leaky_loop build it runs. Exit 0 with a PASS line, 1 with a FAIL line,
# 77 with a SKIP line where what a check needs was not built.
#   lines   scripts/demo-lib.sh, in made-up build folders, with no GPU (an
#           nvidia-smi that fails comes first on PATH): the mock chosen, or,
#           where none was built, one line saying what to do; leaky_loop's
#           shared build on the mock, with one line saying why
#   static  BUILD's static-runtime leaky_loop, on the mock driver and with
#           no driver at all: one line saying what to run, not a CUDA error
set -u
check=$1 root=$2 build=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL demo $check: $*" | tr '\n' ' '; echo; exit 1; }

check_lines() {
  # shellcheck source=scripts/demo-lib.sh
  . "$root/scripts/demo-lib.sh"
  mkdir -p "$tmp/bin" "$tmp/none" "$tmp/mock/tests/mockcuda" "$tmp/mock/examples"
  printf '#!/bin/sh\nexit 9\n' >"$tmp/bin/nvidia-smi"
  chmod +x "$tmp/bin/nvidia-smi"
  PATH="$tmp/bin:$PATH"
  local out rc
  out=$(ca_demo_driver "$tmp/none" 2>&1) && fail "no driver and no mock, yet it went on: $out"
  [[ $out == "demo: "* && $out != *$'\n'* && $out == *-DCUDALLOC_BUILD_TESTS=ON* ]] ||
    fail "no driver and no mock: it said '$out', want one line on building the mock"
  touch "$tmp/mock/tests/mockcuda/libcuda.so.1"
  out=$(ca_demo_driver "$tmp/mock" && echo "gpu=$gpu LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
  [[ $out == "demo: no GPU here: running against the project's mock driver (tests/mockcuda)
gpu=0 LD_LIBRARY_PATH=$tmp/mock/tests/mockcuda"* ]] || fail "with the mock: '$out'"
  out=$(gpu=0 ca_demo_leaky "$tmp/mock" 2>&1)
  rc=$?
  [[ $rc == 1 && $out == "demo: leaky_loop skipped: no CUDA compiler found;"* ]] ||
    fail "no leaky_loop built: status $rc, '$out'"
  printf '#!/bin/sh\n' | tee "$tmp/mock/examples/leaky_loop" >"$tmp/mock/examples/leaky_loop_shared"
  chmod +x "$tmp/mock/examples/leaky_loop" "$tmp/mock/examples/leaky_loop_shared"
  out=$(gpu=0 && ca_demo_leaky "$tmp/mock" && echo "leaky=$leaky")
  [[ $out == "demo: no GPU: leaky_loop runs as leaky_loop_shared, "*"because the mock"*"static"*"
leaky=$tmp/mock/examples/leaky_loop_shared" ]] || fail "on the mock: '$out'"
  out=$(gpu=1 && ca_demo_leaky "$tmp/mock" && echo "leaky=$leaky")
  [[ $out == "leaky=$tmp/mock/examples/leaky_loop" ]] || fail "on a GPU: '$out'"
  echo "PASS demo lines: the mock or, without one, what to do; leaky_loop_shared on it, saying why"
}

# One line on stderr, nothing on stdout, exit 1.
expect_line() { # WHAT WANT OUT ERR STATUS
  [[ $5 == 1 && -z $3 && $4 == "$2" ]] ||
    fail "$1: exit $5, stdout '$3', stderr '$4'; want exit 1 and '$2'"
}

check_static() {
  local prog=$build/examples/leaky_loop out err rc want
  if [[ ! -x $prog ]]; then
    echo "SKIP demo static: no CUDA compiler (nvcc) here, so examples/leaky_loop was not built"
    exit 77
  fi
  out=$(LD_LIBRARY_PATH=$build/tests/mockcuda "$prog" 2>"$tmp/err")
  rc=$?
  err=$(<"$tmp/err")
  want="leaky_loop: the project's mock driver serves only its own CUDA runtime"
  want+=" (libcudart.so.13), which this static-runtime build does not load: run leaky_loop_shared"
  expect_line "on the mock" "$want" "$out" "$err" "$rc"
  # Without a driver: only where none is installed.
  if /sbin/ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    echo "PASS demo static: on the mock, one line naming leaky_loop_shared" \
      "(a libcuda.so.1 is installed here: the case of none not run)"
    return
  fi
  out=$(env -u LD_LIBRARY_PATH "$prog" 2>"$tmp/err")
  rc=$?
  err=$(<"$tmp/err")
  want="leaky_loop: no CUDA driver (libcuda.so.1) here: install the NVIDIA driver, or without a"
  want+=" GPU run leaky_loop_shared against the project's mock"
  want+=" (LD_LIBRARY_PATH=build/tests/mockcuda)"
  expect_line "with no driver" "$want" "$out" "$err" "$rc"
  echo "PASS demo static: one line on the mock (run leaky_loop_shared) and with no driver" \
    "(install one, or use the mock)"
}

case $check in
lines) check_lines ;;
static) check_static ;;
*) fail "unknown check (lines, static)" ;;
esac
