"""Host values onto the device without making the host wait: what every pass sends (token ids, positions, indices)."""

from __future__ import annotations

import numpy as np
import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on the device without a synchronisation: copied from pinned memory, asynchronously (a copy
    from pageable memory waits for the device)."""
    if device.type == "cpu":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def indices(values, device: torch.device) -> torch.Tensor:
    return to_device(torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)), device)
