"""`cudalloc` and `python3 -m cudalloc`: with no argument, whether the
library is loaded in this interpreter and which version; with arguments,
the `cudalloc` command (run, top, view: `cudalloc --help`), the shell
script inside the package (bin/cudalloc), which finds the library, the
viewer and cudalloc-top beside it."""
import os
import sys

import cudalloc


def command():
    """The `cudalloc` shell command: the package's own (a wheel's
    bin/cudalloc), else the source tree's (scripts/cudalloc)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for rel in ("bin/cudalloc", "../../cudalloc"):
        path = os.path.normpath(os.path.join(here, rel))
        if os.path.isfile(path):
            return path
    return None


def library_version():
    """`cudalloc --version` for the library inside the package, whose file
    name (a wheel holds no links) does not carry the version the shell
    command reads: asked of the library itself, which touches no device."""
    import ctypes
    path = cudalloc.library_path()
    fn = ctypes.CDLL(path).cudalloc_version
    fn.restype = ctypes.c_char_p
    return "cudalloc %s (%s)" % (fn().decode(), path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:
        try:
            print(library_version())
            return 0
        except (OSError, AttributeError) as e:
            print("cudalloc: %s" % e, file=sys.stderr)
            return 2
    if not argv:
        if cudalloc.loaded():
            print("cudalloc %s is loaded in this process" % cudalloc.version())
        else:
            print("cudalloc is not loaded in this process: run it under "
                  "`cudalloc run -- python3 ...`")
        return 0
    script = command()
    if script is None:
        print("cudalloc: the cudalloc command is not beside %s" % cudalloc.__file__,
              file=sys.stderr)
        return 2
    os.execv("/bin/sh", ["sh", script] + list(argv))
    return 2  # not reached


if __name__ == "__main__":
    sys.exit(main())
