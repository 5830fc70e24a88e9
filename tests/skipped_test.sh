#!/usr/bin/env bash
# skipped_test.sh ROOT: scripts/test.sh names each skipped test with the
# reason it gave (ca_say_skipped, scripts/test-lib.sh), from ctest's output
# and its log, as ctest 3.25 writes them. Last line: PASS or FAIL.
set -u
# shellcheck source=scripts/test-lib.sh
. "$1/scripts/test-lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/Testing/Temporary"
cat >"$tmp/Testing/Temporary/LastTest.log" <<'LOG'
1/3 Testing: gpu_preload_true
1/3 Test: gpu_preload_true
Output:
----------------------------------------------------------
[gpu-check] preload_true: SKIP (no GPU here: libcuda.so.1 cannot be loaded)
<end of output>
2/3 Testing: view_page
2/3 Test: view_page
Output:
----------------------------------------------------------
SKIP view page: no chromium on this machine (apt-get install chromium)
<end of output>
3/3 Testing: unit_ok
3/3 Test: unit_ok
Output:
----------------------------------------------------------
ok, nothing was SKIPped here
<end of output>
LOG
cat >"$tmp/ctest.out" <<'OUT'
100% tests passed, 0 tests failed out of 3

The following tests did not run:
	  1 - gpu_preload_true (Skipped)
	  2 - view_page (Skipped)
OUT
got=$(ca_say_skipped "$tmp" "$tmp/ctest.out")
want="skipped, and why:
  gpu_preload_true: [gpu-check] preload_true: SKIP (no GPU here: libcuda.so.1 cannot be loaded)
  view_page: SKIP view page: no chromium on this machine (apt-get install chromium)"
[[ $got == "$want" ]] || { printf 'FAIL skipped: got\n%s\n' "$got"; exit 1; }
printf '3/3 Test #3: x ... Passed\n' >"$tmp/none.out"
[[ -z $(ca_say_skipped "$tmp" "$tmp/none.out") ]] || { echo "FAIL skipped: a line with none skipped"; exit 1; }
echo "PASS skipped: each skipped test named with its reason"
