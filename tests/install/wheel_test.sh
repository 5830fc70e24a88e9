#!/bin/sh
# wheel_test.sh SOURCE MOCK_DIR E2E_LEAKS: cudalloc installed with pip, as a
# PyTorch user installs it. `pip wheel SOURCE` builds the wheel (the in-tree
# backend, scripts/python/cudalloc_wheel.py: nothing fetched); its tag names
# this platform and its binaries need the C library alone (no CUDA library
# linked); installed with --no-index into a fresh virtual environment, its
# `cudalloc` command finds the library inside the package by itself (no
# CUDALLOC_LIBRARY): --version, `run` on a leaking program over the mock
# driver (the leak report), `run` of the environment's Python importing the
# package, `view` of the run's trace, `top --once`, `python -m cudalloc`.
# PyPI's cmake and a broken one first on PATH; the build runs once.
# Prints PASS or the first FAIL; exit status 1 on a failure.
set -u
src=$1 mock=$2 leaks=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cudalloc_wheel.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL wheel: $*"; exit 1; }

# Built from a copy, as from an unpacked source tree: nothing of the
# checkout's own build folders or caches can help.
mkdir "$tmp/src" && (cd "$src" && tar cf - --exclude='./build*' --exclude=./.git .) |
  (cd "$tmp/src" && tar xf -) || fail "cannot copy the source tree"
# Ahead on PATH, as a Python environment's bin/ with PyPI's cmake (PyTorch's
# on the GPU machine): a console script whose module pip's build isolation
# hides (its PYTHONPATH names pip's build site), and a cmake that never
# runs. The backend must run the first, outside the isolation, and pass the
# second by.
real=$(command -v cmake) || fail "no cmake"
mkdir "$tmp/env-bin" "$tmp/broken-bin" &&
  printf '#!/bin/sh\ncase ${PYTHONPATH:-} in *pip-build-env*)\n  echo "ModuleNotFoundError: No module named cmake" >&2; exit 1 ;;\nesac\ntouch %s\nexec %s "$@"\n' \
    "$tmp/env-cmake-ran" "$real" >"$tmp/env-bin/cmake" && printf '#!/bin/sh\nexit 1\n' >"$tmp/broken-bin/cmake" &&
  chmod +x "$tmp/env-bin/cmake" "$tmp/broken-bin/cmake" || fail "cannot make the stand-in cmakes"
PATH="$tmp/broken-bin:$tmp/env-bin:$PATH" python3 -m pip wheel -v --no-deps --no-index -w "$tmp/dist" "$tmp/src" \
  >"$tmp/wheel.log" 2>&1 || fail "pip wheel: $(tail -n 5 "$tmp/wheel.log")"
builds=$(grep -c 'Build files have been written' "$tmp/wheel.log")
[ "$builds" = 1 ] || fail "pip wheel configured $builds build(s): want 1 (metadata without a build)"
[ -e "$tmp/env-cmake-ran" ] ||
  fail "the environment's cmake, first on PATH that runs, was not the one used (pip's isolation kept?)"
whl=$(ls "$tmp"/dist/cudalloc-*.whl 2>/dev/null | head -n 1)
case ${whl##*/} in
cudalloc-*-py3-none-manylinux_*_"$(uname -m)".whl) ;;
*) fail "the wheel's name '${whl##*/}': want cudalloc-VERSION-py3-none-manylinux_X_Y_$(uname -m).whl" ;;
esac
mkdir "$tmp/unpacked" && (cd "$tmp/unpacked" && python3 -m zipfile -e "$whl" .) ||
  fail "cannot unpack ${whl##*/}"
for bin in cudalloc/lib/libcudalloc.so cudalloc/lib/cudalloc-top; do
  needed=$(readelf -d "$tmp/unpacked/$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
  for lib in $needed; do
    case $lib in
    libc.so.6 | libdl.so.2 | libpthread.so.0 | ld-linux-*.so.*) ;;
    *) fail "$bin needs $lib: want the C library alone (libc, libdl, libpthread, the loader)" ;;
    esac
  done
done

python3 -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1 || fail "python3 -m venv: $(tail -n 3 "$tmp/venv.log")"
"$tmp/venv/bin/pip" install --no-deps --no-index "$whl" >"$tmp/install.log" 2>&1 ||
  fail "pip install ${whl##*/}: $(tail -n 3 "$tmp/install.log")"
site=$("$tmp/venv/bin/python" -c 'import cudalloc, os; print(os.path.dirname(cudalloc.__file__))') ||
  fail "import cudalloc in the environment"
cmd=$tmp/venv/bin/cudalloc
[ -x "$cmd" ] || fail "no cudalloc command in the environment's bin/"
run() { env -u CUDALLOC_LIBRARY -u CUDALLOC_TOP -u LD_PRELOAD -u PYTHONPATH LD_LIBRARY_PATH="$mock" "$@"; }

ver=$(run "$cmd" --version) || fail "cudalloc --version exited $?"
case $ver in "cudalloc 0."*" ($site/lib/libcudalloc.so)") ;; *) fail "cudalloc --version: '$ver'" ;; esac
run "$cmd" run --conf "trace_path:$tmp/t.json" -- "$leaks" leaks >"$tmp/run.out" 2>"$tmp/run.err" ||
  fail "cudalloc run exited $?: $(tail -n 3 "$tmp/run.err")"
grep -q '^cudalloc: SUMMARY: 2101248 bytes leaked in 3 allocations$' "$tmp/run.err" ||
  fail "no leak report from the wheel's cudalloc run: $(tail -n 5 "$tmp/run.err")"
py=$(run "$cmd" run -- "$tmp/venv/bin/python" -c \
  'import cudalloc; print(cudalloc.loaded(), cudalloc.version(), cudalloc.library_path())') ||
  fail "the environment's Python under cudalloc run"
case $py in "True 0."*" $site/lib/libcudalloc.so") ;; *) fail "import cudalloc under run said '$py'" ;; esac
run "$cmd" view "$tmp/t.json" -o "$tmp/mem.html" >/dev/null && [ -s "$tmp/mem.html" ] ||
  fail "the wheel's cudalloc view made no page of the run's trace"
top=$(run "$cmd" top --once) || fail "cudalloc top --once exited $?"
case $top in "cudalloc top - "*) ;; *) fail "the wheel's cudalloc top printed '$top'" ;; esac
mod=$(run "$tmp/venv/bin/python" -m cudalloc) || fail "python -m cudalloc exited $?"
case $mod in "cudalloc is not loaded in this process"*) ;; *) fail "python -m cudalloc said '$mod'" ;; esac
echo "PASS wheel: ${whl##*/}; $ver; needs $needed"
