# Run by ctest after every run in a build folder (its CTestCustom.cmake,
# written by tests/CMakeLists.txt), and sourced by its test
# (tests/skipped_test.sh): ctest shows why a test was skipped only with -V.
# POSIX sh: ctest runs it with sh.
#
#   ca_say_skipped BUILD   each test the last ctest run in BUILD skipped, with
#                          the reason it gave; nothing when none was skipped

# A test was skipped where ctest found its skip pattern, or where it did not
# fail and said SKIP as this project's tests do when they exit 77 (ctest's
# log does not tell that exit status from a pass). The log is
# LastTest.log.tmp until ctest has finished, LastTest.log after.
ca_say_skipped() {
  log=$1/Testing/Temporary/LastTest.log.tmp
  [ -f "$log" ] || log=$1/Testing/Temporary/LastTest.log
  [ -f "$log" ] || return 0
  awk '
    function flush() {
      if (name != "" && !failed && (skipped || why != "")) {
        if (!n++) print "skipped, and why:"
        print "  " name ": " (why != "" ? why : "(it gave no reason)")
      }
      name = ""; why = ""; out = 0; failed = 0; skipped = 0
    }
    /^[0-9]+\/[0-9]+ Test: / { flush(); name = $NF; next }
    /^Output:$/ { out = 1; next }
    /^<end of output>$/ { out = 0 }
    out && why == "" && /(^|: )SKIP([ :(]|$)/ { why = $0; sub(/^[[:space:]]+/, "", why) }
    /^Test Failed\.$/ { failed = 1 }
    /^Skip regular expression found in output/ { skipped = 1 }
    END { flush() }' "$log"
}

# Run, rather than sourced, by ctest's post-test hook, in the build folder.
if [ "${0##*/}" = test-lib.sh ]; then
  ca_say_skipped .
  exit 0
fi
