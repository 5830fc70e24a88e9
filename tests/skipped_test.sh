#!/usr/bin/env bash
# skipped_test.sh ROOT CTESTCUSTOM CTEST: a plain ctest run ends with each
# skipped test and the reason it gave (ca_say_skipped, scripts/test-lib.sh,
# run by the build's CTestCustom.cmake): first from a log as ctest 3.25
# writes it, then in a real ctest run of four tests, in a folder of its own,
# with the build's CTestCustom.cmake. Last line: PASS or FAIL.
set -u
root=$1 custom=$2 ctest=$3
# shellcheck source=scripts/test-lib.sh
. "$root/scripts/test-lib.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { printf 'FAIL skipped: %s\n' "$*" | tr '\n' ' '; echo; exit 1; }

# test_record NAME RESULT OUTPUT...: one test's record in ctest's log.
rule=----------------------------------------------------------
test_record() {
  local name=$1 result=$2
  shift 2
  printf '1/4 Testing: %s\n1/4 Test: %s\n' "$name" "$name"
  printf 'Command: "sh" "-c" "x: SKIP (in the command)"\nOutput:\n%s\n' "$rule"
  printf '%s\n' "$@"
  printf '<end of output>\nTest time =   0.01 sec\n%s\n%s\n' "$rule" "$result"
  printf '"%s" end time: Dec 03 11:00 UTC\n%s\n\n' "$name" "$rule"
}
mkdir -p "$tmp/log/Testing/Temporary"
{
  test_record gpu_preload_true "Test Passed." \
    "[gpu-check] preload_true: SKIP (no GPU here: libcuda.so.1 cannot be loaded)"
  test_record view_page "Test Passed." \
    "SKIP view page: no chromium on this machine (apt-get install chromium)"
  test_record unit_ok "Test Passed." "ok, nothing was SKIPped here" "[  SKIPPED ] a cmocka case"
  test_record e2e_broken "Test Failed." "SKIP x: said, then failed"
  test_record quiet_skip \
    $'Test Pass Reason:\nSkip regular expression found in output. Regex=[^SKIP]' "no reason"
} >"$tmp/log/Testing/Temporary/LastTest.log"
got=$(ca_say_skipped "$tmp/log")
want="skipped, and why:
  gpu_preload_true: [gpu-check] preload_true: SKIP (no GPU here: libcuda.so.1 cannot be loaded)
  view_page: SKIP view page: no chromium on this machine (apt-get install chromium)
  quiet_skip: (it gave no reason)"
[[ $got == "$want" ]] || fail "from the log, got: $got"
# While ctest runs its post-test command, this run's log is LastTest.log.tmp.
test_record unit_ok "Test Passed." "fine" >"$tmp/log/Testing/Temporary/LastTest.log.tmp"
[[ -z $(ca_say_skipped "$tmp/log") ]] || fail "the previous run's log read, not this run's"

# A real ctest run, as a user types it: no -V.
mkdir -p "$tmp/run"
cp "$custom" "$tmp/run/CTestCustom.cmake"
cat >"$tmp/run/CTestTestfile.cmake" <<'TESTS'
add_test(gpu_x "sh" "-c" "echo '[gpu-check] x: SKIP (no GPU here: no libcuda.so.1)'; exit 77")
set_tests_properties(gpu_x PROPERTIES SKIP_RETURN_CODE 77)
add_test(by_pattern "sh" "-c" "echo 'SKIP by_pattern: no tmux on this machine'")
set_tests_properties(by_pattern PROPERTIES SKIP_REGULAR_EXPRESSION "^SKIP ")
add_test(passes "sh" "-c" "echo fine")
add_test(fails "sh" "-c" "echo 'SKIP fails: but it failed'; exit 1")
TESTS
out=$(cd "$tmp/run" && "$ctest" 2>&1)
want="skipped, and why:
  gpu_x: [gpu-check] x: SKIP (no GPU here: no libcuda.so.1)
  by_pattern: SKIP by_pattern: no tmux on this machine"
[[ $out == *"$want"* ]] || fail "a plain ctest run printed: $out"
[[ $out != *"  fails: "* && $out != *"  passes: "* ]] || fail "a run test listed as skipped: $out"
echo "PASS skipped: a plain ctest run names each skipped test with its reason"
