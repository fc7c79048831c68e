"""A CPU's KV buffers on zero pages (kv_slots.zero_pages): they read 0 where nothing was written, and only what the
rows write becomes resident, however wide the attended span."""

import types
from pathlib import Path

import torch

from offline_sumscore.engine.local.kv_slots import KVSlots, zero_pages

WIDE = types.SimpleNamespace(
    num_hidden_layers=1, num_key_value_heads=2, num_attention_heads=4, head_dim=64, hidden_size=256
)


def resident_mib() -> float:
    """This process's resident memory (VmRSS). A page mapped to the kernel's zero page by a read is not counted."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_zero_pages_read_zero_are_written_in_place_and_become_resident_only_where_written():
    before = resident_mib()
    t = zero_pages((64, 2, 4096, 64), torch.float32)  # 128 MiB mapped
    assert t.shape == (64, 2, 4096, 64) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.abs().sum() == 0  # every byte read: the zero page
    assert resident_mib() - before < 16
    t[:, :, :1000] = 3.0  # 31.25 MiB written
    assert t[5, 1, 999, 63] == 3.0 and t[5, 1, 1000, 0] == 0
    assert 28 < resident_mib() - before < 48


def test_a_long_row_beside_short_ones_keeps_its_own_tokens_resident_not_every_slot_at_its_width():
    # The case behind zero pages: one long source's row among short rows. The buffers span 64 slots x 4,096+
    # columns (256 MiB, keys and values, in float32); zeroed as before, every slot of the span was resident at that
    # width. Written here: 4,000 + 63 x 3 tokens, 4.1 MiB.
    before = resident_mib()
    s = KVSlots(WIDE, dtype=torch.float32, device="cpu", row_limit=64)
    assert s.zero_filled
    assert s.place(64) == list(range(64))
    layout = s.begin([4000] + [3] * 63)
    new = torch.randn(1, 2, layout.tokens, 64)
    s.layers[0].update(new, new)
    s.commit()
    grown = resident_mib() - before
    span_mib = 2 * 64 * 2 * s.capacity[1] * 64 * 4 / 2**20
    assert span_mib > 250 and grown < 40, (grown, span_mib)
    keys = s.layers[0].keys
    assert keys.shape[:3] == (64, 2, 4000) and torch.isfinite(keys).all() and s.filled[:2] == [4000, 3]


def test_a_grown_set_on_zero_pages_keeps_each_live_rows_tokens_and_reads_zero_elsewhere():
    s = KVSlots(WIDE, dtype=torch.float32, device="cpu", row_limit=8)
    s.place(3)
    layout = s.begin([60, 5, 7])
    first = torch.randn(1, 2, layout.tokens, 64)
    s.layers[0].update(first, first)
    s.commit()
    s.release([1])  # a finished row: its tokens need not follow the buffers
    before = [s.key_buffers[0][slot, :, : s.filled[slot]].clone() for slot in (0, 2)]
    layout = s.begin([10, 0, 1])  # past the first 64 columns: the buffers are replaced
    more = torch.randn(1, 2, layout.tokens, 64)
    s.layers[0].update(more, more)
    s.commit()
    assert s.reallocations == 2
    assert torch.equal(s.key_buffers[0][0, :, :60], before[0]) and torch.equal(s.key_buffers[0][2, :, :7], before[1])
    assert s.key_buffers[0][1].abs().sum() == 0 and s.key_buffers[0][0, :, 70:].abs().sum() == 0
