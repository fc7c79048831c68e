"""A linear layer's weights held as 4-bit block codes where they are exactly that, for a CPU's small passes.

The embedded judge ships as GGUF Q4_1: each run of 32 weights along a row is a float16 scale, a float16 minimum and
32 codes of 4 bits, and the float32 weights it is converted to are scale x code + minimum to the bit. A pass that
feeds a few dozen tokens or fewer reads every weight once and does little arithmetic with it, so it is bound by how
fast the weights stream: 425 MB of float32 projections, about 20 ms a pass on the 2-core machine at 1 to 8 rows
(research/results/small_rows_gemm.md), and the standard workload's chain of stages is mostly such passes. Held as
codes the same weights take 66 MB, rebuilt in registers just before their multiply-adds (block_codes.cpp): the
projections of a pass of 1 to 8 rows ran 4.9x to 2.1x faster than oneDNN's, 1.2x at 32 and 1.09x at 64, and oneDNN
wins from about 90 rows (research/results/block_codes.md). The weights multiplied are the same to the bit; the sums
run in another order, within float32 rounding of oneDNN's.

find_block_codes recovers the codes from the float32 weight and checks that they rebuild every weight to the bit; a
weight that is not such a code (a brought judge's float32 or bfloat16 weights) is told by its first row and left
alone. cpu_gemm.pack_linears keeps the codes beside oneDNN's packed weight and sends a pass of at most SMALL_ROWS
rows to the kernel. It runs for float32 on a CPU with AVX-512; elsewhere, or with OFFLINE_SUMSCORE_BLOCK_CODES=off
(an A/B switch for the benchmarks), every pass runs on oneDNN.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from offline_sumscore.engine.cpu.native_build import NativeModule

BLOCK = 32  # weights a scale and a minimum cover (GGUF's Q4_1)
LANES = 16  # outputs the kernel computes together, one a vector lane
SMALL_ROWS = 64  # passes of at most this many rows run on the codes; oneDNN is faster from about 90
SOURCE = Path(__file__).with_name("block_codes.cpp")
NATIVE = NativeModule(
    SOURCE,
    "offline_sumscore_block_codes",
    ["block_code_linear"],
    "the block-code linear kernel",
    15,
    "Every pass's linears run on oneDNN instead: slower, the same weights.",
)


@dataclass(frozen=True)
class BlockCodes:
    """One weight [outputs, inputs] as the kernel reads it, 16 outputs a group."""

    codes: torch.Tensor  # uint8 [outputs / 16, inputs / 2, 16]: inputs 2p (low nibble) and 2p + 1 (high) of pair p
    scales: torch.Tensor  # float16 [outputs / 16, inputs / 32, 16]
    mins: torch.Tensor  # float16, the same shape

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.mins))


def kernel():
    """(the kernel's function or None, in words why not)."""
    if os.environ.get("OFFLINE_SUMSCORE_BLOCK_CODES", "on") == "off":
        return None, "off (OFFLINE_SUMSCORE_BLOCK_CODES=off)"
    module, why = NATIVE.build_on_avx512()
    if module is None:
        return None, f"not used ({why})"
    return module.block_code_linear, ""


def find_block_codes(weight: torch.Tensor) -> BlockCodes | None:
    """The weight's 4-bit block codes, or None where some weight is not exactly scale x code + minimum of its block
    of 32 (with the scale and the minimum float16, as GGUF's Q4_1 holds them)."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.shape[0] % LANES or weight.shape[1] % BLOCK:
        return None
    weight = weight.detach()
    if _codes(weight[:1]) is None:  # most weights that are not codes are told by their first row, at no cost
        return None
    found = _codes(weight)
    if found is None:
        return None
    codes, scales, mins = found
    outputs, inputs = weight.shape
    groups = outputs // LANES
    pairs = codes.reshape(groups, LANES, inputs // 2, 2)
    return BlockCodes(
        codes=(pairs[..., 0] | (pairs[..., 1] << 4)).permute(0, 2, 1).contiguous(),
        scales=scales.reshape(groups, LANES, -1).permute(0, 2, 1).contiguous(),
        mins=mins.reshape(groups, LANES, -1).permute(0, 2, 1).contiguous(),
    )


def _codes(weight: torch.Tensor):
    """(codes uint8 [rows, inputs], scales and mins float16 [rows, inputs / 32]) that rebuild weight to the bit, or
    None. Q4_1 takes a block's minimum as its minimum and (maximum - minimum) / 15 as its scale, so the smallest
    weight has code 0 and the largest code 15: both are read back from the rebuilt weights."""
    blocks = weight.reshape(weight.shape[0], -1, BLOCK)
    low = blocks.amin(-1)
    scale = ((blocks.amax(-1) - low) / 15).half()
    if not torch.equal(low.half().float(), low) or not torch.isfinite(scale).all():
        return None
    step = scale.float()[..., None]
    codes = ((blocks - low[..., None]) / step.clamp_min(torch.finfo(torch.float32).tiny)).round_().clamp_(0, 15)
    # scale x code is exact in float32 (11 bits by 4), so this one rounding is the kernel's multiply-add's.
    if not torch.equal(low[..., None] + step * codes, blocks):
        return None
    return codes.to(torch.uint8).reshape(weight.shape), scale, low.half()


def linear(function, x: torch.Tensor, codes: BlockCodes, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., inputs] through the coded weight (and bias) with the kernel function."""
    out = function(x.reshape(-1, x.shape[-1]).contiguous(), codes.codes, codes.scales, codes.mins)
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], out.shape[-1])
