"""Whether a judge's weights fit the device it loads on. On a device of bounded memory (a GPU, or one emulated with
OFFLINE_SUMSCORE_DEVICE_MEMORY) weights larger than the whole device are refused from the files' headers before they
load; a load that runs the device out of memory anyway (.bin weights, whose size only loading tells, or a device
others fill) ends in the same kind of line. Either is one ModelLoadError naming the weights' size and the device's
memory, where it was torch.OutOfMemoryError's traceback after the load's seconds or minutes."""

from __future__ import annotations

import contextlib
from pathlib import Path

from offline_sumscore.core.errors import ModelLoadError

MIB = 2**20


def refuse_larger_than_device(path: Path, dev: str, torch_dtype) -> int | None:
    """The bytes the judge's weights take in torch_dtype, from its files' headers: None where they do not say, or
    where the device's memory is not bounded (a CPU's RAM); a ModelLoadError where they exceed the whole device."""
    from offline_sumscore.engine.local.device_memory import device_memory
    from offline_sumscore.engine.model_header import weights_in_memory

    memory = device_memory(dev)
    if not memory.bounded:
        return None
    weights = weights_in_memory(path, torch_dtype.itemsize)
    if weights is not None and weights > memory.total():
        smaller = ", --dtype bfloat16" if torch_dtype.itemsize > 2 else ""
        raise ModelLoadError(
            f"{path}: its weights take {weights / MIB:,.0f} MiB in {str(torch_dtype).replace('torch.', '')}, more "
            f"than the whole device holds: {memory.describe()}; use a smaller judge{smaller} or a larger device "
            "(refused before loading)"
        )
    return weights


@contextlib.contextmanager
def out_of_memory_said(path: Path, dev: str, weights: int | None):
    """The device ran out of memory while the judge's weights loaded onto it: one ModelLoadError line naming their
    size (where the files said it) and the device's memory, not torch.OutOfMemoryError's traceback."""
    from offline_sumscore.engine.local.device_memory import device_memory, is_out_of_memory

    try:
        yield
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError; numpy's is a MemoryError
        if isinstance(exc, RuntimeError) and not is_out_of_memory(exc):
            raise
        memory = device_memory(dev)
        size = f"its weights ({weights / MIB:,.0f} MiB)" if weights is not None else "its weights"
        raise ModelLoadError(
            f"{path}: the device ran out of memory loading {size}: {memory.describe()}; use a smaller judge, a "
            "smaller --dtype or a larger device, or free the device of other work"
        ) from None
