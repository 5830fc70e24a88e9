"""pytest plugin (-p cupy_slot_plugin): with CUPY_SLOT=1, cudalloc becomes
CuPy's allocator (cudalloc.cupy.use()) before any test runs, so that one of
CuPy's own test modules runs through the slot (tests/gpu/gpu_slot.py)."""

import os


def pytest_configure(config):
    if os.environ.get("CUPY_SLOT") != "1":
        return
    import cudalloc
    cudalloc.cupy.use()
    print("cupy_slot_plugin: cudalloc.cupy.use() installed", flush=True)
