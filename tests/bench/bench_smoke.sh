#!/bin/sh
# bench_smoke.sh EXPECT COMMAND...: runs a GPU benchmark program against the
# mock driver and passes when it exits 0 and prints a line matching the
# extended regular expression EXPECT; preloaded with cudalloc, the library's
# exit line ("no device memory leaks") must show too: the program freed
# everything and the pool really served it.
expect=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
  echo "bench_smoke: exit status $rc"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq "$expect"; then
  echo "bench_smoke: no line matches: $expect"
  exit 1
fi
case "${LD_PRELOAD:-}" in
*cudalloc*)
  if ! printf '%s\n' "$out" | grep -q '^cudalloc: no device memory leaks'; then
    echo "bench_smoke: cudalloc preloaded, but no leak report line"
    exit 1
  fi
  ;;
esac
echo "bench_smoke: PASS"
