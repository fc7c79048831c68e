"""Out of memory, handled one way everywhere in the engine: the failed work's tensors are freed first (the error is
handled outside its except block), the device's cached blocks go back, the split is counted, and the work is
halved; work that cannot run even alone fails loudly. Greedy decoding makes a halved rerun give the same rows."""

from __future__ import annotations

from collections.abc import Callable

from offline_sumscore.core.errors import Failure

OOM_ALONE = "out of memory even alone; use a shorter prompt or a larger device"


class MemoryGuard:
    def __init__(self, device, stats):
        import torch

        self.device, self.stats = device, stats
        self.errors = (torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else (RuntimeError,)

    def attempt(self, work: Callable[..., object], *args) -> bool:
        """Run work(*args); False when it ran out of memory (its memory is released and the split counted by then)."""
        try:
            work(*args)
            return True
        except self.errors:
            pass  # recovered below, outside the except block, so the failed work's tensors are freed first
        self.stats.oom_splits += 1
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()
        return False


def halves(items: list) -> tuple[list, list]:
    """The older half and the newer half (the newer is the one sent back or run second)."""
    half = len(items) // 2
    return items[:half], items[half:]


def fail_alone(rows) -> None:
    """Rows that ran out of memory with nothing left to halve."""
    for row in rows:
        row.fail(Failure.MEMORY, OOM_ALONE)
