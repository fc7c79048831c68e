"""How many rows and cached tokens a batch may hold, how many tokens one pass may compute, and, on a device of bounded
memory (a GPU, or one emulated: device_memory.py), the one budget every KV allocation draws from.

On a CPU: the rows given or 64, and half the available RAM for keys and values, rounded down to a power of two (RAM
is paid for when touched, so a budget that is never filled costs nothing).

On a GPU, as vLLM sizes its cache: KV_SHARE of the device's total memory (times the engine's share of the device, and
no more than is free now and the judge's weights), less those weights and the peak of one full pass measured before
anything else is allocated (activation peak). A fifth of it is the prefix store's pool,
allocated at once; the rest is KVBudget's, which the running batch's slots and a likelihood pack's slots claim before
they allocate (the growth of a slot set, old and new buffers at once, included): a claim past it is refused with
KVBudgetExceeded, an out-of-memory error raised before any memory is touched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from offline_sumscore.core.errors import ModelLoadError
from offline_sumscore.engine.local.device_memory import is_out_of_memory
from offline_sumscore.engine.local.kv_budget import KVBudget
from offline_sumscore.engine.local.kv_slots import KVGeometry

# Tokens a pass computes at most, unless given (vLLM's max_num_batched_tokens). On a CPU a pass of many thousand
# tokens runs slower per token than one of a few thousand, once a layer's activations outgrow the cache: measured on
# the 2-core machine, the embedded judge's decoder ran 1,000 tokens/s in passes of 14,400 tokens and 1,250 to 1,320
# in passes of 2,900 to 5,800, and the engine at bulk was fastest at 2,048 (research/results/pass_tokens.md). On a
# GPU, vLLM's own default for offline runs on an H100 or H200 (not measured here).
PASS_TOKENS_CPU, PASS_TOKENS_GPU = 2048, 16384
ROWS_CPU, ROWS_GPU = 64, 512  # rows a batch holds at most, unless given
KV_SHARE = 0.9  # of a bounded device's memory, for weights, activations and keys and values (vLLM's default)
STORE_SHARE = 0.2  # of a bounded device's KV memory, for the prefix store's pool (a quarter of the slots')
MIN_KV_TOKENS = 1024  # fewer, and a bounded device cannot hold a useful batch: refused at start, loudly


@dataclass(frozen=True)
class Capacity:
    rows: int
    token_budget: int  # KV tokens the running batch's slots (and a likelihood pack's) hold at most
    pass_tokens: int  # tokens one forward pass computes at most (a longer prompt goes in chunks)
    reason: str  # how they were chosen, stored with every row
    free_memory: str  # what was free when the engine was built; kept off the rows (it changes from run to run)
    store_tokens: int | None = None  # the prefix store's pool on a bounded device (None: a quarter of the budget)
    bounded: bool = False  # the budget is a device's fixed memory, claimed through KVBudget


def default_rows(memory) -> int:
    return ROWS_GPU if memory.bounded else ROWS_CPU


def default_pass_tokens(memory) -> int:
    """A GPU's, or a CPU's; an emulated GPU computes on the CPU, where a pass of 16,384 tokens takes as long to
    measure as a whole small run (72 s with the embedded judge on the 2-core machine), so it keeps the CPU's."""
    return PASS_TOKENS_GPU if memory.kind == "cuda" else PASS_TOKENS_CPU


def capacity(
    model,
    memory,
    *,
    rows: int,
    token_budget: int | None,
    device_share: float,
    pass_tokens: int,
    given_rows: bool = False,
    given_pass: bool = False,
    activation_peak: Callable[[], int] | None = None,
) -> Capacity:
    """The batch's budget on this device's memory (module docstring). activation_peak: measures one full pass's
    peak in bytes (a bounded device's sizing calls it unless the budget is given)."""
    per_token = KVGeometry.of(model.config, model.dtype).bytes_per_token
    said = f"{'given' if given_rows else 'default'} rows; tokens per pass {'given' if given_pass else 'the default'}"
    if memory.bounded:
        return _bounded(model, memory, rows, token_budget, device_share, pass_tokens, per_token, said, activation_peak)
    (device_free, what), spare = available_ram(), 0
    where = f"{device_free / 2**30:.1f} GiB {what}"
    free = usable_memory(device_free, spare, device_share)
    if device_share < 1:
        where += f", {device_share:g} of it for this engine"
    budget = token_budget or kv_token_budget(free, per_token)
    why = (
        f"up to {rows} rows and {budget} cached tokens per batch, {pass_tokens} tokens per pass "
        f"({'given' if given_rows else 'default'} rows; budget "
        f"{'given' if token_budget else 'from half the free memory, rounded down to a power of two'}, "
        f"{per_token} bytes of KV per token; tokens per pass {'given' if given_pass else 'the default'})"
    )
    return Capacity(rows, budget, pass_tokens, why, where)


def _bounded(model, memory, rows, token_budget, share, pass_tokens, per_token, said, activation_peak) -> Capacity:
    """A GPU's sizing, or an emulated one's: from the device's total memory, less the weights and a measured pass."""
    gib = 2**30
    total, free = memory.total(), memory.free()
    where = f"{free / gib:.1f} GiB free of {total / gib:.1f} GiB ({memory.describe()})"
    if share < 1:
        where += f", {share:g} of it for this engine"
    if token_budget:
        why = (
            f"up to {rows} rows and {token_budget} tokens of keys and values in the running batch (given), a quarter "
            f"of that in the prefix store, {pass_tokens} tokens per pass ({said}; {per_token} bytes of KV per token)"
        )
        return Capacity(rows, token_budget, pass_tokens, why, where, token_budget // 4, bounded=True)
    weights = weight_bytes(model)
    peak = _measured_peak(activation_peak, memory, weights, pass_tokens)
    # What this engine could ever hold: its share of the device, or what is free now and its own weights, where
    # others hold the rest (another process, another engine).
    ceiling = min(int(total * share), free + weights)
    kv = int(ceiling * KV_SHARE) - weights - peak
    if kv < MIN_KV_TOKENS * per_token:
        raise ModelLoadError(
            f"the judge does not fit this device with room to judge: {KV_SHARE:.0%} of its {ceiling / gib:.2f} GiB "
            f"({memory.describe()}) less the weights' {weights / gib:.2f} GiB and a pass's peak of {peak / gib:.2f} "
            f"GiB ({pass_tokens} tokens) leaves {max(kv, 0) / gib:.2f} GiB for keys and values, fewer than "
            f"{MIN_KV_TOKENS} tokens at {per_token} bytes each; use fewer tokens per pass, a smaller judge or a "
            "larger device"
        )
    store = int(kv * STORE_SHARE) // per_token
    geometry = KVGeometry.of(model.config, model.dtype)
    budget = round_down(KVBudget.spare(kv // per_token - store, geometry))  # a slot set changes in a spare buffer
    why = (
        f"up to {rows} rows and {budget} tokens of keys and values in the running batch ({budget * per_token / gib:.2f}"
        f" GiB), {store} in the prefix store, {pass_tokens} tokens per pass ({said}): {KV_SHARE:.0%} of the device's "
        f"memory less the weights' {weights / gib:.2f} GiB and a full pass's measured peak of {peak / gib:.2f} GiB; "
        f"{per_token} bytes of KV per token"
    )
    return Capacity(rows, budget, pass_tokens, why, where, store, bounded=True)


def _measured_peak(activation_peak: Callable[[], int] | None, memory, weights: int, pass_tokens: int) -> int:
    """One full pass's measured peak (0 where nothing measures it); a device that cannot hold that pass beside the
    weights is a ModelLoadError naming both, not the measuring pass's torch.OutOfMemoryError."""
    if activation_peak is None:
        return 0
    try:
        return activation_peak()
    except (RuntimeError, MemoryError) as exc:
        if isinstance(exc, RuntimeError) and not is_out_of_memory(exc):
            raise
        raise ModelLoadError(
            f"the judge does not fit this device with room to judge: its weights take {weights / 2**20:,.0f} MiB "
            f"and one pass of {pass_tokens} tokens ran out of memory beside them on the device, {memory.describe()}; "
            "use fewer tokens per pass, a smaller judge or a larger device"
        ) from None


def weight_bytes(model) -> int:
    """The bytes of a model's parameters and buffers (tied weights once)."""
    seen, total = set(), 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


def round_down(tokens: int, bits: int = 5) -> int:
    """tokens with all but its top `bits` bits cleared (within about 3% of it): a budget that a few MB of free memory
    more or less does not change from run to run, since it shapes the batches and is stored in every row."""
    drop = max(0, tokens.bit_length() - bits)
    return tokens >> drop << drop


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
