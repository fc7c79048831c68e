"""A GGUF judge's weights kept as the file's block codes (engine/cpu/gguf_codes.py): every type the kernel rebuilds
gives gguf's reference dequantization to the bit, the coded linear and embedding compute what their rebuilt weights
compute, and a judge loaded from a prepared GGUF holds codes, not a float copy of its weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, dequantize

from offline_sumscore.engine.cpu import gguf_codes

# where each type's float16 scales lie in its block (bytes), as ggml's block structs lay them out
HALF_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


@pytest.fixture(scope="module")
def kernel():
    module, why = gguf_codes.kernel()
    assert module is not None, why  # a machine that cannot build it says so here, not by skipping
    return module


def random_codes(type_id: int, rows: int, columns: int, seed: int = 0) -> np.ndarray:
    """uint8 [rows, bytes a row]: random codes and sub-scales, with finite float16 scales of a weight's size."""
    name, weights, nbytes = gguf_codes.CODED_TYPES[type_id]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, columns // weights, nbytes), dtype=np.uint8)
    for at in HALF_FIELDS[name]:
        scales = rng.uniform(-0.02, 0.02, size=blocks.shape[:2]).astype(np.float16)
        blocks[..., at : at + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("type_id", sorted(gguf_codes.CODED_TYPES))
def test_every_type_is_rebuilt_as_the_reference_rebuilds_it_to_the_bit(kernel, type_id):
    codes = random_codes(type_id, 48, 512, seed=type_id)
    reference = torch.from_numpy(np.ascontiguousarray(dequantize(codes, GGMLQuantizationType(type_id))))
    ours = gguf_codes.dequantize(kernel, torch.from_numpy(codes), type_id, 512)
    assert torch.equal(ours.view(torch.int32), reference.float().view(torch.int32))
    rounded = gguf_codes.dequantize(kernel, torch.from_numpy(codes), type_id, 512, dtype=torch.bfloat16)
    assert torch.equal(rounded, reference.float().to(torch.bfloat16))  # one rounding, torch's


def test_a_row_of_the_wrong_length_is_refused_by_the_kernel(kernel):
    codes = torch.from_numpy(random_codes(12, 4, 512))
    with pytest.raises(RuntimeError, match="takes 288 bytes, not 144"):
        gguf_codes.dequantize(kernel, codes[:, :144].contiguous(), 12, 512)


def assert_within_float32_sums(got, expected, x, weight):
    """Equal but for the order of float32 sums: each output within 1e-6 of the sum of its terms' magnitudes (512
    terms at float32's 6e-8 each bound it by 3e-5; sums in another order stay far inside that)."""
    bound = 1e-6 * (x.abs() @ weight.abs().T) + 1e-6
    assert ((got - expected).abs() <= bound).all()


def _coded_linear(kernel, type_id, rows, columns, scratch_elements=gguf_codes.SCRATCH_ELEMENTS, bias=True):
    codes = torch.from_numpy(random_codes(type_id, rows, columns, seed=rows))
    entry = gguf_codes.CodedTensor("layer.weight", type_id, rows, columns, 0)
    weight = gguf_codes.dequantize(kernel, codes, type_id, columns)
    b = torch.randn(rows) if bias else None
    layer = gguf_codes.CodedLinear(kernel, entry, codes, b, gguf_codes.Scratch(scratch_elements), torch.float32)
    return layer, weight, b


@pytest.mark.parametrize(
    "rows_in", [1, 5, 7, gguf_codes.SMALL_ROWS[torch.float32], gguf_codes.SMALL_ROWS[torch.float32] + 1]
)
def test_a_coded_linear_computes_what_its_rebuilt_weight_computes(kernel, rows_in):
    layer, weight, bias = _coded_linear(kernel, 14, 96, 512)
    x = torch.randn(rows_in, 512)
    expected = torch.nn.functional.linear(x, weight, bias)
    assert_within_float32_sums(layer(x), expected, x, weight)
    x16 = x.to(torch.bfloat16)  # a bfloat16 judge's activations: computed in float32, returned in bfloat16
    assert layer(x16).dtype == torch.bfloat16


def test_a_bfloat16_layer_multiplies_bfloat16_codes_up_to_its_limit_and_then_a_rebuilt_weight(kernel):
    """A bfloat16 layer's passes of up to its small_rows rows multiply each output's weights rounded to bfloat16 (the
    bfloat16 row kernel, where AVX512_BF16 is; else the float32 row kernel up to SMALL_ROWS[bfloat16]); past them it
    computes exactly what torch's bfloat16 linear computes on the rebuilt weight (its larger pass)."""
    codes = torch.from_numpy(random_codes(12, 64, 512, seed=3))
    entry = gguf_codes.CodedTensor("layer.weight", 12, 64, 512, 0)
    scratch = gguf_codes.Scratch(gguf_codes.SCRATCH_ELEMENTS)
    bf16 = gguf_codes.CodedLinear(kernel, entry, codes, None, scratch, torch.bfloat16)
    f32 = gguf_codes.CodedLinear(kernel, entry, codes, None, scratch, torch.float32)
    weight = gguf_codes.dequantize(kernel, codes, 12, 512, dtype=torch.bfloat16)
    native = bool(kernel.gguf_bf16_dots())
    assert bf16.small_rows == (gguf_codes.BF16_ROWS if native else gguf_codes.SMALL_ROWS[torch.bfloat16])
    multiplied = weight.float() if native else gguf_codes.dequantize(kernel, codes, 12, 512)  # exact in float32
    for rows in (1, 5, bf16.small_rows):
        x = torch.randn(rows, 512).bfloat16()
        if native:
            got = kernel.gguf_codes_linear_bf16(x, codes, 12)
        else:
            got = kernel.gguf_codes_linear(x.float(), codes, 12)
        assert torch.equal(bf16(x), got.bfloat16())
        assert_within_float32_sums(got, x.double() @ multiplied.double().T, x.float(), multiplied)
    x = torch.randn(bf16.small_rows + 1, 512)
    assert torch.equal(bf16(x.bfloat16()), torch.nn.functional.linear(x.bfloat16(), weight))
    x = torch.randn(gguf_codes.SMALL_ROWS[torch.float32], 512)
    assert torch.equal(f32(x), kernel.gguf_codes_linear(x, codes, 12))  # float32 keeps the exact weights


@pytest.mark.parametrize("type_id", sorted(gguf_codes.CODED_TYPES))
def test_the_bfloat16_row_kernel_multiplies_each_type_and_outputs_past_its_groups_of_four(kernel, type_id):
    if not kernel.gguf_bf16_dots():
        pytest.skip("this CPU's build has no AVX512_BF16: the bfloat16 row kernel is not built")
    codes = torch.from_numpy(random_codes(type_id, 66, 512, seed=type_id))  # 16 groups of 4 outputs, then 2
    weight = gguf_codes.dequantize(kernel, codes, type_id, 512, dtype=torch.bfloat16).float()
    x = torch.randn(7, 512).bfloat16()  # a tile of 4 input rows, then 3 alone
    got = kernel.gguf_codes_linear_bf16(x, codes, type_id)
    assert got.shape == (7, 66) and got.dtype == torch.float32
    assert_within_float32_sums(got, x.double() @ weight.double().T, x.float(), weight)


def test_a_large_pass_through_a_weight_larger_than_the_scratch_runs_in_slices(kernel):
    whole, weight, _ = _coded_linear(kernel, 12, 160, 512, bias=False)
    sliced, _, _ = _coded_linear(kernel, 12, 160, 512, scratch_elements=512 * 48, bias=False)  # 4 slices of 48 rows
    x = torch.randn(40, 512)
    assert torch.equal(sliced(x), whole(x))
    assert_within_float32_sums(whole(x), torch.nn.functional.linear(x, weight), x, weight)


def test_a_coded_embedding_returns_the_rebuilt_rows_and_names_a_token_outside_it(kernel):
    codes = torch.from_numpy(random_codes(12, 64, 256))
    entry = gguf_codes.CodedTensor("embed.weight", 12, 64, 256, 0)
    table = gguf_codes.CodedEmbedding(kernel, entry, codes, torch.float32)
    ids = torch.tensor([[3, 63, 3], [0, 5, 9]])
    assert torch.equal(table(ids), gguf_codes.dequantize(kernel, codes, 12, 256)[ids])
    with pytest.raises(IndexError, match="token id 64 is outside the vocabulary of 64"):
        table(torch.tensor([[1, 64]]))
