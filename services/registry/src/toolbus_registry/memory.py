"""How the registry process holds memory: one malloc arena and a small, fixed pool of worker
threads, set once at start (`python -m toolbus_registry`).

Why: the registry runs the search model on worker threads. glibc gives every thread that
allocates concurrently an arena of its own and keeps what each arena held; with asyncio's default
pool (up to 6 threads on 2 cores) running searches, that was ~2.5 MiB an arena, ~19 MiB of RSS
that never came back (measured: 150 MiB after registration, 169 MiB after 1,000 searches).
One arena (`M_ARENA_MAX`) and `WORKER_THREADS` threads bound it; the registry is not on the call
hot path, so sharing one arena's lock costs nothing measurable. glibc only; elsewhere a no-op.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("toolbus.registry")

M_ARENA_MAX = -8
M_MMAP_THRESHOLD = -3
M_TRIM_THRESHOLD = -1
"""`mallopt` parameter numbers (glibc's malloc.h)."""
ARENAS = 1
MMAP_THRESHOLD = 8 * 1024 * 1024
"""Allocations from this size up get pages of their own, unmapped when freed. Fixing it turns off
glibc's sliding threshold, which after the encoder frees its first multi-MiB activations keeps
every later block of that size in the heap (and up to twice that free at its top)."""
TRIM_THRESHOLD = 1024 * 1024
"""Free memory at the top of the heap beyond this is handed back to the OS at once."""
WORKER_THREADS = 2
"""Threads of the event loop's default executor (declarations, index builds, searches): the
machine's 2 cores cannot run more of that CPU-bound work at once. The background embedding has a
thread of its own (`search.embeddings`)."""


def limit_arenas(arenas: int = ARENAS, mmap_threshold: int = MMAP_THRESHOLD) -> bool:
    """Cap glibc's malloc arenas and fix its mmap threshold (call before threads start
    allocating). False where there is no glibc `mallopt` or it refuses."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:
        return False
    ok = all(
        mallopt(param, value)
        for param, value in (
            (M_ARENA_MAX, arenas),
            (M_MMAP_THRESHOLD, mmap_threshold),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        )
    )
    if not ok:
        log.warning("mallopt refused; malloc keeps its default arenas and thresholds")
    return ok


def bound_worker_threads(loop: asyncio.AbstractEventLoop, workers: int = WORKER_THREADS) -> None:
    """Give the loop a default executor of `workers` threads (what `asyncio.to_thread` uses)."""
    loop.set_default_executor(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="toolbus-registry"))
