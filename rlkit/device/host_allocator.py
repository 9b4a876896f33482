"""glibc ``malloc`` settings for training in host memory.

PyTorch's CPU tensors come straight from ``malloc``. By default glibc hands a large block
out as a fresh ``mmap`` and, when it is freed, returns it (and any large free space at
the top of its heap) to the kernel. A training step allocates and frees the same
activations every micro-batch, so every step faults the same memory in again, page by
page: on a CPU run that is system time, and cold caches, in every elementwise op and
every matrix product's output. :func:`keep_freed_host_memory` makes ``malloc`` serve
blocks up to :data:`MAX_HEAP_BLOCK` from its heap and keep freed heap memory for the next
allocation. The peak resident set stays what the peak allocation needs; memory freed
after a peak is kept by the process rather than returned.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
"""``mallopt`` parameter: free space at the top of the heap above this is returned."""
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter: blocks of at least this size get their own ``mmap``."""
MAX_HEAP_BLOCK = 32 << 20
"""The largest ``M_MMAP_THRESHOLD`` 64-bit glibc accepts (32 MiB)."""
KEEP_FREED = (1 << 31) - 1
"""``M_TRIM_THRESHOLD`` that never returns the heap's free top (the largest C int)."""


def keep_freed_host_memory(max_heap_block: int = MAX_HEAP_BLOCK) -> str | None:
    """Make this process's ``malloc`` keep freed memory for reuse (see the module docs).

    Args:
        max_heap_block: blocks below this many bytes come from the heap; larger ones
            still get their own ``mmap`` (and are returned when freed).

    Returns:
        ``None`` once applied, else why it was not (no glibc, or glibc refused).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
    except OSError as exc:
        return f"no C library to configure ({exc})"
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not hasattr(libc, "gnu_get_libc_version"):
        return f"the C library ({name}) is not glibc; malloc keeps its own settings"
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not mallopt(M_MMAP_THRESHOLD, max_heap_block):
        return f"glibc refused M_MMAP_THRESHOLD={max_heap_block}"
    if not mallopt(M_TRIM_THRESHOLD, KEEP_FREED):
        return f"glibc refused M_TRIM_THRESHOLD={KEEP_FREED}"
    return None
