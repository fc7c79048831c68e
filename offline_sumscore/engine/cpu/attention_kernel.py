"""A ragged pass's attention kernel on a CPU (attention_kernel.cpp): where it runs, its build, and why not elsewhere.

Every token of a pass attends in one call of the kernel: each reads its own slot's columns up to its own, and nothing
else. Through SDPA a pass attends in several calls (the decoding rows in one over a span of slots up to the longest
row, each prompt or draft in one of its own), padded to a grid and masked; the kernel builds no grid and no mask, and
ran one layer's attention 1.07 to 2.3x faster than those calls (research/results/attention_kernel.md).

It is C++ with AVX-512 intrinsics, built with torch.utils.cpp_extension by `sumscore setup` (else at first use; g++
and ninja) and cached by torch (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions) for later runs. It runs where
it can:
float32 on a CPU with AVX-512, a head dimension of 16 to 96, 128 or 256, no softcap. Elsewhere (a GPU, bfloat16, a
CPU without AVX-512, Gemma-2's softcapped scores) a pass attends through SDPA, and the engine's description says
which and why (`judge.engine.attention_kernel`). Where it should run and its build fails, the engine says so loudly
(a warning with the compiler's message) and runs on SDPA.
"""

from __future__ import annotations

from pathlib import Path

import torch

from offline_sumscore.engine.cpu.native_build import NativeModule, without_avx512

SOURCE = Path(__file__).with_name("attention_kernel.cpp")
HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128, 256)
# the module's name in torch's extension cache: offline_sumscore_pass_attention
NATIVE = NativeModule(
    SOURCE,
    "offline_sumscore_pass_attention",
    ["pass_attention"],
    "the attention kernel",
    15,
    "Passes attend through SDPA instead: slower, the same verdicts.",
)


def why_not(device: torch.device, dtype: torch.dtype, head_dim: int, softcap: float | None = None) -> str | None:
    """Why the kernel does not apply to this judge, in a few words; None where it does."""
    if softcap:
        return "the judge softcaps its scores, which the kernel does not compute"
    if device.type != "cpu":
        return f"on {device.type} the pass attends through SDPA"
    if dtype != torch.float32:
        return f"the kernel is float32 only (the judge runs {str(dtype).removeprefix('torch.')})"
    if head_dim not in HEAD_DIMS:
        return f"no kernel for head dimension {head_dim}"
    capability = without_avx512()
    if capability:
        return f"the kernel needs AVX-512 (this CPU: {capability})"
    return None


def attention_kernel(
    device: torch.device, dtype: torch.dtype, head_dim: int, wanted: bool = True, softcap: float | None = None
):
    """(the kernel's function or None, what a pass attends with, in words). Where the kernel applies and
    its build fails: a warning, and SDPA."""
    if not wanted:
        return None, "sdpa (the kernel switched off)"
    reason = why_not(device, dtype, head_dim, softcap)
    if reason is not None:
        return None, f"sdpa ({reason})"
    module, error = NATIVE.build_or_warn()
    if module is None:
        return None, f"sdpa (the kernel failed to build: {error})"
    return module.pass_attention, "kernel (attention_kernel.cpp, AVX-512)"
