#!/usr/bin/env bash
# gpu_tree_test.sh SRC: `scripts/gpu-check.sh --tree`, the hash a GPU run is
# matched to a commit by, names exactly what builds or judges the library.
#
# Why: a green GPU run counts for a commit only when their tree hashes are
# equal, so the hash must be the same in a copy without .git, unchanged by
# docs and by files the check neither builds nor reads, and changed by any
# file it builds or reads (a new one too) and by the table of documented
# differences that judges driver_probe_pool. It must print without a GPU
# and without building. Prints "PASS gpu_tree" or the first failure.
set -uo pipefail
src=$(cd "$1" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL gpu_tree: $*"; exit 1; }
tree() { (cd / && PATH=/usr/bin:/bin "$1/scripts/gpu-check.sh" --tree); }

# fresh_copy: $copy, what the check could see, without .git or any build.
copy=$tmp/copy
fresh_copy() {
  rm -rf "$copy" && mkdir "$copy" &&
    tar -C "$src" --exclude=./.git --exclude='./build*' --exclude=./gpu-out --exclude=./.probe \
      --exclude=./.deps --exclude=./dist -cf - . | tar -C "$copy" -xf -
}
fresh_copy

base=$(tree "$src") || fail "--tree failed in the source tree"
[[ $base =~ ^[0-9a-f]{16}$ ]] || fail "--tree printed '$base', not 16 hex digits"
[[ $(tree "$copy") == "$base" ]] || fail "a copy without .git hashes differently"
[[ -e $copy/build-gpu || -e $copy/gpu-out ]] && fail "--tree built or wrote something"

# same WHAT: the hash must not move after the edit that follows.
same() { [[ $(tree "$copy") == "$base" ]] || fail "$1 changed the hash"; }
# moves WHAT: it must move; then the copy is put back.
moves() {
  [[ $(tree "$copy") != "$base" ]] || fail "$1 left the hash unchanged"
  fresh_copy
  [[ $(tree "$copy") == "$base" ]] || fail "the restored copy hashes differently"
}

echo "a line" >>"$copy/README.md"
same "an edit of README.md"
echo "a line" >>"$copy/docs/POOL.md"
same "an edit of docs/POOL.md"
echo "a closing line" >>"$copy/docs/COMPATIBILITY.md"
same "prose added to docs/COMPATIBILITY.md"
echo "x" >>"$copy/tests/e2e/group_test.py"
same "an edit of a preload test the GPU check does not run"
mkdir -p "$copy/src/__pycache__" && echo x >"$copy/src/__pycache__/a.pyc"
same "a Python cache"

echo "/* x */" >>"$copy/src/pool/pool.c"
moves "an edit of src/pool/pool.c"
echo "/* x */" >"$copy/src/pool/new_file.c"
moves "a new file in src/"
echo "# x" >>"$copy/tests/gpu/gpu_reuse.py"
moves "an edit of a GPU check"
echo "# x" >>"$copy/tests/unit/CMakeLists.txt"
moves "an edit of a CMake file"
echo "x" >>"$copy/tests/mockcuda/driver_facts.txt"
moves "an edit of the driver's recorded answers"
echo "# x" >>"$copy/examples/torch_leak.py"
moves "an edit of an example the check runs"
chmod -x "$copy/scripts/cudalloc"
moves "the command losing its executable bit"
sed -i '0,/^| `/s/^| `/| `x/' "$copy/docs/COMPATIBILITY.md"
moves "an edit of the table of documented differences"

echo "PASS gpu_tree"
