#!/bin/sh
# preload_quiet.sh LIB: a process that never uses CUDA, with LIB preloaded,
# must exit 0 and print nothing of its own (the shell, helpers and build tools
# inherit LD_PRELOAD from a user's environment), valid settings or none; asked
# with help:1, or given a bad item, it says so as the library loads.
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

# says NAME CONF PATTERN LINES: /bin/true under CUDALLOC_CONF=CONF prints
# LINES lines on stderr, the first matching PATTERN (grep -E), nothing on
# stdout, and exits 0.
says() {
  what=$1 conf=$2 pattern=$3 lines=$4
  CUDALLOC_CONF="$conf" LD_PRELOAD="$PRELOAD_FIRST$lib" /bin/true >"$tmp/out" 2>"$tmp/err"
  rc=$?
  n=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 0 ] || [ -s "$tmp/out" ] || [ "$n" -ne "$lines" ] ||
    { [ "$lines" -gt 0 ] && ! head -n 1 "$tmp/err" | grep -Eq "$pattern"; }; then
    echo "FAIL preload_quiet: $what: exit $rc, $n lines on stderr (want $lines, the first matching '$pattern'): '$(head -n 3 "$tmp/err")'"
    fail=1
  fi
}

says "valid settings" "leak_report:1,max_split_size_mb:128" "" 0
keys=$(CUDALLOC_CONF=help:1 LD_PRELOAD="$PRELOAD_FIRST$lib" /bin/true 2>&1 | grep -c '^cudalloc:   ')
[ "$keys" -gt 10 ] || { echo "FAIL preload_quiet: help:1 listed $keys keys"; fail=1; }
says "help:1" "help:1" "^cudalloc: CUDALLOC_CONF=key:value" $((keys + 1))
says "an unknown key" "bogus:1" "^cudalloc: CUDALLOC_CONF: unknown key 'bogus'" 1
says "a bad value" "max_split_size_mb:abc" "^cudalloc: CUDALLOC_CONF: .*max_split_size_mb.*abc" 1

[ "$fail" -eq 0 ] && echo "PASS preload_quiet: /bin/true and sh print nothing extra with $libname preloaded, valid settings or none; help:1 and bad items speak at load"
exit "$fail"
