# gpu-lib.sh: what the GPU scripts (gpu-check.sh, bench-gpu.sh) share,
# sourced by both: their log, the machine's facts, and the CMake build of
# the library and the CUDA programs. Bash; nothing runs on sourcing.
# The caller sets CA_GPU_TAG (the prefix of its lines) first.

# ca_gpu_say LINE...: one line of the script's own.
ca_gpu_say() { printf '%s: %s\n' "$CA_GPU_TAG" "$*"; }

# ca_gpu_log_to FILE: from now on everything printed also goes to FILE.
ca_gpu_log_to() {
  exec > >(tee "$1") 2>&1
  CA_GPU_TEE_PID=$!
}

# ca_gpu_finish STATUS: ends the script once the log has everything.
ca_gpu_finish() {
  if [[ -n ${CA_GPU_TEE_PID:-} ]]; then
    exec >&- 2>&-
    wait "$CA_GPU_TEE_PID" 2>/dev/null
  fi
  exit "$1"
}

# ca_gpu_line: the GPU's name, driver and memory, one line ("" if none).
ca_gpu_line() {
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader 2>/dev/null | head -n 1
}

# ca_gpu_commit ROOT: the commit, and whether the tree differs from it;
# "no git" in a copy without .git (the tree hash says what ran).
ca_gpu_commit() {
  local c
  c=$(git -C "$1" rev-parse --short HEAD 2>/dev/null) || { echo "no git"; return; }
  git -C "$1" diff --quiet HEAD 2>/dev/null || c="$c (with local changes)"
  echo "$c"
}

# The documented differences a pooled block's answers may show: the rows
# of this section of docs/COMPATIBILITY.md judge the driver_probe_pool row.
CA_GPU_ANSWERS='## Answers a pooled block cannot give as the driver does'

# ca_gpu_tree_files ROOT: what builds the GPU check's library and programs
# or judges them, one path a line, sorted: every CMake file, src/,
# include/, examples/, tests/gpu/, tests/mockcuda/, the Python the checks
# run from tests/ and scripts/, the scripts that build and run them.
# Hidden files and Python caches are none of it; nor are docs, but for the
# table above.
ca_gpu_tree_files() {
  (
    cd "$1" || exit
    find src include examples tests/gpu tests/mockcuda scripts/python -type f ! -name '.*' \
      ! -name '*.pyc' ! -path '*/__pycache__/*' 2>/dev/null
    find tests -type f -name CMakeLists.txt 2>/dev/null
    for f in CMakeLists.txt tests/probe_compare.py tests/bench/*.py scripts/gpu-check.sh \
      scripts/gpu-lib.sh scripts/cudalloc; do
      [[ -f $f ]] && echo "$f"
    done
  ) | LC_ALL=C sort -u
}

# ca_gpu_tree ROOT: the tree hash (16 hex digits): each of those files'
# path, content and executable bit, and the table's rows. The same in a
# copy without .git; no GPU, no build.
ca_gpu_tree() {
  local files f
  mapfile -t files < <(ca_gpu_tree_files "$1")
  (
    cd "$1" || exit
    ((${#files[@]})) && sha256sum -- "${files[@]}"
    for f in "${files[@]}"; do [[ -x $f ]] && echo "executable $f"; done
    awk -v s="$CA_GPU_ANSWERS" '/^## /{on = ($0 == s)} on && /^\| *`/' docs/COMPATIBILITY.md 2>/dev/null
  ) | sha256sum | cut -c1-16
}

# ca_gpu_facts ROOT: the machine, its tools and frameworks, the tree.
ca_gpu_facts() {
  local gpu
  gpu=$(ca_gpu_line)
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "tree: $(ca_gpu_tree "$1")"
  echo "git: $(ca_gpu_commit "$1")"
  echo "host: $(uname -srm); $(nproc) cores, $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "gpu: ${gpu:-unknown (nvidia-smi gave nothing)}"
  echo "nvcc: $(nvcc --version 2>/dev/null | grep -m1 -o 'release .*')"
  echo "cmake: $(cmake --version 2>/dev/null | head -n 1); ninja $(ninja --version 2>/dev/null || echo 'not found')"
  echo "compute-sanitizer: $(compute-sanitizer --version 2>/dev/null | tail -n 1)"
  echo "python: $(python3 --version 2>&1) at $(command -v python3)"
  timeout 120 python3 - <<'EOF' 2>&1
def show(name, fn):
    try:
        print(name, fn())
    except Exception as e:  # noqa: BLE001 - absent is a fact too
        print(name + ": not importable:", e)

def torch_v():
    import torch
    return "%s cuda %s cudnn %s available %s" % (
        torch.__version__, torch.version.cuda, torch.backends.cudnn.version(),
        torch.cuda.is_available())

def torchvision_v():
    import torchvision
    return torchvision.__version__

def cupy_v():
    import cupy
    return "%s runtime %s driver %s" % (cupy.__version__, cupy.cuda.runtime.runtimeGetVersion(),
                                        cupy.cuda.runtime.driverGetVersion())

def jax_v():
    import jax, jaxlib
    return "%s jaxlib %s" % (jax.__version__, jaxlib.__version__)

for name, fn in (("torch", torch_v), ("torchvision", torchvision_v), ("cupy", cupy_v),
                 ("jax", jax_v)):
    show(name, fn)
EOF
}

# ca_gpu_build ROOT BUILD TYPE LOG [TARGET...]: configures BUILD
# (CMAKE_BUILD_TYPE TYPE; Ninja for a new folder where there is one: the
# machine may have no make) with the CUDA compiler, this python3 (the checks
# run the frameworks' own interpreter) and uthash from ROOT/.deps/include
# where the system has none, and builds the TARGETs, or everything: the
# library, the CUDA programs, the tests (unit tests only where cmocka is). A
# target that fails (another compiler's new warning, say) stops none of the
# others: the caller looks for what it needs. Output into LOG; the status is
# the build's.
ca_gpu_build() {
  local root=$1 build=$2 type=$3 log=$4 gen=() cuda=() keep=(-k) targets=()
  shift 4
  (($#)) && targets=(--target "$@")
  if [[ ! -f $build/CMakeCache.txt ]] && command -v ninja >/dev/null; then
    gen=(-G Ninja)
  fi
  command -v nvcc >/dev/null && cuda=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  ca_gpu_say "building $build ($type${targets[*]:+, ${targets[*]:1}}) -> $log"
  cmake -S "$root" -B "$build" ${gen[@]+"${gen[@]}"} ${cuda[@]+"${cuda[@]}"} \
    -DCMAKE_BUILD_TYPE="$type" -DPython3_EXECUTABLE="$(command -v python3)" \
    -DCUDALLOC_UTHASH_DIR="$root/.deps/include" >"$log" 2>&1 || return
  [[ -f $build/build.ninja ]] && keep=(-k 0)
  cmake --build "$build" -j "$(nproc)" ${targets[@]+"${targets[@]}"} -- "${keep[@]}" >>"$log" 2>&1
}
