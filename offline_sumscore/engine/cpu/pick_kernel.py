"""The greedy pick under a grammar mask on a CPU with AVX-512 (pick_kernel.cpp): its build, and where it runs.

A step's picks read every read point's logits under its packed grammar mask. torch takes six passes over the [reads,
vocab] logits for that (a NaN check, the bitmask unpacked to one int32 per token and compared, its inverse,
masked_fill, argmax): about 0.28 ms a read point at the embedded judge's 49,152 tokens on the 2-core machine, 0.2 s of
the ladder's standard workload. The kernel reads each row once and skips the unpacking, with the same result: the
NaN check over the whole row, and the first allowed token of the largest logit (torch's argmax takes the first of
equal values too). Elsewhere (a GPU, or a CPU without AVX-512) the picks run on torch's operators; where the kernel
should run and its build fails, a warning says so and torch's operators run. The engine's description says which
(`judge.engine.pick_kernel`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from offline_sumscore.engine.cpu.native_build import NativeModule

NATIVE = NativeModule(
    Path(__file__).with_name("pick_kernel.cpp"),
    "offline_sumscore_pick",
    ["masked_argmax"],
    "the pick kernel",
    15,
    "Picks run on torch's operators instead: slower, the same picks.",
)


def pick_kernel(device: torch.device, wanted: bool = True):
    """(the kernel's function or None, what picks run on, in words). Where the kernel applies and its build fails:
    a warning, and torch's operators."""
    if not wanted:
        return None, "torch (the kernel switched off)"
    if device.type != "cpu":
        return None, f"torch (on {device.type} the picks run on torch's operators)"
    module, why = NATIVE.build_on_avx512()
    if module is None:
        return None, f"torch ({why})"
    return module.masked_argmax, "kernel (pick_kernel.cpp, AVX-512)"
