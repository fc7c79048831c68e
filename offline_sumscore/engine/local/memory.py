"""Out of memory, handled one way everywhere in the engine: the failed work's tensors are freed first (the error is
handled outside its except block), the device's cached blocks go back, the split is counted, and the work is
halved; work that cannot run even alone fails loudly, naming what it needed. Greedy decoding makes a halved rerun
give the same rows.

Out of memory is whatever device_memory.is_out_of_memory says: torch's OutOfMemoryError (the engine's own KV budget
refusing a shape is one: KVBudgetExceeded), and the allocation failures cuBLAS, cuDNN and the CPU's allocator raise
as plain RuntimeErrors. Any other error is no memory problem, and is raised as it is.
"""

from __future__ import annotations

from collections.abc import Callable

from offline_sumscore.core.errors import Failure
from offline_sumscore.engine.local.device_memory import DeviceMemory, is_out_of_memory

OOM_ALONE = "out of memory even alone; use a shorter prompt or a larger device"


class MemoryGuard:
    def __init__(self, memory: DeviceMemory, stats):
        self.memory, self.stats = memory, stats
        self.last_error: str | None = None  # what the last out-of-memory error said, for a row that fails alone

    def attempt(self, work: Callable[..., object], *args) -> bool:
        """Run work(*args); False when it ran out of memory (its memory is released and the split counted by then)."""
        try:
            work(*args)
            return True
        except Exception as exc:  # noqa: BLE001 - only running out of memory is handled here
            if not is_out_of_memory(exc):
                raise
            self.last_error = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        # Recovered here, outside the except block, so the failed work's tensors are freed first.
        self.stats.oom_splits += 1
        self.memory.release_cached()
        return False

    def alone(self) -> str:
        """The message of a row that ran out of memory with nothing left to halve: what it needed, where known."""
        if not self.last_error:
            return OOM_ALONE
        return f"out of memory even alone ({self.last_error}); use a shorter prompt or a device with more memory"


def halves(items: list) -> tuple[list, list]:
    """The older half and the newer half (the newer is the one sent back or run second)."""
    half = len(items) // 2
    return items[:half], items[half:]


def fail_alone(rows, message: str = OOM_ALONE) -> None:
    """Rows that ran out of memory with nothing left to halve."""
    for row in rows:
        row.fail(Failure.MEMORY, message)
