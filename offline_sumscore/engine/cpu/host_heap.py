"""The host's C heap handed back to the system as a run goes. glibc keeps the memory that freed tensors leave in its
arenas (tensors of many sizes fragment them), so a long CPU run's resident memory crept up while the memory in use
stayed flat: measured on the embedded design, about 20 MiB per 100 rows once the prefix store was full. Every
TRIM_EVERY forward passes the engine asks glibc to return the free memory it holds (malloc_trim); the pages come
back from the kernel, zeroed, when next used. Where the C library has no malloc_trim (macOS, musl) nothing is done:
those allocators return memory on their own terms.
"""

from __future__ import annotations

import ctypes
import time

TRIM_EVERY = 256  # forward passes between trims: seconds of work on a CPU, and a trim takes milliseconds


def _malloc_trim():
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


class HeapTrimmer:
    """Counts the engine's passes and trims the heap every TRIM_EVERY of them (counted in stats: heap_trims and
    heap_trim_seconds)."""

    def __init__(self, stats, every: int = TRIM_EVERY):
        self.stats, self.every = stats, every
        self._trim = _malloc_trim()
        self._at = 0

    def after_step(self) -> None:
        if self._trim is None or self.stats.forward_passes - self._at < self.every:
            return
        started = time.perf_counter()
        self._trim(0)
        self.stats.heap_trims += 1
        self.stats.heap_trim_seconds += time.perf_counter() - started
        self._at = self.stats.forward_passes
