"""Giving freed memory back to the OS between the stages of a long build."""
from __future__ import annotations


def trim_heap() -> None:
    """malloc_trim(0): glibc keeps freed small blocks (a model's many tensors under its 32 MB mmap
    threshold, a lowering's graph objects) in its arenas, so RssAnon stays at the last stage's peak
    and the next stage starts from there. Not glibc: nothing to do."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
