"""A ragged pass's attention kernel on a CPU (attention_kernel.cpp): where it runs, its build, and why not elsewhere.

Every token of a pass attends in one call of the kernel: each reads its own slot's columns up to its own, and nothing
else. Through SDPA a pass attends in several calls (the decoding rows in one over a span of slots up to the longest
row, each prompt or draft in one of its own), padded to a grid and masked; the kernel builds no grid and no mask, and
ran one layer's attention 1.07 to 2.3x faster than those calls (research/results/attention_kernel.md).

It is C++ with AVX-512 intrinsics, built with torch.utils.cpp_extension at first use (g++ and ninja, about 35 s) and
cached by torch (TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions) for later runs. It runs where it can:
float32 on a CPU with AVX-512, a head dimension of 16 to 96, 128 or 256, no softcap. Elsewhere (a GPU, bfloat16, a
CPU without AVX-512, Gemma-2's softcapped scores) a pass attends through SDPA, and the engine's description says
which and why (`judge.engine.attention_kernel`). Where it should run and its build fails, the engine says so loudly
(a warning with the compiler's message) and runs on SDPA.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("attention_kernel.cpp")
NAME = "offline_sumscore_pass_attention"  # the module's name in torch's extension cache
HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128, 256)
FLAGS = ["-O3", "-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl", "-mfma", "-fopenmp"]

_lock = threading.Lock()
_built: dict[str, object] = {}  # "module" or "error", once per process


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
    capability = torch.backends.cpu.get_cpu_capability()
    if "AVX512" not in capability:
        return f"the kernel needs AVX-512 (this CPU: {capability})"
    return None


def build():
    """The compiled module (built at first use, torch's cache after); raises RuntimeError naming what failed."""
    with _lock:
        if "module" in _built:
            return _built["module"]
        if "error" in _built:
            raise RuntimeError(_built["error"])
        from torch.utils.cpp_extension import load_inline

        if not _cached():  # a build takes about 35 s: said, not left as a silent pause
            print("offline_sumscore: building the attention kernel (once; about 35 s)", file=sys.stderr)
        try:
            module = load_inline(
                name=NAME,
                cpp_sources=SOURCE.read_text(),
                functions=["pass_attention"],
                extra_cflags=FLAGS,
                extra_ldflags=["-fopenmp"],  # torch's own libgomp, already loaded: one OpenMP runtime
                verbose=False,
            )
        except Exception as e:  # the compiler, ninja or a broken cache: what it said, where it lies
            _built["error"] = (
                f"the attention kernel ({SOURCE.name}) could not be built or loaded: "
                f"{type(e).__name__}: {str(e).strip()[-600:]} (torch builds it under TORCH_EXTENSIONS_DIR, else "
                "~/.cache/torch_extensions; removing that folder forces a fresh build)"
            )
            raise RuntimeError(_built["error"]) from e
        _built["module"] = module
        return module


def _cached() -> bool:
    """Whether torch's extension cache holds a build of the kernel (then loading it takes a fraction of a second)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return (Path(_get_build_directory(NAME, False)) / f"{NAME}.so").exists()
    except Exception:  # a private helper of torch's: where it is missing or moved, the message shows every time
        return False


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
    try:
        module = build()
    except RuntimeError as e:
        warnings.warn(f"{e}. Passes attend through SDPA instead: slower, the same verdicts.", stacklevel=2)
        return None, f"sdpa (the kernel failed to build: {e})"
    return module.pass_attention, "kernel (attention_kernel.cpp, AVX-512)"
