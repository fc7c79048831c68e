"""The picks' kernel (engine/cpu/pick_kernel.cpp) against torch's masked argmax, and P(yes)'s masked columns against
the mask unpacked. Built at first use (about 30 s once; torch caches the build)."""

import warnings

import pytest
import torch

from offline_sumscore.engine.cpu.pick_kernel import pick_kernel
from offline_sumscore.engine.local.sampling import masked_columns, unpack

AVX512 = "AVX512" in torch.backends.cpu.get_cpu_capability()
needs_avx512 = pytest.mark.skipif(not AVX512, reason="the kernel needs a CPU with AVX-512; this one has none")


def torch_picks(logits, bitmask, rows, vocab):
    """What the sampler computes without the kernel: -1 where the row holds a NaN."""
    allowed = unpack(bitmask.index_select(0, rows), vocab)
    picks = logits.masked_fill(~allowed, float("-inf")).argmax(-1)
    return torch.where(torch.isnan(logits).any(1), torch.full_like(picks, -1), picks)


def random_masks(rows: int, vocab: int, generator) -> torch.Tensor:
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=generator)
    sparse = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=generator)
    bitmask[::2] &= sparse[::2] & torch.roll(sparse, 1, 1)[::2]  # every other row allows about a quarter
    bitmask[1] = 0
    bitmask[1, single(vocab) // 32] = 1 << (single(vocab) % 32)  # one allowed token, inside a word
    return bitmask


def single(vocab: int) -> int:
    return min(7 * 32 + 5, vocab - 1)


@needs_avx512
@pytest.mark.parametrize("vocab", [49152, 49152 - 9, 16 * 3 + 1, 1])
@pytest.mark.parametrize("ties", [False, True])
def test_the_kernel_picks_what_torch_picks(vocab, ties):
    kernel, how = pick_kernel(torch.device("cpu"))
    assert kernel is not None, how
    g = torch.Generator().manual_seed(vocab + ties)
    reads = 23
    logits = torch.randn(reads, vocab + 5, generator=g)[:, :vocab]  # rows with a stride past vocab, as sliced
    if ties:
        logits = (logits * 2).round()  # many equal values: the first allowed one wins, as torch's argmax
    logits[1, single(vocab)] = -50.0
    logits[3, vocab // 2] = float("nan")  # a poisoned row, wherever its NaN lies (allowed or not)
    bitmask = random_masks(reads + 4, vocab, g)
    rows = torch.randint(0, reads + 4, (reads,), generator=g)
    rows[:2] = 1
    got = kernel(logits, bitmask, rows, vocab)
    assert torch.equal(got, torch_picks(logits, bitmask, rows, vocab))
    assert got[3] == -1 and (got[:3] >= 0).all()
    assert got[0] == got[1] == single(vocab)  # the only allowed token, however low its logit


@needs_avx512
def test_a_mask_that_allows_nothing_picks_what_torch_picks():
    kernel, _ = pick_kernel(torch.device("cpu"))
    logits, bitmask = torch.randn(2, 100), torch.zeros(1, 4, dtype=torch.int32)
    rows = torch.zeros(2, dtype=torch.long)
    assert torch.equal(kernel(logits, bitmask, rows, 100), torch_picks(logits, bitmask, rows, 100))


@needs_avx512
def test_the_kernel_refuses_a_mask_row_out_of_range():
    kernel, _ = pick_kernel(torch.device("cpu"))
    with pytest.raises(RuntimeError, match="out of range"):
        kernel(torch.randn(1, 64), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([2]), 64)


def test_switched_off_or_off_the_cpu_the_picks_run_on_torch():
    assert pick_kernel(torch.device("cpu"), wanted=False) == (None, "torch (the kernel switched off)")
    kernel, how = pick_kernel(torch.device("meta"))
    assert kernel is None and "meta" in how


def test_masked_columns_equal_the_unpacked_mask_at_those_columns():
    g = torch.Generator().manual_seed(1)
    vocab = 1000
    logits, bitmask = torch.randn(5, vocab, generator=g), random_masks(5, vocab, g)
    columns = torch.tensor([0, 31, 32, 224 + 5, 999, 500])
    expected = logits.masked_fill(~unpack(bitmask, vocab), float("-inf")).index_select(1, columns)
    assert torch.equal(masked_columns(logits, bitmask, columns), expected)


@needs_avx512
def test_a_build_that_fails_is_said_loudly_and_the_picks_run_on_torch(missing_compiler, capsys):
    from offline_sumscore.engine.cpu import pick_kernel as pk

    missing_compiler(pk.NATIVE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel, how = pick_kernel(torch.device("cpu"))
    assert kernel is None and how.startswith("torch (the kernel failed to build") and "g++: command not found" in how
    assert any("g++: command not found" in str(w.message) and "torch's operators" in str(w.message) for w in caught)
    assert "building the pick kernel" in capsys.readouterr().err
