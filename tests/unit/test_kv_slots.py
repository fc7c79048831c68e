"""KVSlots and ragged attention on a small made-up geometry, against plain per-row attention (no model)."""

import types
from dataclasses import replace

import numpy as np
import pytest
import torch

from offline_sumscore.engine.local.attention import CPU_CALLS, RaggedPass, grouped_query_sdpa, ragged_attention
from offline_sumscore.engine.local.attention_cuda import GPU_CALLS
from offline_sumscore.engine.local.kv_slots import KVSlots

CONFIG = types.SimpleNamespace(
    num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=4, head_dim=3, hidden_size=12
)


@pytest.fixture(autouse=True)
def garbage_in_fresh_buffers(monkeypatch):
    """Fresh buffers as a device allocates them: uninitialised memory, here NaN, so any region a pass attends without
    its being zeroed or written first shows up as a NaN (every test below runs so, and feed() checks the attended
    span). A CPU's own buffers are zero pages instead (tests/unit/test_kv_zero_pages.py)."""
    monkeypatch.setattr(KVSlots, "zero_filled", property(lambda self: False))
    monkeypatch.setattr(
        KVSlots, "_uninitialised", lambda self, shape: torch.full(shape, float("nan"), dtype=self.dtype)
    )


def slots(rows=0):
    s = KVSlots(CONFIG, dtype=torch.float32, device="cpu")
    s.place(rows)
    return s


def feed(s, counts, layers=2):
    """One pass: slot r feeds counts[r] tokens; every layer writes keys = values = a running number per token,
    from 100 x the pass's number on. Returns what the last layer attended (keys over the pass's span)."""
    layout = s.begin(list(counts))
    new = (torch.arange(layout.tokens, dtype=torch.float32) + 100 * s.reallocations + 1000 * feed.calls)[
        None, None, :, None
    ].expand(1, 2, layout.tokens, 3)
    feed.calls += 1
    for layer in range(layers):
        keys, _ = s.layers[layer].update(new, new)
    assert torch.isfinite(keys).all()  # every column a pass attends holds finite values
    s.commit()
    return keys


feed.calls = 0


def row_tokens(s, slot, layer=0):
    return s.key_buffers[layer][slot, 0, : s.filled[slot], 0].tolist()


def test_a_pass_writes_each_row_after_its_own_last_token_and_moves_no_buffer():
    s = slots(2)
    feed(s, [3, 1])
    buffer = s.key_buffers[0].data_ptr()
    for _ in range(5):  # one-token steps within capacity: no reallocation, no copy of the cache
        feed(s, [1, 1])
    assert s.key_buffers[0].data_ptr() == buffer and s.filled == [8, 6] and s.width == 8
    before = row_tokens(s, 1)
    keys = feed(s, [0, 2])  # a row that feeds nothing keeps its tokens; the other's go right after its own
    assert s.filled == [8, 8] and row_tokens(s, 1)[:6] == before and keys.shape == (2, 2, 8, 3)


def test_a_pass_that_raises_halfway_leaves_every_row_as_it_was():
    s = slots(2)
    feed(s, [2, 2])
    before = [row_tokens(s, r) for r in range(2)]
    s.begin([3, 1])
    s.layers[0].update(torch.ones(1, 2, 4, 3), torch.ones(1, 2, 4, 3))  # layer 0 wrote, layer 1 never did
    s.abort()
    assert s.filled == [2, 2] and [row_tokens(s, r) for r in range(2)] == before
    feed(s, [1, 1])  # the next pass writes over the forgotten columns
    assert s.filled == [3, 3]


def test_tokens_given_back_are_written_over_by_the_rows_next_pass():
    s = slots(2)
    feed(s, [2, 2])
    feed(s, [5, 1])  # row 0 fed four draft tokens; the judge kept one of them
    s.give_back([(0, 3)])
    assert s.filled == [4, 3]
    feed(s, [1, 1])
    assert s.filled == [5, 4] and row_tokens(s, 0)[4] != row_tokens(s, 0)[3] + 1  # a new pass's token at column 4


def test_a_finished_rows_slot_goes_to_the_next_row_and_trailing_free_slots_leave_the_span():
    s = slots(4)
    feed(s, [2, 2, 2, 2])
    s.release([1, 3])
    assert s.rows == 3 and s.used == [True, False, True] and s.filled == [2, 0, 2]
    assert s.place(2) == [1, 3]  # the lowest free slot first, then past the end
    assert s.filled == [2, 0, 2, 0]
    feed(s, [1, 3, 1, 3])
    assert s.filled == [3, 3, 3, 3]
    with pytest.raises(RuntimeError, match="free slot"):
        s.release([2])
        s.begin([1, 1, 1, 1])


def test_the_cache_grows_when_full_and_keeps_every_row():
    s = slots(1)
    feed(s, [60])
    reference = row_tokens(s, 0, layer=1)
    feed(s, [10])  # past the first 64 columns: one reallocation
    assert s.reallocations == 2 and row_tokens(s, 0, layer=1)[:60] == reference
    placed = s.place(20)  # past the first 8 slots
    s.fork(0, placed, 60)
    assert s.rows == 21 and row_tokens(s, 20, layer=1) == reference


def test_a_fork_copies_the_first_tokens_of_one_slot_into_others_and_a_write_stores_given_ones():
    s = slots(5)
    feed(s, [4, 1, 1, 1, 1])
    s.fork(0, [1, 2, 4], 3)
    assert s.filled == [4, 3, 3, 1, 3]
    assert row_tokens(s, 4) == row_tokens(s, 0)[:3] == row_tokens(s, 2)
    kv = s.row_views(0)
    s.write(3, kv, 4)
    assert row_tokens(s, 3) == row_tokens(s, 0) and s.filled[3] == 4


def reference_attention(q, keys, values, filled, counts, group):
    """Each row alone: its new tokens' queries over its own columns [0, filled + count), causal."""
    out, t = [], 0
    for r, (f, n) in enumerate(zip(filled, counts)):
        for j in range(n):
            qq = q[0, :, t]  # [heads, dim]
            k = keys[r, :, : f + j + 1].repeat_interleave(group, 0)
            v = values[r, :, : f + j + 1].repeat_interleave(group, 0)
            weights = torch.softmax((qq[:, None, :] * k).sum(-1) / np.sqrt(q.shape[-1]), -1)
            out.append((weights[..., None] * v).sum(1))
            t += 1
    return torch.stack(out)[None]


# A GPU's rule with blocks of a few queries: every way a call's queries can be cut, on small shapes
TINY_BLOCKS = replace(GPU_CALLS, block_cells=40)


@pytest.mark.parametrize(
    "counts",
    [[1, 1, 1], [4, 1, 0, 3, 3], [2, 0, 1, 5, 1, 2, 1, 3, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2], [40, 3, 1, 2, 30, 2]],
)
@pytest.mark.parametrize("calls", [CPU_CALLS, GPU_CALLS, TINY_BLOCKS], ids=["cpu", "gpu", "gpu-blocks"])
@pytest.mark.parametrize("fresh", [False, True])
def test_ragged_attention_equals_each_rows_own_causal_attention(counts, calls, fresh):
    """calls: a CPU's calls (adjacent slots only), a GPU's (slots joined across the rows between them, masks made
    at each call), and a GPU's with its queries in blocks; fresh: every other row has nothing before its feed (a
    prompt's first pass: alone in its call, SDPA's own causal mask)."""
    torch.manual_seed(0)
    rows, group = len(counts), 2
    filled = np.array([0 if fresh and r % 2 == 0 else (3 * r) % 7 + 1 for r in range(rows)])
    stop = int((filled + np.array(counts)).max())
    keys, values = torch.randn(rows, 2, stop, 3), torch.randn(rows, 2, stop, 3)
    layout = RaggedPass(filled, np.array(counts), torch.device("cpu"), calls=calls)
    q = torch.randn(1, 4, layout.tokens, 3)
    got = ragged_attention(q, keys, values, layout, None)
    assert got.shape == (1, layout.tokens, 4, 3)
    assert torch.allclose(got, reference_attention(q, keys, values, filled, counts, group), atol=1e-5)
    single, _ = layout.masks(group)
    masks = [layout.run_mask(run, group, None, torch.float32, False) for run in layout.runs]
    for mask in ([single] if single is not None else []) + masks:  # no query row may attend to nothing
        assert mask is None or (mask == 0).any(-1).all()
    computed, needed = layout.cells
    assert computed >= needed == sum(n * f + n * (n + 1) // 2 for f, n in zip(filled, counts))


def test_on_a_cpu_a_prompt_and_a_short_draft_beside_it_are_two_calls_and_similar_drafts_one():
    # Slots 0-1: a 200-token prompt (nothing stored) beside a 3-token draft: padding the draft to the prompt's width
    # costs far more than a call. Slots 3-5: drafts of 2, 3 and 2 tokens at similar lengths: one call.
    filled, counts = np.array([0, 180, 40, 50, 52, 49]), np.array([200, 3, 1, 2, 3, 2])
    layout = RaggedPass(filled, counts, torch.device("cpu"))
    assert [(r.first, r.end, r.fresh) for r in layout.runs] == [(0, 1, True), (1, 2, False), (3, 6, False)]
    single, runs = layout.masks(2)
    assert runs[0] is None and runs[1].dtype == torch.float32  # the fresh prompt: no mask built at all
    computed, needed = layout.cells
    assert computed - needed < 300  # the only padding: the drafts' few cells and the single call's columns


@pytest.mark.parametrize("queries", [1, 3])
def test_grouped_query_attention_equals_attention_over_repeated_keys(queries):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, queries, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    mask = torch.rand(2, 1, queries, 5) > 0.3
    mask[..., 0] = True
    out, _ = grouped_query_sdpa(None, q, k, v, mask)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask
    ).transpose(1, 2)
    assert torch.allclose(out, ref, atol=1e-6)


def test_every_way_into_the_attended_span_zeroes_or_writes_what_fresh_memory_held():
    s = slots(1)
    feed(s, [2])
    s.place(3)  # new slots inside the span's columns
    kv = [(torch.ones(1, 2, 5, 3), torch.ones(1, 2, 5, 3))] * 2
    s.write(2, kv, 5)  # wider than the span was: every slot's new columns are zeroed
    s.fork(2, [3], 4)
    feed(s, [1, 3, 1, 1])
    s.release([0])
    s.place(12)  # past the first 8 slots: one reallocation, whose fresh rows are zeroed as they join the span
    feed(s, [1] * s.rows)
    feed(s, [70] + [1] * (s.rows - 1))  # past the first 64 columns: a reallocation, then zeroed as attended
    assert s.rows == 15 and s.filled[0] == 71


def test_each_attention_call_reads_its_own_slots_columns_only_not_the_widest_rows():
    # Two decoding rows (one token each, 3 and 2 tokens before) beside a long prompt (10 tokens, then 4 more): the
    # single call reads columns [0, 4) of slots 0 and 1, the run [0, 14) of slot 2. NaN past those columns would
    # poison any call that read them (a masked key weighs 0, but 0 x NaN is NaN).
    torch.manual_seed(0)
    filled, counts = np.array([3, 2, 10]), np.array([1, 1, 4])
    keys, values = torch.randn(3, 2, 14, 3), torch.randn(3, 2, 14, 3)
    keys[:2, :, 4:], values[:2, :, 4:] = float("nan"), float("nan")
    layout = RaggedPass(filled, counts, torch.device("cpu"))
    q = torch.randn(1, 4, layout.tokens, 3)
    got = ragged_attention(q, keys, values, layout, None)
    assert torch.isfinite(got).all()
    assert torch.allclose(got, reference_attention(q, keys, values, filled, counts, 2), atol=1e-5)
