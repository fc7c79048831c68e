"""A prefix forked into many CPU slots is held once: its whole pages are mapped from one memory file into every
slot (engine/local/shared_pages.py), so memory in use (PSS) grows by one copy, not one a row, while every slot reads
the same values as a copy would give and each row's own columns stay its own."""

import types
import warnings
from pathlib import Path

import pytest
import torch

from offline_sumscore.engine.local import shared_pages
from offline_sumscore.engine.local.kv_slots import KVSlots

# the 1.5B's kv heads and head dim in bfloat16 (256 bytes a column, 16 columns a page), four layers
QWEN_LIKE = types.SimpleNamespace(
    num_hidden_layers=4, num_key_value_heads=2, num_attention_heads=12, head_dim=128, hidden_size=1536
)
PREFIX = 3000  # tokens: 2,992 of them on whole pages (187 pages a region), 8 on the row's own last part-page
COPY_MIB = 4 * 2 * 2 * PREFIX * 128 * 2 / 2**20  # one copy of the prefix: 11.7 MiB


def pss_mib() -> float:
    """Memory in use by this process, each page counted once (however many addresses it is mapped at)."""
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no Pss in /proc/self/smaps_rollup")


def run_pass(s: KVSlots, counts: list[int]) -> torch.Tensor:
    """One pass in which every layer writes the same random keys (values twice them); returns the keys."""
    layout = s.begin(counts)
    new = torch.randn(1, 2, layout.tokens, 128).to(torch.bfloat16)
    for layer in s.layers:
        layer.update(new, new * 2)
    s.commit()
    return new[0]


@pytest.fixture
def lead():
    """A CPU slot set (zero pages) whose slot 0 holds a computed prefix of PREFIX tokens."""
    s = KVSlots(QWEN_LIKE, dtype=torch.bfloat16, device="cpu", row_limit=16)
    assert s.zero_filled
    s.place(1)
    keys = run_pass(s, [PREFIX])
    yield s, keys
    s.free()


def test_a_forked_prefix_is_held_once_and_every_slot_reads_it(lead):
    s, keys = lead
    before = pss_mib()
    slots = s.place(10)
    s.fork(0, slots, PREFIX)
    grown = pss_mib() - before
    assert grown < 0.5 * COPY_MIB, f"{grown:.1f} MiB for 10 rows; a copy is {COPY_MIB:.1f}"  # copies: 117 MiB
    assert s.prefixes.columns(s.key_buffers) == {slot: 2992 for slot in [0, *slots]}
    for slot in slots:
        for layer in (0, 3):
            assert torch.equal(s.key_buffers[layer][slot, :, :PREFIX], keys[:, :PREFIX])
            assert torch.equal(s.value_buffers[layer][slot, :, :PREFIX], keys[:, :PREFIX] * 2)
    assert s.filled == [PREFIX] * 11


def test_each_row_writes_its_own_columns_after_the_shared_prefix_and_no_other_rows(lead):
    s, keys = lead
    slots = s.place(4)
    s.fork(0, slots, PREFIX - 100)  # the lead goes on past the forked part: those columns stay its own
    own = run_pass(s, [1, 2, 1, 1, 1])
    assert torch.equal(s.key_buffers[2][0, :, :PREFIX], keys)  # the lead's prefix and the rest after it
    assert torch.equal(s.key_buffers[2][0, :, PREFIX], own[:, 0])
    for i, slot in enumerate(slots):
        column = s.filled[slot] - 1
        assert torch.equal(s.key_buffers[2][slot, :, : PREFIX - 100], keys[:, : PREFIX - 100])
        assert torch.equal(s.key_buffers[2][slot, :, column], own[:, 2 + i])
        assert s.key_buffers[2][slot, :, PREFIX - 100 + 3 :].abs().sum() == 0


def test_a_released_slot_gets_zero_pages_back_and_the_rest_keep_the_prefix_after_the_lead_leaves(lead):
    s, keys = lead
    slots = s.place(3)
    s.fork(0, slots, PREFIX)
    s.release([0, slots[0]])  # the lead first: the others still hold the copy
    assert s.key_buffers[1][slots[0], :, :2992].abs().sum() == 0
    assert torch.equal(s.key_buffers[1][slots[1], :, :PREFIX], keys)
    again = s.place(1)[0]  # a new row in a released slot: its own pages, written from a stored prefix
    s.write(again, s.row_views(slots[1]), 100)
    s.key_buffers[0][again, :, :50] = 7  # as a pass over its columns would
    assert torch.equal(s.key_buffers[0][slots[2], :, :PREFIX], keys)
    s.release([again, *slots[1:]])
    assert s.prefixes.held == {}


def test_a_set_that_grows_maps_the_prefix_again_rather_than_copying_it(lead):
    s, keys = lead
    slots = s.place(6)
    s.fork(0, slots, PREFIX)
    before = pss_mib()
    reallocations = s.reallocations
    run_pass(s, [200] + [1] * 6)  # past the columns held: every buffer is replaced
    assert s.reallocations > reallocations
    assert pss_mib() - before < 0.5 * 6 * COPY_MIB  # copies would add 6 x 11.7 MiB (the old buffers are gone)
    for slot in slots:
        assert torch.equal(s.value_buffers[3][slot, :, :PREFIX], keys * 2)
    assert set(s.prefixes.columns(s.key_buffers)) == {0, *slots}


def test_a_pass_that_would_write_into_a_shared_prefix_is_refused(lead):
    s, _ = lead
    slot = s.place(1)[0]
    s.fork(0, [slot], PREFIX)
    s.give_back([(slot, 100)])  # as if its last hundred tokens were a draft not taken: it would write over them
    with pytest.raises(RuntimeError, match="shared prefix"):
        s.begin([0, 1])


def test_a_mapping_refused_is_said_once_and_the_rows_get_copies(lead, monkeypatch):
    s, keys = lead

    def refuse(*args):
        raise OSError(12, "mapping a shared KV prefix: Cannot allocate memory")

    monkeypatch.setattr(shared_pages, "_map_at", refuse)
    slots = s.place(2)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        s.fork(0, slots, PREFIX)
        s.fork(0, s.place(1), PREFIX)
    assert len(said) == 1 and "own copy" in str(said[0].message)
    for slot in slots:
        assert torch.equal(s.key_buffers[0][slot, :, :PREFIX], keys)
