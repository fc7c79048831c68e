"""How many rows and cached tokens a batch may hold (from the device's free memory unless the user gave them), and
how many tokens one pass may compute."""

from __future__ import annotations

import os
from dataclasses import dataclass

from offline_sumscore.engine.local.kv_slots import KVGeometry


@dataclass(frozen=True)
class Capacity:
    rows: int
    token_budget: int
    pass_tokens: int  # tokens one forward pass computes at most (a longer prompt goes in chunks)
    reason: str  # how they were chosen, stored with every row
    free_memory: str  # what was free when the engine was built; kept off the rows (it changes from run to run)


# Tokens a pass computes at most, unless given (vLLM's max_num_batched_tokens). On a CPU a pass of many thousand
# tokens runs slower per token than one of a few thousand, once a layer's activations outgrow the cache: measured on
# the 2-core machine, the embedded judge's decoder ran 1,000 tokens/s in passes of 14,400 tokens and 1,250 to 1,320
# in passes of 2,900 to 5,800, and the engine at bulk was fastest at 2,048 (research/results/pass_tokens.md). On a
# GPU, vLLM's own default for offline runs on an H100 or H200 (not measured here).
PASS_TOKENS_CPU, PASS_TOKENS_GPU = 2048, 16384


def capacity(
    model,
    device,
    *,
    batch_size: int | None,
    token_budget: int | None,
    device_share: float,
    pass_tokens: int | None = None,
) -> Capacity:
    """Rows and cached tokens per batch: from free memory unless given; tokens per pass: the device's default
    unless given."""
    import torch

    per_token = KVGeometry.of(model.config, model.dtype).bytes_per_token
    if device.type == "cuda":
        device_free, _ = torch.cuda.mem_get_info(device)
        # Memory PyTorch holds in its caching allocator but does not use is free to this process too.
        spare = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        where, default_rows = f"{device_free / 2**30:.1f} GiB free on {device}", 512
    else:
        (device_free, what), spare = available_ram(), 0
        where, default_rows = f"{device_free / 2**30:.1f} GiB {what}", 64
    free = usable_memory(device_free, spare, device_share)
    if device_share < 1:
        where += f", {device_share:g} of it for this engine"
    rows = batch_size or default_rows
    budget = token_budget or kv_token_budget(free, per_token)
    per_pass = pass_tokens or (PASS_TOKENS_GPU if device.type == "cuda" else PASS_TOKENS_CPU)
    why = (
        f"up to {rows} rows and {budget} cached tokens per batch, {per_pass} tokens per pass "
        f"({'given' if batch_size else 'default'} rows; budget "
        f"{'given' if token_budget else 'from half the free memory, rounded down to a power of two'}, "
        f"{per_token} bytes of KV per token; tokens per pass {'given' if pass_tokens else 'the default'})"
    )
    return Capacity(rows, budget, per_pass, why, where)


def available_ram(meminfo: str = "/proc/meminfo") -> tuple[int, str]:
    """Bytes of RAM a new allocation can take, and what they are: Linux's MemAvailable (free pages plus the page
    cache and other memory it can reclaim), else the free pages alone. Free pages alone shrink with every file read
    (model weights, a compile cache), so the budget depended on what ran before: in one ladder run the bulk
    engine's budget halved against the run before, its prefix store with it, at the same memory in use."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available RAM"
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free RAM"


def usable_memory(free: int, reserved_unused: int, share: float) -> int:
    """Bytes this engine may fill: what the device reports free plus what PyTorch's allocator holds unused, times
    the engine's share of the device (engines sharing one GPU, as Ray actors with a fraction of a GPU each do,
    would each see the whole of it free)."""
    return int((free + max(0, reserved_unused)) * share)


def kv_token_budget(free: int, per_token: int) -> int:
    """Half of usable memory for the KV cache (activations and logits need the rest), rounded down to a power of
    two so that the budget, which shapes the batches and is stored in every row, does not drift with a few MB of
    free memory from one run to the next. 4096 tokens at least."""
    return 1 << max(12, int(free * 0.5 / per_token).bit_length() - 1)
