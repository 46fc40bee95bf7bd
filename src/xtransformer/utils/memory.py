"""Hand freed heap memory back to the operating system after a big phase.

numpy's buffers are freed into glibc's malloc arenas (one per worker thread), which keep them: a
process that trained a model then holds its training scratch as resident memory while it goes
on to predict or serve. ``malloc_trim(0)`` returns the free pages; elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_free_memory() -> bool:
    """Return free heap pages to the OS (glibc); True if it could."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
