"""Give freed memory back to the operating system between the stages of an export."""

from __future__ import annotations

import ctypes
import functools
import gc


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def trim_heap() -> None:
    """Ask glibc to hand free heap pages back (no garbage collection: cheap enough to
    call once per sublayer).  A no-op where there is no glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def return_freed_memory() -> None:
    """Collect garbage, then trim the heap.

    After the first large free, glibc raises its mmap threshold (up to 32 MB), so
    later weight-sized tensors come from the heap, whose free pages it keeps:
    measured, a 1.3 GB model freed before ONNX Runtime loaded its file still
    counted in full in the process's RSS."""
    gc.collect()
    trim_heap()


MMAP_THRESHOLD = 2**20
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def map_large_buffers() -> None:
    """From now on, glibc serves buffers of 1 MiB and more with their own mappings,
    returned to the system when freed (its default threshold rises to 32 MB after the
    first large free, and freed heap below it stays resident).  For a process that
    exists to export or validate one large model (the CLI), not for library callers."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
