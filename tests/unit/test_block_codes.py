"""block_codes.py: weights that are exactly 4-bit block codes (GGUF's Q4_1) found and multiplied as codes; anything
else left to oneDNN. The numbers are torch's linear of the same float32 weights, within float32 rounding."""

import pytest
import torch

from offline_sumscore.engine.cpu import block_codes, cpu_gemm

AVX512 = "AVX512" in torch.backends.cpu.get_cpu_capability()
needs_avx512 = pytest.mark.skipif(not AVX512, reason="the kernel needs a CPU with AVX-512; this one has none")
needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"),
    reason="this torch build has no oneDNN",
)
original = block_codes.linear


def q4_1_weight(outputs: int, inputs: int, seed: int = 0) -> torch.Tensor:
    """A float32 weight as GGUF's Q4_1 dequantizes it: per run of 32 along a row, float16 scale x code + minimum."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.randn(outputs, inputs // 32, 32, generator=g) * 0.05
    low = dense.amin(-1).half().float()
    scale = ((dense.amax(-1) - dense.amin(-1)) / 15).half().float()
    codes = ((dense - low[..., None]) / scale[..., None]).round().clamp(0, 15)
    codes[..., 0], codes[..., 1] = 0, 15  # as Q4_1 codes a block's smallest and largest weights
    return (low[..., None] + scale[..., None] * codes).reshape(outputs, inputs)


def test_a_q4_1_weight_is_found_and_rebuilt_to_the_bit():
    weight = q4_1_weight(48, 96)
    found = block_codes.find_block_codes(weight)
    assert found is not None and found.codes.shape == (3, 48, 16) and found.scales.dtype == torch.float16
    # Rebuilt from the kernel's layout: output 16g + i, inputs 2p and 2p + 1 in byte i of pair p.
    low, high = (found.codes & 15).float(), (found.codes >> 4).float()
    codes = torch.stack([low, high], 2).reshape(3, 96, 16)  # [groups, inputs, lanes]
    scales = found.scales.float().repeat_interleave(32, 1)
    mins = found.mins.float().repeat_interleave(32, 1)
    rebuilt = (mins + scales * codes).permute(0, 2, 1).reshape(48, 96)
    assert torch.equal(rebuilt, weight)


@pytest.mark.parametrize(
    "weight",
    [
        torch.randn(32, 64),  # float32 weights of a brought judge: not codes
        q4_1_weight(20, 64),  # outputs not a multiple of 16
        q4_1_weight(32, 64)[:, :48].contiguous(),  # inputs not a multiple of 32
        q4_1_weight(32, 64).double(),
    ],
    ids=["dense", "ragged-outputs", "ragged-inputs", "float64"],
)
def test_a_weight_that_is_not_block_codes_is_left_alone(weight):
    assert block_codes.find_block_codes(weight) is None


def test_one_weight_off_by_a_rounding_step_anywhere_is_not_codes():
    weight = q4_1_weight(64, 64)
    weight[40, 17] = torch.nextafter(weight[40, 17], torch.tensor(1.0))  # past the first row, which is checked first
    assert block_codes.find_block_codes(weight) is None


@needs_avx512
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17, 64])
def test_the_kernel_gives_torchs_linear_of_the_same_weights(rows):
    kernel, _ = block_codes.kernel()
    weight, bias = q4_1_weight(192, 576, seed=rows), torch.randn(192)
    x = torch.randn(1, rows, 576)
    got = block_codes.linear(kernel, x, block_codes.find_block_codes(weight), bias)
    assert got.shape == (1, rows, 192)
    torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


@needs_avx512
@needs_onednn
def test_packed_linears_send_small_passes_to_the_codes_and_large_ones_to_onednn(monkeypatch):
    monkeypatch.delenv("OFFLINE_SUMSCORE_CPU_GEMM", raising=False)
    monkeypatch.delenv("OFFLINE_SUMSCORE_BLOCK_CODES", raising=False)
    model = torch.nn.Sequential(torch.nn.Linear(576, 192, bias=False), torch.nn.Linear(192, 64))
    with torch.no_grad():
        model[0].weight.copy_(q4_1_weight(192, 576))  # the second stays dense: oneDNN alone
        weight = model[0].weight.clone()
        said = cpu_gemm.pack_linears(model)
        calls = []
        monkeypatch.setattr(block_codes, "linear", lambda *a: calls.append(a[1].shape) or original(*a))
        for rows in (block_codes.SMALL_ROWS, block_codes.SMALL_ROWS + 1):
            x = torch.randn(rows, 576)
            torch.testing.assert_close(model[0](x), x @ weight.T, atol=1e-4, rtol=1e-5)
    assert "4-bit block codes for 1 of them" in said, said
    assert calls == [(block_codes.SMALL_ROWS, 576)]  # the larger pass ran on oneDNN


def test_switched_off_no_codes_are_kept(monkeypatch):
    monkeypatch.setenv("OFFLINE_SUMSCORE_BLOCK_CODES", "off")
    assert block_codes.kernel() == (None, "off (OFFLINE_SUMSCORE_BLOCK_CODES=off)")


@needs_avx512
def test_a_build_that_fails_is_said_loudly_and_onednn_runs(missing_compiler, capsys, monkeypatch):
    monkeypatch.delenv("OFFLINE_SUMSCORE_BLOCK_CODES", raising=False)
    missing_compiler(block_codes.NATIVE)
    with pytest.warns(UserWarning, match="g\\+\\+: command not found.*run on oneDNN instead"):
        kernel, why = block_codes.kernel()
    assert kernel is None and why.startswith("not used (the kernel failed to build: the block-code linear kernel")
    assert "building the block-code linear kernel" in capsys.readouterr().err
