# Sourced by the set-up scripts: makes sure the build's dependencies are
# present. As root it installs what is missing from Debian's packages; as
# anyone else it prints the exact line to run and stops.
#
#   ca_ensure_deps [package...]   the base set, plus these Debian packages
#                                 (libcmocka-dev, clang, valgrind, ...)
#   ca_missing_deps package...    which of these are not here, on one line

ca__have_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/local/include/$1" ]; }

# Whether a Debian package's part this project uses is already there.
ca__present() {
  case "$1" in
    uthash-dev) ca__have_header uthash.h ;;
    libcmocka-dev) ca__have_header cmocka.h ;;
    python3-pip) python3 -m pip --version >/dev/null 2>&1 ;;
    python3-venv) python3 -c 'import ensurepip, venv' >/dev/null 2>&1 ;;
    *) command -v "$1" >/dev/null 2>&1 ;;
  esac
}

ca__cuda_h() {
  for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/lib/cuda /usr; do
    [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && return 0
  done
  return 1
}

# What scripts/test.sh needs beyond the build's own (ca_ensure_deps' base).
CA_TEST_DEPS="libcmocka-dev clang valgrind python3 python3-pip python3-venv pkg-config tmux chromium"

# The Debian packages among the arguments that are not here, on one line
# (empty when all are).
ca_missing_deps() {
  local missing=() pkg
  for pkg in "$@"; do
    ca__present "$pkg" || missing+=("$pkg")
  done
  printf '%s\n' "${missing[*]-}"
}

ca_ensure_deps() {
  local missing=() pkg
  command -v cc >/dev/null 2>&1 || missing+=(gcc)
  for pkg in cmake make uthash-dev "$@"; do
    ca__present "$pkg" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
      echo "cudalloc: installing ${missing[*]}"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "cudalloc: missing ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
      return 1
    fi
  fi
  if ! ca__cuda_h; then
    echo "cudalloc: cuda.h not found: install the CUDA toolkit (it puts cuda.h in /usr/local/cuda/include)," \
      "or on Debian run as root: apt-get install nvidia-cuda-toolkit; or set CUDA_HOME" >&2
    return 1
  fi
}
