"""The passes' attention kernel (engine/cpu/attention_kernel.cpp) against each token's own attention computed
plainly, and where it runs. Built at first use (about 35 s once; torch caches the build)."""

import warnings

import numpy as np
import pytest
import torch

from offline_sumscore.engine.cpu import attention_kernel as dk
from offline_sumscore.engine.local.attention import RaggedPass, ragged_attention

AVX512 = "AVX512" in torch.backends.cpu.get_cpu_capability()
needs_avx512 = pytest.mark.skipif(not AVX512, reason="the kernel needs a CPU with AVX-512; this one has none")


def reference(q, keys, values, filled, counts, group, window=None, scale=None):
    """Each token alone: its query heads over its own row's columns up to its own (the last `window` of them)."""
    out, t = [], 0
    dim = q.shape[-1]
    for r, (f, n) in enumerate(zip(filled, counts)):
        for j in range(n):
            stop = f + j + 1
            start = max(stop - window, 0) if window else 0
            k = keys[r, :, start:stop].repeat_interleave(group, 0).double()
            v = values[r, :, start:stop].repeat_interleave(group, 0).double()
            scores = (q[0, :, t].double()[:, None, :] * k).sum(-1) * (scale or dim**-0.5)
            out.append((torch.softmax(scores, -1)[..., None] * v).sum(1))
            t += 1
    return torch.stack(out)[None].float()


@needs_avx512
@pytest.mark.parametrize(
    "dim,kv_heads,group", [(64, 3, 3), (128, 2, 4), (32, 1, 7), (96, 4, 1), (256, 1, 2), (16, 1, 8)]
)
@pytest.mark.parametrize("counts", [[1, 1, 1, 1], [1, 0, 5, 1, 1, 3, 0, 1], [20, 1, 1], [0, 1, 1, 40], [2, 17, 33]])
@pytest.mark.parametrize("window", [None, 7])
def test_every_token_of_a_pass_equals_its_own_attention(dim, kv_heads, group, counts, window):
    torch.manual_seed(0)
    kernel, how = dk.attention_kernel(torch.device("cpu"), torch.float32, dim)
    assert kernel is not None, how
    counts = np.array(counts)
    filled = np.array([(37 * r) % 61 + (0 if n > 1 and r % 2 else 1) for r, n in enumerate(counts)])  # 1 to 61
    stop = int((filled + counts).max())
    keys, values = torch.randn(len(counts), kv_heads, stop + 9, dim), torch.randn(len(counts), kv_heads, stop + 9, dim)
    keys[:, :, stop:] = values[:, :, stop:] = float("nan")  # past every row's columns: never read
    layout = RaggedPass(filled, counts, torch.device("cpu"))
    layout.kernel = kernel
    q = torch.randn(1, kv_heads * group, layout.tokens, dim)
    got = ragged_attention(q, keys, values, layout, 0.3, window=window)
    want = reference(q, keys, values, filled, counts, group, window, scale=0.3)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    assert layout.cells[0] == layout.cells[1] == int((counts * filled + counts * (counts + 1) // 2).sum())


@needs_avx512
def test_the_kernel_refuses_what_it_cannot_read():
    kernel, _ = dk.attention_kernel(torch.device("cpu"), torch.float32, 64)
    q, kv = torch.randn(3, 1, 2, 64), torch.randn(2, 1, 8, 64)
    rows = torch.tensor([[0, 0, 1, 3], [1, 1, 2, 5]])  # slot, first token, tokens, columns before them
    assert kernel(q, kv, kv, rows, 0, 0.1).shape == q.shape
    with pytest.raises(RuntimeError, match="float32"):
        kernel(q.double(), kv.double(), kv.double(), rows, 0, 0.1)
    with pytest.raises(RuntimeError, match="head dimension"):
        kernel(q[..., :40].contiguous(), kv[..., :40].contiguous(), kv[..., :40].contiguous(), rows, 0, 0.1)
    with pytest.raises(RuntimeError, match="kv heads"):
        kernel(q, torch.randn(2, 2, 8, 64), torch.randn(2, 2, 8, 64), rows, 0, 0.1)
    for outside in ([[2, 0, 1, 3]], [[0, 0, 1, 8]], [[0, 2, 2, 0]], [[0, 0, 0, 3]]):  # a slot, columns, tokens, none
        with pytest.raises(RuntimeError, match="row 0 lies outside"):
            kernel(q, kv, kv, torch.tensor(outside), 0, 0.1)


def test_where_the_kernel_does_not_apply_the_reason_is_named():
    assert (
        dk.attention_kernel(torch.device("cpu"), torch.float32, 64, wanted=False)[1] == "sdpa (the kernel switched off)"
    )
    assert "on cuda" in dk.attention_kernel(torch.device("cuda"), torch.float32, 64)[1]
    assert "float32 only" in dk.attention_kernel(torch.device("cpu"), torch.bfloat16, 64)[1]
    assert "head dimension 72" in dk.attention_kernel(torch.device("cpu"), torch.float32, 72)[1]
    assert "softcaps its scores" in dk.attention_kernel(torch.device("cpu"), torch.float32, 64, softcap=50.0)[1]


@needs_avx512
def test_a_kernel_that_fails_to_build_is_reported_loudly_and_sdpa_runs(missing_compiler, capsys):
    missing_compiler(dk.NATIVE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel, how = dk.attention_kernel(torch.device("cpu"), torch.float32, 64)
    assert kernel is None and how.startswith("sdpa (the kernel failed to build") and "g++: command not found" in how
    assert any("g++: command not found" in str(w.message) for w in caught)
    assert "building the attention kernel" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="could not be built"):  # remembered: no second build in the same process
        dk.NATIVE.build()
