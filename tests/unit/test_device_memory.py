"""A GPU's memory as the engine counts it, without a model: the emulated device (OFFLINE_SUMSCORE_DEVICE_MEMORY), what
counts as running out, the KV budget and the slots that claim from it, and the cost of a GPU's attention calls."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from offline_sumscore.core.errors import UsageError
from offline_sumscore.engine.local.attention import CPU_CALLS, RaggedPass
from offline_sumscore.engine.local.attention_cuda import GPU_CALLS
from offline_sumscore.engine.local.device_memory import (
    EmulatedGpuMemory,
    HostMemory,
    device_memory,
    emulated_memory_mib,
    is_out_of_memory,
)
from offline_sumscore.engine.local.kv_budget import KVBudget, KVBudgetExceeded
from offline_sumscore.engine.local.kv_slots import KVGeometry, KVSlots

MIB = 2**20
CONFIG = types.SimpleNamespace(
    num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=4, head_dim=4, hidden_size=16
)
GEOMETRY = KVGeometry.of(CONFIG, torch.float32)  # 128 bytes a token: 2 x 2 layers x 2 heads x 4 x 4 bytes


# -- the emulated device ------------------------------------------------------------------------------------------
def test_the_emulated_gpu_counts_what_is_alive_and_refuses_an_allocation_past_its_memory():
    memory = EmulatedGpuMemory(10 * MIB)
    with memory.tracking():
        a = torch.empty(4 * MIB, dtype=torch.uint8)
        view = a[:MIB]  # a view is the same storage: nothing more
        b = torch.zeros(4 * MIB, dtype=torch.uint8)
        assert memory.free() == 2 * MIB
        with pytest.raises(torch.OutOfMemoryError, match="emulated GPU out of memory: tried to allocate 4.0 MiB"):
            torch.ones(4 * MIB, dtype=torch.uint8)
        del b  # freed memory is free again, as in CUDA's allocator
        c = torch.ones(4 * MIB, dtype=torch.uint8)
    assert memory.refusals == 1 and memory.free() == 2 * MIB
    assert view.untyped_storage().data_ptr() == a.untyped_storage().data_ptr() and c.sum() == 4 * MIB
    outside = torch.empty(64 * MIB, dtype=torch.uint8)  # nothing outside tracking() is the device's
    assert memory.free() == 2 * MIB and outside.numel()


def test_the_emulated_gpu_counts_the_weights_it_is_given_and_measures_a_peak_above_them():
    memory = EmulatedGpuMemory(16 * MIB)
    model = torch.nn.Linear(1024, 1024)  # 4 MiB of weights
    memory.register(model)
    assert memory.free() == pytest.approx(12 * MIB, abs=8 * 1024)
    with memory.tracking(), memory.measuring() as found:
        x = torch.ones(256, 1024)
        y = model(x).relu()  # 1 MiB in, 1 MiB out, a temporary between
        del x, y
    assert MIB * 2 <= found["peak"] <= 4 * MIB


def test_the_switch_is_read_as_whole_mebibytes_and_a_bad_value_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("OFFLINE_SUMSCORE_DEVICE_MEMORY", "1536")
    assert emulated_memory_mib() == 1536
    assert device_memory("cpu").kind == "emulated" and device_memory("cpu").total() == 1536 * MIB
    assert device_memory("cpu") is device_memory(torch.device("cpu"))  # one device, as a GPU is one
    monkeypatch.setenv("OFFLINE_SUMSCORE_DEVICE_MEMORY", "1.5GB")
    with pytest.raises(UsageError, match=r"must be a whole number of MiB.*Given: 1.5GB"):
        device_memory("cpu")
    monkeypatch.delenv("OFFLINE_SUMSCORE_DEVICE_MEMORY")
    assert isinstance(device_memory("cpu"), HostMemory) and not device_memory("cpu").bounded


@pytest.mark.parametrize(
    "error,memory",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), True),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), True),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), True),
        (KVBudgetExceeded("keys and values for 2 slots x 64 columns do not fit"), True),
        (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_out_of_memory_is_any_failed_allocation_whoever_raised_it_and_nothing_else(error, memory):
    assert is_out_of_memory(error) is memory


# -- the KV budget and the slots that claim from it ----------------------------------------------------------------
def bounded_slots(budget: KVBudget, **kwargs) -> KVSlots:
    return KVSlots(CONFIG, dtype=torch.float32, device="cpu", budget=budget, **kwargs)


def fill(slots: KVSlots, counts: list[int]) -> None:
    """One pass feeding counts[r] tokens to slot r, each token's keys being its slot's number plus its column / 1000."""
    layout = slots.begin(counts)
    for r, n in enumerate(counts):
        for k, v in zip(slots.key_buffers, slots.value_buffers):
            start = slots.filled[r]
            values = r + torch.arange(start, start + n, dtype=torch.float32) / 1000
            k[r, :, start : start + n] = values[None, :, None]
            v[r, :, start : start + n] = -values[None, :, None]
    assert layout.tokens == sum(counts)
    slots.commit()


def held_values(slots: KVSlots, r: int) -> torch.Tensor:
    return slots.key_buffers[0][r, 0, : slots.filled[r], 0]


def test_slots_on_a_bounded_device_follow_the_live_rows_and_keep_what_they_hold():
    budget = KVBudget(4096, GEOMETRY.bytes_per_token, 2 * GEOMETRY.layers)
    slots = bounded_slots(budget)
    slots.place(3)
    fill(slots, [5, 300, 7])  # the long row takes every slot to its width: 3 slots x 320 columns
    assert slots.capacity == (3, 320) and budget.held[id(slots)] == 3 * 320
    before = [held_values(slots, r).clone() for r in (0, 2)]
    slots.release([1])  # the long row leaves: its slot and its width are no longer needed
    fill(slots, [1, 0, 1])
    rows, columns = slots.capacity
    assert rows * columns <= 3 * 128 and budget.held[id(slots)] == rows * columns  # laid out again, smaller
    assert torch.equal(held_values(slots, 0)[:5], before[0]) and torch.equal(held_values(slots, 2)[:7], before[1])
    slots.free()
    assert id(slots) not in budget.held


def test_a_shape_past_the_budget_is_refused_before_anything_is_allocated_and_the_slots_stay_as_they_were():
    budget = KVBudget(1024, GEOMETRY.bytes_per_token, 2 * GEOMETRY.layers)
    slots = bounded_slots(budget)
    slots.place(2)
    fill(slots, [10, 10])
    capacity, held = slots.capacity, held_values(slots, 1).clone()
    with pytest.raises(KVBudgetExceeded, match=r"2 slots x 1152 columns .* KV budget of 1024 tokens"):
        fill(slots, [1, 1100])
    assert slots.open is None or slots.abort() is None
    assert slots.capacity == capacity and torch.equal(held_values(slots, 1), held)


def test_out_of_memory_part_way_through_a_layout_leaves_every_buffer_holding_what_it_held(monkeypatch):
    budget = KVBudget(100_000, GEOMETRY.bytes_per_token, 2 * GEOMETRY.layers)
    slots = bounded_slots(budget)
    slots.place(2)
    fill(slots, [20, 30])
    held = [held_values(slots, r).clone() for r in (0, 1)]
    made = {"n": 0}
    allocate = KVSlots._uninitialised

    def third_fails(self, shape):
        made["n"] += 1
        if made["n"] == 3:  # two buffers of four laid out again, then the device runs out
            raise torch.OutOfMemoryError("injected")
        return allocate(self, shape)

    monkeypatch.setattr(KVSlots, "_uninitialised", third_fails)
    with pytest.raises(torch.OutOfMemoryError):
        slots.reserve(2, 500)
    monkeypatch.setattr(KVSlots, "_uninitialised", allocate)
    assert slots.capacity == (2, 64)  # what every buffer holds: the ones not yet changed
    shapes = {tuple(b.shape) for b in slots.key_buffers + slots.value_buffers}
    assert len(shapes) == 2  # two laid out again, two not
    for buffer in slots.key_buffers + slots.value_buffers:
        sign = 1 if any(buffer is k for k in slots.key_buffers) else -1
        for r, values in enumerate(held):
            assert torch.equal(buffer[r, 0, : slots.filled[r], 0], sign * values)
    fill(slots, [1, 400])  # and the next change finishes the layout
    assert slots.capacity[1] >= 431 and torch.equal(held_values(slots, 0)[:20], held[0])


def test_the_budget_keeps_one_buffer_spare_so_no_slot_set_is_ever_stuck_for_want_of_its_own_memory():
    budget = KVBudget(6400, GEOMETRY.bytes_per_token, 2 * GEOMETRY.layers)
    assert budget.tokens == 6400 + 1600  # 4 buffers a set: changing one holds one buffer more
    slots = bounded_slots(budget)
    slots.place(1)
    fill(slots, [6000])  # one row nearly as wide as the budget
    slots.release([0])
    slots.place(25)  # 25 short rows in its place: laid out again, beside the old set, one buffer at a time
    fill(slots, [100] * 25)
    assert slots.capacity[0] == 25 and budget.held[id(slots)] <= budget.usable


# -- a GPU's attention calls ------------------------------------------------------------------------------------
def scenario(rows: int, multi: int, prompt: int, seed: int = 0):
    """The review's layouts: decoding rows 900-2,000 tokens long, some feeding 2-9 tokens (a pick and its forced
    tokens, or a draft), and one new prompt in the middle of the batch."""
    rng = np.random.default_rng(seed)
    filled = rng.integers(900, 2000, rows)
    counts = np.ones(rows, dtype=np.int64)
    counts[rng.choice(rows, multi, replace=False)] = rng.integers(2, 10, multi)
    filled[rows // 2], counts[rows // 2] = 0, prompt
    return filled, counts


@pytest.mark.parametrize("rows,multi,prompt", [(400, 6, 800), (400, 50, 800), (500, 100, 3000), (512, 300, 16384)])
def test_a_gpus_attention_calls_compute_about_the_cells_their_tokens_need_and_never_a_pass_sized_mask(
    rows, multi, prompt
):
    """The engine used to attend past 8 such runs in one call padded to the widest feed: at 400 rows beside an
    800-token prompt 512x the cells needed and an 8.1 GiB mask; at 500 beside 3,000 tokens 751x and 58 GiB."""
    filled, counts = scenario(rows, multi, prompt)
    layout = RaggedPass(filled, counts, torch.device("cpu"), calls=GPU_CALLS)
    computed, needed = layout.cells
    # The padding is what the merges bought, each worth less than the launch it saved (call_cells)...
    merges = sum(int((counts[r.first : r.end] > 1).sum()) - 1 for r in layout.runs if r.lo == 0)
    own = sum(int(c) * int(f + c) for f, c in zip(filled, counts) if c > 1)  # each such slot's own call
    assert computed - (rows * int((filled + counts).max())) <= own + merges * GPU_CALLS.call_cells
    # ...a few times the cells needed at most, where one call padded to the widest feed computed hundreds of times
    multi = np.flatnonzero(counts > 1)
    padded = (multi[-1] + 1 - multi[0]) * int(counts.max()) * int((filled + counts).max())
    assert computed <= 5 * needed < padded / 20
    group, bf16 = 7, 2  # Qwen2.5-7B: 7 query heads a kv head, bfloat16 masks
    largest = max((r.end - r.first) * r.width * r.stop * group * bf16 for r in layout.runs)
    assert largest <= GPU_CALLS.block_cells * group * bf16 and largest < 200 * MIB
    cpu = RaggedPass(filled, counts, torch.device("cpu"), calls=CPU_CALLS)
    assert len(layout.runs) <= len(cpu.runs)  # fewer launches than a CPU's calls, never more


def test_gpu_calls_merge_small_feeds_across_the_rows_between_them_and_keep_a_prompt_apart():
    filled = np.array([500, 510, 505, 0, 520, 515])
    counts = np.array([3, 1, 4, 700, 1, 2])
    calls = [(r.first, r.end) for r in RaggedPass(filled, counts, torch.device("cpu"), calls=GPU_CALLS).runs]
    assert calls == [(0, 3), (3, 4), (5, 6)] or calls == [(0, 3), (3, 4), (4, 6)]
    assert [(r.first, r.end) for r in RaggedPass(filled, counts, torch.device("cpu")).runs] == [
        (0, 1),
        (2, 3),
        (3, 4),
        (5, 6),
    ]
