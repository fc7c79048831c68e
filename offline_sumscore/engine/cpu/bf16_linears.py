"""A bfloat16 judge's linear layers on a CPU without fast bfloat16 matmul: float32 arithmetic for passes of many rows.

A judge prepared from a GGUF (engine/gguf_weights.py) keeps its weights in bfloat16: half of float32's memory. Where
the CPU has no native bfloat16 dot products (no AVX512_BF16, no AMX: this module's check, fast_bf16_matmul), torch's
bfloat16 matmul converts as it goes and is slow at many rows: measured here (2-core AVX2 EPYC, torch 2.13), a
8960x1536 linear took 356 ms at 256 rows in bfloat16 against 112 ms upcasting the weight and multiplying in float32,
while at 1-8 rows bfloat16 took 1.6-11 ms against 29-37 ms (few rows are bound by streaming the weight, and bfloat16
streams half the bytes). So each linear here runs bfloat16 directly for a pass of fewer than FLOAT32_ROWS rows
(decoding), and for a larger pass (prefill of a prompt: most of a judge's work) copies its weight into a float32
scratch buffer, multiplies in float32 and returns bfloat16. The upcast is transient: one scratch buffer per thread,
the size of the largest such weight (55 MB for Qwen2.5-1.5B's MLP), reused by every linear in turn; reusing it, not
allocating a fresh float32 weight each call, cut the 8960x1536 upcast from 28 ms to 5 ms (no page faults).

The crossover, measured with the scratch buffer on the 1.5B's shapes (same machine): float32 wins from 16 to 32
rows upwards; FLOAT32_ROWS sits there. The vocabulary projection (lm_head, 151,936 rows for Qwen) and
the embedding are never upcast: the engine projects only the few places it reads logits at, and the upcast of a
vocabulary-sized weight would cost more than its product. Results: for many rows, float32 arithmetic on the bfloat16
weights and inputs, rounded once to bfloat16 (closer to float32 than torch's bfloat16 linear); for few rows, torch's
bfloat16 linear exactly.

OFFLINE_SUMSCORE_BF16_LINEARS=torch keeps torch's bfloat16 linear everywhere (an A/B switch for the benchmarks).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

FLOAT32_ROWS = 32  # rows in a pass from which a linear computes in float32 (measured crossover: 16-32)
FAST_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bfloat16 dot products


def fast_bf16_matmul() -> tuple[bool, str]:
    """(whether this CPU multiplies bfloat16 natively, the evidence in words). Read from /proc/cpuinfo's flags
    (avx512_bf16, amx_bf16), else torch's capability name (AVX512 alone does not mean bfloat16 dot products)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    try:
        flags = set()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        flags = None
    if flags is None:
        # No /proc/cpuinfo (macOS, Windows): torch's own check of the oneDNN bfloat16 path is what is left.
        fast = bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)())
        return fast, f"no /proc/cpuinfo; oneDNN bfloat16 {'supported' if fast else 'unsupported'} ({capability})"
    found = sorted(flags & set(FAST_FLAGS))
    if found:
        return True, f"/proc/cpuinfo has {', '.join(found)} ({capability})"
    return False, f"/proc/cpuinfo has neither {' nor '.join(FAST_FLAGS)} ({capability})"


def hybrid_linears(model) -> str:
    """Every bfloat16 CPU nn.Linear of model but its vocabulary projection on the hybrid forward, where this CPU
    lacks fast bfloat16 matmul. Returns what was done, or why not, for judge.decisions."""
    import torch

    if os.environ.get("OFFLINE_SUMSCORE_BF16_LINEARS", "hybrid") == "torch":
        return "torch's bfloat16 linear (OFFLINE_SUMSCORE_BF16_LINEARS=torch)"
    fast, evidence = fast_bf16_matmul()
    if fast:
        return f"torch's bfloat16 linear: this CPU multiplies bfloat16 natively ({evidence})"
    head = model.get_output_embeddings()
    linears = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
        and m is not head
        and m.weight is not None
        and m.weight.dtype == torch.bfloat16
        and m.weight.device.type == "cpu"
    ]
    if not linears:
        return "torch's bfloat16 linear (no bfloat16 CPU linear in this judge)"
    scratch = Scratch(max(m.weight.numel() for m in linears))
    for module in linears:
        module.forward = hybrid_forward(module, scratch)
    return (
        f"bfloat16 weights; passes of {FLOAT32_ROWS}+ rows computed in float32 through one {scratch.mib:,.0f} MiB "
        f"scratch weight, fewer rows in bfloat16 ({len(linears)} linear layers, not the vocabulary projection): "
        f"this CPU lacks fast bfloat16 matmul ({evidence}), where bfloat16 was 3-4x slower than float32 at 256 rows"
    )


class Scratch:
    """A float32 buffer of `elements`, one per thread, into which a linear upcasts its weight for one call."""

    def __init__(self, elements: int):
        self.elements = elements
        self.local = threading.local()
        self.mib = elements * 4 / 2**20

    def weight(self, weight):
        import torch

        buffer = getattr(self.local, "buffer", None)
        if buffer is None:
            buffer = self.local.buffer = torch.empty(self.elements, dtype=torch.float32)
        return buffer[: weight.numel()].view(weight.shape).copy_(weight)


def hybrid_forward(module, scratch: Scratch):
    """module's forward: torch's bfloat16 linear under FLOAT32_ROWS rows, float32 arithmetic from there."""
    import torch
    import torch.nn.functional as F

    def forward(x):
        weight, bias = module.weight, module.bias
        if x.dtype != torch.bfloat16 or x.numel() < FLOAT32_ROWS * weight.shape[1]:
            return F.linear(x, weight, bias)
        out = F.linear(x.float(), scratch.weight(weight), None if bias is None else bias.float())
        return out.to(torch.bfloat16)

    return forward
