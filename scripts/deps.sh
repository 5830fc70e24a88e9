# Sourced by the set-up scripts: makes sure the build's dependencies are
# present. As root it installs what is missing from Debian's packages; as
# anyone else it prints the exact line to run and stops.
#
#   ca_ensure_deps [extra-package...]

ca__have_header() { [ -f "/usr/include/$1" ] || [ -f "/usr/local/include/$1" ]; }

ca__cuda_h() {
  for d in "${CUDA_HOME:-}" /usr/local/cuda /usr/lib/cuda /usr; do
    [ -n "$d" ] && [ -f "$d/include/cuda.h" ] && return 0
  done
  return 1
}

ca_ensure_deps() {
  local missing=()
  command -v cmake >/dev/null 2>&1 || missing+=(cmake)
  command -v cc >/dev/null 2>&1 || missing+=(gcc)
  command -v make >/dev/null 2>&1 || missing+=(make)
  ca__have_header uthash.h || missing+=(uthash-dev)
  ca__have_header cmocka.h || missing+=(libcmocka-dev)
  for extra in "$@"; do
    command -v "$extra" >/dev/null 2>&1 || missing+=("$extra")
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
