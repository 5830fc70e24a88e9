#!/bin/sh
# install_test.sh BUILD SOURCE MOCK_DIR E2E_LEAKS: cudalloc installed as a
# library is used as one. Installs BUILD into a temporary prefix, then:
# builds a program against it with find_package(cudalloc) and with
# pkg-config and runs both; runs the installed `cudalloc run` (finding the
# library beside itself) on a leaking program against the mock driver, with
# the installed Python helper; runs the installed `cudalloc top --once` and
# `cudalloc view` on the run's trace;
# makes the Debian package (cpack -G DEB) and
# lists it. Prints PASS or the first FAIL; exit status 1 on a failure.
set -u
build=$1 src=$2 mock=$3 leaks=$4
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cudalloc_install.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL install: $*"; exit 1; }
prefix=$tmp/prefix

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  fail "cmake --install: $(tail -n 3 "$tmp/install.log")"
libdir=$(dirname "$(find "$prefix" -name 'libcudalloc.so' | head -n 1)")
[ -f "$libdir/libcudalloc.so" ] || fail "no libcudalloc.so installed"
for f in bin/cudalloc libexec/cudalloc/cudalloc-top include/cudalloc.h share/cudalloc/python/cudalloc/__init__.py share/doc/cudalloc/LEAKS.md; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done

# find_package(cudalloc) -> cudalloc::cudalloc
cmake -S "$src/tests/install/consumer" -B "$tmp/c1" -DCMAKE_PREFIX_PATH="$prefix" \
  >"$tmp/c1.log" 2>&1 && cmake --build "$tmp/c1" >>"$tmp/c1.log" 2>&1 ||
  fail "find_package consumer: $(tail -n 5 "$tmp/c1.log")"
out=$(LD_LIBRARY_PATH="$mock" "$tmp/c1/consumer") || fail "find_package consumer did not run"
case $out in "consumer: cudalloc 0."*) ;; *) fail "find_package consumer printed '$out'" ;; esac

# pkg-config, the pkg-config file found from the prefix alone
flags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs cudalloc) ||
  fail "pkg-config does not know cudalloc"
# shellcheck disable=SC2086
cc -o "$tmp/c2" "$src/tests/install/consumer/consumer.c" $flags -Wl,-rpath,"$libdir" ||
  fail "pkg-config consumer did not build with: $flags"
out2=$(LD_LIBRARY_PATH="$mock" "$tmp/c2") || fail "pkg-config consumer did not run"
[ "$out2" = "$out" ] || fail "pkg-config consumer printed '$out2', find_package one '$out'"

# the installed command finds the installed library by itself
ver=$(env -u CUDALLOC_LIBRARY "$prefix/bin/cudalloc" --version) || fail "cudalloc --version"
case $ver in *"($libdir/libcudalloc.so)") ;; *) fail "cudalloc --version: '$ver'" ;; esac
env -u CUDALLOC_LIBRARY -u LD_PRELOAD LD_LIBRARY_PATH="$mock" \
  "$prefix/bin/cudalloc" run --conf "backtrace_depth:16,trace_path:$tmp/t.json" -- "$leaks" leaks \
  >"$tmp/run.out" 2>"$tmp/run.err" ||
  fail "cudalloc run exited $?"
grep -q '^cudalloc: SUMMARY: 2101248 bytes leaked in 3 allocations$' "$tmp/run.err" ||
  fail "no leak report from the installed cudalloc run: $(tail -n 5 "$tmp/run.err")"
py=$(env -u CUDALLOC_LIBRARY LD_LIBRARY_PATH="$mock" PYTHONPATH="$prefix/share/cudalloc/python" \
  "$prefix/bin/cudalloc" run -- python3 -c 'import cudalloc; print(cudalloc.loaded(), cudalloc.version())') ||
  fail "the installed Python helper"
case $py in "True 0."*) ;; *) fail "the installed Python helper said '$py'" ;; esac
"$prefix/bin/cudalloc" view "$tmp/t.json" -o "$tmp/mem.html" >/dev/null && [ -s "$tmp/mem.html" ] ||
  fail "the installed cudalloc view made no page of the run's trace"
top=$(env -u CUDALLOC_TOP "$prefix/bin/cudalloc" top --once) || fail "cudalloc top --once exited $?"
case $top in "cudalloc top - "*) ;; *) fail "the installed cudalloc top printed '$top'" ;; esac

# the Debian package
(cd "$build" && cpack -G DEB -B "$tmp/deb" >"$tmp/cpack.log" 2>&1) ||
  fail "cpack -G DEB: $(tail -n 5 "$tmp/cpack.log")"
deb=$(ls "$tmp"/deb/*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || fail "cpack made no .deb"
listing=$(dpkg-deb -c "$deb")
for f in bin/cudalloc libexec/cudalloc/cudalloc-top include/cudalloc.h libcudalloc.so.0 cmake/cudalloc/cudallocConfig.cmake pkgconfig/cudalloc.pc; do
  printf '%s\n' "$listing" | grep -q "$f" || fail "$(basename "$deb") lacks $f"
done
echo "PASS install: $out; pkg-config $flags; $ver; $(basename "$deb")"
