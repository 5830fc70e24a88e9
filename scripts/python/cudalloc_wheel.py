"""The build backend behind `pip install .` and `pip wheel .` (PEP 517,
named by pyproject.toml): builds libcudalloc.so and cudalloc-top with the
project's own CMake (tests, benchmarks and examples off) and makes one wheel
of them with the Python package `cudalloc` and the `cudalloc` command:

    cudalloc/__init__.py, __main__.py, view.py   the helper, the command, the viewer
    cudalloc/bin/cudalloc                        the command (scripts/cudalloc)
    cudalloc/lib/libcudalloc.so, cudalloc-top    found beside the package, no variable

It lives in the tree and needs the standard library alone: pip needs nothing
from the network to build (a backend on PyPI, scikit-build-core, is not among
Debian's packages, and the machines that build cudalloc have no index).
The wheel is for the platform it was built on: py3-none-manylinux_<glibc>_<arch>,
the C library's version this machine has being the oldest the library can
load with (it needs libc alone; no CUDA library is linked: the driver is
found at run time). CMAKE_ARGS (environment) adds arguments to CMake's
configure step, e.g. -DCUDALLOC_UTHASH_DIR=...
"""
import base64
import hashlib
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "scripts", "python", "cudalloc")


def _version():
    """The version, kept once in include/cudalloc.h."""
    with open(os.path.join(ROOT, "include", "cudalloc.h")) as f:
        parts = dict(re.findall(r"^#define CUDALLOC_VERSION_(MAJOR|MINOR|PATCH) (\d+)$",
                                f.read(), re.M))
    return "%s.%s.%s" % (parts["MAJOR"], parts["MINOR"], parts["PATCH"])


def _tag():
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    m = re.match(r"glibc (\d+)\.(\d+)", libc)
    arch = platform.machine()
    plat = "manylinux_%s_%s_%s" % (m.group(1), m.group(2), arch) if m else "linux_" + arch
    return "py3-none-" + plat


SUMMARY = ("A caching device-memory pool and leak report for any CUDA program, "
           "preloaded or in PyTorch's and CuPy's allocator slots")


def _metadata(version):
    return ("Metadata-Version: 2.1\nName: cudalloc\nVersion: %s\nSummary: %s\n"
            "License-File: LICENSE\nRequires-Python: >=3.6\n" % (version, SUMMARY))


def _tool_env():
    """The environment CMake runs in: the caller's, less what pip's build
    isolation adds for the backend's own Python (PYTHONPATH to a site that
    hides the environment's packages, PYTHONNOUSERSITE). A Python
    environment's bin/ may come first on PATH with PyPI's `cmake`, a console
    script that imports its module from those packages: under them it fails
    on any command (measured: PyTorch's environment on the GPU machine)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}


def _cmake(env):
    """The first cmake on PATH that runs."""
    for folder in env.get("PATH", "").split(os.pathsep):
        exe = os.path.join(folder or ".", "cmake")
        if os.path.isfile(exe) and os.access(exe, os.X_OK) and subprocess.run(
                [exe, "--version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=env).returncode == 0:
            return exe
    raise RuntimeError("cudalloc: no cmake on PATH runs (cmake 3.18 or later; on Debian: "
                       "apt-get install cmake)")


def _build(work):
    """Configures and builds the two binaries in `work`; their paths."""
    build = os.path.join(work, "build")
    env = _tool_env()
    cmake = _cmake(env)
    configure = [cmake, "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                 "-DCUDALLOC_BUILD_TESTS=OFF", "-DCUDALLOC_BUILD_BENCH=OFF",
                 "-DCUDALLOC_BUILD_EXAMPLES=OFF"] + shlex.split(os.environ.get("CMAKE_ARGS", ""))
    jobs = str(os.cpu_count() or 2)
    for cmd in (configure, [cmake, "--build", build, "--target", "cudalloc", "cudalloc-top",
                            "-j", jobs]):
        subprocess.run(cmd, check=True, stdout=sys.stderr, env=env)
    lib = os.path.realpath(os.path.join(build, "libcudalloc.so"))
    return lib, os.path.join(build, "cudalloc-top")


def _files(lib, top):
    """(name in the wheel, file on disk, executable) for every file."""
    files = [("cudalloc/%s" % n, os.path.join(PACKAGE, n), False)
             for n in ("__init__.py", "__main__.py", "view.py")]
    return files + [("cudalloc/bin/cudalloc", os.path.join(ROOT, "scripts", "cudalloc"), True),
                    ("cudalloc/lib/libcudalloc.so", lib, True),
                    ("cudalloc/lib/cudalloc-top", top, True)]


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (name, digest, len(data))


def _dist_info():
    """The wheel's .dist-info folder: its name, and its files but RECORD."""
    version = _version()
    dist = "cudalloc-%s.dist-info" % version
    meta = [(dist + "/METADATA", _metadata(version).encode()),
            (dist + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: cudalloc_wheel\n"
                               "Root-Is-Purelib: false\nTag: %s\n" % _tag()).encode()),
            (dist + "/entry_points.txt",
             b"[console_scripts]\ncudalloc = cudalloc.__main__:main\n")]
    with open(os.path.join(ROOT, "LICENSE"), "rb") as f:
        meta.append((dist + "/licenses/LICENSE", f.read()))
    return dist, meta


def _write_wheel(directory, files):
    dist, meta = _dist_info()
    name = "cudalloc-%s-%s.whl" % (_version(), _tag())
    record = []
    with zipfile.ZipFile(os.path.join(directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for arc, path, executable in files:
            with open(path, "rb") as f:
                data = f.read()
            info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = ((0o755 if executable else 0o644) | stat.S_IFREG) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
            record.append(_record_line(arc, data))
        for arc, data in meta:
            z.writestr(zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0)), data)
            record.append(_record_line(arc, data))
        record.append(dist + "/RECORD,,")
        z.writestr(zipfile.ZipInfo(dist + "/RECORD", date_time=(2020, 1, 1, 0, 0, 0)),
                   "\n".join(record) + "\n")
    return name


# ---- PEP 517 ------------------------------------------------------------------

def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    """The metadata alone, without building: else pip builds twice."""
    dist, meta = _dist_info()
    for arc, data in meta:
        path = os.path.join(metadata_directory, arc)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return dist


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    work = tempfile.mkdtemp(prefix="cudalloc-wheel.")
    try:
        lib, top = _build(work)
        return _write_wheel(wheel_directory, _files(lib, top))
    finally:
        shutil.rmtree(work, ignore_errors=True)
