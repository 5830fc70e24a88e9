#!/bin/sh
# preload_quiet.sh LIB: a process that never uses CUDA, with LIB preloaded,
# must exit 0 and print nothing of its own (the shell, helpers and build tools
# inherit LD_PRELOAD from a user's environment).
lib=$1
[ -f "$lib" ] || { echo "FAIL preload_quiet: no library at '$lib'"; exit 1; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0

# run NAME WANT_STDOUT COMMAND...: LIB preloaded into COMMAND only.
run() {
  what=$1 want=$2
  shift 2
  LD_PRELOAD="$PRELOAD_FIRST$lib" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  out=$(cat "$tmp/out")
  if [ "$rc" -ne 0 ] || [ "$out" != "$want" ] || [ -s "$tmp/err" ]; then
    echo "FAIL preload_quiet: $what: exit $rc, stdout '$out' (want '$want'), stderr '$(cat "$tmp/err")'"
    fail=1
  fi
}

run "/bin/true" "" /bin/true
run "sh -c 'echo hi'" "hi" /bin/sh -c 'echo hi'
# Proof that the library really was loaded (ld.so only warns on a bad path,
# which the stderr check above also catches).
libname=$(basename "$lib")
run "loaded" "yes" /bin/sh -c "grep -q '$libname' /proc/\$\$/maps && echo yes"

[ "$fail" -eq 0 ] && echo "PASS preload_quiet: /bin/true and sh print nothing extra with $libname preloaded"
exit "$fail"
