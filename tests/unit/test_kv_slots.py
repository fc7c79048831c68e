"""KVSlots on a small made-up geometry, against the plain concatenation it replaces (no model)."""

import types

import numpy as np
import pytest
import torch

from offline_sumscore.engine.kv_slots import KVSlots, grouped_query_sdpa

CONFIG = types.SimpleNamespace(
    num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=4, head_dim=3, hidden_size=12
)


@pytest.fixture(autouse=True)
def garbage_in_fresh_buffers(monkeypatch):
    """Fresh buffers are uninitialised memory; here they are NaN, so any region that enters the window without
    being zeroed or written shows up as a NaN (every test below runs so, and write() checks the whole window)."""
    monkeypatch.setattr(
        KVSlots, "_uninitialised", lambda self, shape: torch.full(shape, float("nan"), dtype=self.dtype)
    )


def finite_window(s):
    return all(torch.isfinite(b[: s.rows, :, s.start : s.end]).all() for b in s.key_buffers + s.value_buffers)


def slots(rows=0):
    s = KVSlots(CONFIG, dtype=torch.float32, device="cpu")
    s.add_rows(rows)
    return s


def write(s, mask):
    """One pass: every layer writes keys = values = a running number per (row, column)."""
    mask = np.array(mask, dtype=np.int64)
    full = s.begin(mask)
    rows, w = mask.shape
    new = torch.arange(rows * w, dtype=torch.float32).view(rows, 1, w, 1).expand(rows, 2, w, 3) + 100 * s.end
    for layer in range(2):
        keys, values = s.update(new, new, layer)
    s.commit()
    assert finite_window(s)
    return full, keys


def test_a_pass_writes_by_index_and_returns_the_window_without_moving_the_buffers():
    s = slots(2)
    write(s, [[1, 1, 1], [1, 1, 0]])
    buffer = s.key_buffers[0].data_ptr()
    for _ in range(5):  # one-token steps within capacity: no reallocation, no copy of the cache
        full, keys = write(s, [[1], [1]])
    assert s.key_buffers[0].data_ptr() == buffer and s.width == 8
    assert keys.shape == (2, 2, 8, 3) and full.tolist()[1] == [1, 1, 0, 1, 1, 1, 1, 1]


def test_a_pass_that_raises_halfway_leaves_the_window_and_mask_as_they_were():
    s = slots(2)
    write(s, [[1, 1], [1, 1]])
    before = (s.width, s.mask.clone())
    s.begin(np.ones((2, 3), dtype=np.int64))
    s.update(torch.ones(2, 2, 3, 3), torch.ones(2, 2, 3, 3), 0)  # layer 0 wrote, layer 1 never did
    s.abort()
    assert s.width == before[0] and torch.equal(s.mask, before[1])
    full, _ = write(s, [[1], [1]])  # the next pass overwrites the forgotten columns
    assert full.shape == (2, 3)


def test_join_left_pads_the_narrower_side_and_trim_drops_columns_no_row_attends():
    a, b = slots(1), slots(2)
    write(a, [[1, 1]])
    write(b, [[1, 1, 1, 1], [0, 1, 1, 1]])
    a.join(b)
    assert a.rows == 3 and a.width == 4
    assert a.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]]
    assert a.first == [2, 0, 1]
    a.select([0, 2])  # row 1 left
    a.trim()
    assert a.mask.tolist() == [[0, 1, 1], [1, 1, 1]] and a.first == [1, 0]
    assert torch.equal(a.layers[0].keys[1, 0, :, 0], torch.tensor([1.0, 2.0, 3.0]) + 4)  # b's row 1, columns 1..3


def test_the_cache_grows_when_full_and_keeps_every_row():
    s = slots(1)
    write(s, [[1] * 60])
    reference = s.layers[1].keys.clone()
    write(s, [[1] * 10])  # past the first 64 columns: one reallocation
    assert s.reallocations == 2 and torch.equal(s.layers[1].keys[:, :, :60], reference)
    s.select([0] * 20)  # past the first 8 rows
    assert s.rows == 20 and torch.equal(s.layers[1].keys[19, :, :60], reference[0])


@pytest.mark.parametrize("index", [[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 2, 2, 2], [0, 0, 1, 2, 2]])
def test_a_fork_in_place_equals_a_gather_of_the_rows(index):
    sources = max(index) + 1
    forked, gathered = slots(sources), slots(sources)
    for s in (forked, gathered):
        write(s, [[1, 1, 1], [0, 1, 1], [1, 1, 0]][:sources])
    forked.reserve(len(index))  # room already there: the fork runs in place, row runs from the last one back
    buffer = forked.key_buffers[0].data_ptr()
    forked.select(index)
    at = torch.tensor(index)
    expected = [k[:, :, gathered.start : gathered.end].index_select(0, at) for k in gathered.key_buffers]
    assert forked.key_buffers[0].data_ptr() == buffer
    assert all(
        torch.equal(k[: len(index), :, forked.start : forked.end], e) for k, e in zip(forked.key_buffers, expected)
    )
    assert torch.equal(forked.mask, gathered.mask.index_select(0, at)) and forked.first == [
        gathered.first[i] for i in index
    ]


@pytest.mark.parametrize("keep", [[1, 2, 3, 4, 5, 6], [0, 2, 5, 6], [3, 4, 6], [0, 1, 2]])
def test_a_compaction_in_place_equals_a_gather_of_the_kept_rows(keep):
    moved, gathered = slots(7), slots(7)
    mask = [[1] * 6, [0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [1] * 6, [0, 0, 0, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]]
    for s in (moved, gathered):
        write(s, mask)
    at = torch.tensor(keep)
    expected = [k[:, :, gathered.start : gathered.end].index_select(0, at) for k in gathered.key_buffers]
    buffer = moved.key_buffers[0].data_ptr()
    moved.select(keep)
    cut = min(moved.first)
    assert moved.key_buffers[0].data_ptr() == buffer
    assert torch.equal(moved.mask, gathered.mask.index_select(0, at))
    # every column a kept row can attend holds its keys (the ones before `cut` are masked for all, and trimmed)
    for k, e in zip(moved.key_buffers, expected):
        assert torch.equal(k[: len(keep), :, moved.start + cut : moved.end], e[:, :, cut:])
    moved.trim()
    assert moved.width == 6 - cut and finite_window(moved)


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


def test_every_way_into_the_window_zeroes_or_writes_what_fresh_memory_held():
    a, b = slots(1), slots(2)
    write(a, [[1, 1]])
    write(b, [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    a.join(b)  # a's row gains three columns on the left; b's rows land right-aligned
    a.add_rows(2)  # rows with nothing attended yet
    a.open_columns(3)  # stored prefixes are written into some rows only
    a.write_row(3, [(torch.ones(1, 2, 3, 3), torch.ones(1, 2, 3, 3))] * 2, 3)
    assert finite_window(a)
    a.select([0, 1, 1, 2, 3, 4])  # a fork
    a.select([1, 3, 5])  # a compaction
    a.trim()
    c = slots(1)
    write(c, [[1] * 20])
    a.join(c)  # wider than a: a's rows gain columns on the left, in the slack a reallocation left there
    d = slots(1)
    write(d, [[1, 1]])
    a.join(d)  # narrower than a: its row is masked, and zeroed, left of its two columns
    write(a, [[1], [1], [1], [1], [1]])
    assert a.rows == 5 and finite_window(a)
