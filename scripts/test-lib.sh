# Sourced by scripts/test.sh: what it shares with its own test
# (tests/skipped_test.sh).
#
#   ca_say_skipped BUILD CTEST_OUTPUT   each test ctest skipped, with the
#                                       reason it gave (ctest shows it only
#                                       with -V)

ca_say_skipped() {
  local build=$1 names name
  names=$(sed -n 's/^[[:space:]]*[0-9]* - \([^[:space:]]*\) (Skipped)$/\1/p' "$2")
  [[ -n $names ]] || return 0
  echo "skipped, and why:"
  for name in $names; do
    awk -v t="$name" '
      / Test: / { cur = $NF }
      cur == t && /SKIP/ { sub(/^[[:space:]]+/, ""); print "  " t ": " $0; found = 1; exit }
      END { if (!found) print "  " t ": (it gave no reason)" }' \
      "$build/Testing/Temporary/LastTest.log"
  done
}
