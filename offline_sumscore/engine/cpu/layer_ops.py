"""A float32 judge's RMSNorm, gated MLP and rotary embedding on the CPU, each in one pass (layer_ops.cpp).

Around its matmuls a decoder layer runs about a dozen elementwise operators, each a pass over its tensors: RMSNorm
alone squares, averages, adds, takes a root and multiplies twice; the MLP applies SiLU to the gate projection and
multiplies by the up projection over its widest activations; rotary embedding takes two products, a concatenation, a
negation and a sum for queries and keys. Here each is one pass, with the products in transformers' order: rotary
gives the same bits as transformers, RMSNorm and SiLU differ by float32 rounding (the sum of squares in another
order; e^x as a polynomial of relative error under 2e-7). On the 2-core machine the bare decoder ran 1.06x to 1.16x
faster (research/results/layer_ops.md), the engine 1.09x at bulk and 1.17x on the standard workload
(research/results/engine_ab_layer_ops.md, engine_ab_bulk_layer_ops.md).

Only code that is Llama's is replaced: a norm or MLP whose class's forward is compiled from the same code as
LlamaRMSNorm's or LlamaMLP's (with SiLU), and the rotary function of a modeling module whose function is Llama's
(Qwen2, Qwen3 and Mistral share them). Anything else (Gemma's norms of 1 + weight, Phi-3's fused gate and up) keeps
transformers' operators. The norms and MLPs are patched on the judge's own modules, as cpu_gemm.py packs its linears;
the rotary function is patched in its modeling module (it is looked up there at every call), giving the same bits,
and hands calls of other shapes to the original. OFFLINE_SUMSCORE_LAYER_OPS=torch keeps torch's operators (an A/B
switch for the benchmarks).
"""

from __future__ import annotations

import inspect
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from offline_sumscore.engine.cpu.native_build import AVX512_FLAGS, NativeModule, without_avx512

NATIVE = NativeModule(
    Path(__file__).with_name("layer_ops.cpp"),
    "offline_sumscore_layer_ops",
    ["rms_norm", "silu_mul_", "rotary"],
    "the decoder's layer kernels",
    15,
    "The judge runs torch's operators instead: slower, the same verdicts.",
    # No fused multiply-adds where the source writes a product and a sum: rotary rounds as torch does.
    [*AVX512_FLAGS, "-ffp-contract=off"],
)
PATCHED = "_offline_sumscore_layer_ops"  # marks a forward or rotary function this module put in place


def fuse_layer_ops(model) -> str:
    """The judge's Llama-style norms, MLPs and rotary function on one-pass kernels. Returns what was done, in words,
    for judge.decisions (and why not, where nothing was)."""
    if os.environ.get("OFFLINE_SUMSCORE_LAYER_OPS", "native") == "torch":
        return "torch's operators (OFFLINE_SUMSCORE_LAYER_OPS=torch)"
    capability = without_avx512()
    if capability:
        return f"torch's operators (the layer kernels need AVX-512; this CPU: {capability})"
    from transformers.models.llama import modeling_llama as llama

    norms = [m for m in model.modules() if _same_code(type(m).forward, llama.LlamaRMSNorm.forward)]
    mlps = [
        m
        for m in model.modules()
        if _same_code(type(m).forward, llama.LlamaMLP.forward) and type(m.act_fn).__name__ in ("SiLU", "SiLUActivation")
    ]
    attention_homes = {sys.modules[type(m).__module__] for m in model.modules() if hasattr(m, "q_proj")}
    homes = {
        h for h in attention_homes if _same_code(getattr(h, "apply_rotary_pos_emb", None), llama.apply_rotary_pos_emb)
    }
    if not (norms or mlps or homes):
        return "torch's operators (no Llama-style norm, MLP or rotary embedding in this judge)"
    ops, error = NATIVE.build_or_warn()
    if ops is None:
        return f"torch's operators (the layer kernels failed to build: {error})"
    for module in norms:
        module.forward = _marked(_norm(ops, module.weight.detach(), module.variance_epsilon))
    for module in mlps:
        module.forward = _marked(_mlp(ops, module))
    for home in homes:
        if not getattr(home.apply_rotary_pos_emb, PATCHED, False):
            home.apply_rotary_pos_emb = _rotary(ops, home.apply_rotary_pos_emb)
    where = ", ".join(sorted(h.__name__.rsplit(".", 1)[-1].removeprefix("modeling_") for h in homes)) or "none"
    return (
        f"one-pass kernels (layer_ops.cpp, AVX-512): {len(norms)} RMSNorms, {len(mlps)} SiLU MLPs, rotary "
        f"embedding ({where})"
    )


@contextmanager
def torch_operators(model):
    """transformers' own operators back on this model inside the block, the kernels after it: an A/B in one process
    (research/layer_ops.py, the embedded judge's test). Yields the modules put back."""
    patched = {m: vars(m).pop("forward") for m in model.modules() if getattr(vars(m).get("forward"), PATCHED, False)}
    homes = {sys.modules[type(m).__module__] for m in model.modules()}
    fused = {h: h.apply_rotary_pos_emb for h in homes if getattr(vars(h).get("apply_rotary_pos_emb"), PATCHED, False)}
    try:
        for home, rotary in fused.items():
            home.apply_rotary_pos_emb = rotary.__wrapped__
        yield list(patched)
    finally:
        for home, rotary in fused.items():
            home.apply_rotary_pos_emb = rotary
        for module, forward in patched.items():
            module.forward = forward


def _marked(fn):
    setattr(fn, PATCHED, True)
    return fn


def _same_code(fn, reference) -> bool:
    """Whether fn is compiled from the same code as reference: the same bytecode, constants and names."""
    a, b = _function(fn), _function(reference)
    if a is None or b is None:
        return False
    a, b = a.__code__, b.__code__
    return (a.co_code, a.co_consts, a.co_names) == (b.co_code, b.co_consts, b.co_names)


def _function(fn):
    """The plain function behind fn, or None. Decorators are unwrapped; where the `kernels` package is installed,
    transformers' kernel hub turns apply_rotary_pos_emb into a module whose forward calls the function."""
    if fn is None:
        return None
    fn = inspect.unwrap(fn)
    if isinstance(fn, torch.nn.Module):
        inner = [c.cell_contents for c in type(fn).forward.__closure__ or ()]
        inner = [f for f in inner if inspect.isfunction(f)]
        return inspect.unwrap(inner[0]) if len(inner) == 1 else None
    return fn if inspect.isfunction(fn) else None


def _norm(ops, weight, eps: float):
    def forward(hidden_states):
        return ops.rms_norm(hidden_states.contiguous(), weight, eps)

    return forward


def _mlp(ops, module):
    gate, up, down = module.gate_proj, module.up_proj, module.down_proj

    def forward(x):
        return down(ops.silu_mul_(gate(x).contiguous(), up(x).contiguous()))

    return forward


def _rotary(ops, original):
    """transformers' apply_rotary_pos_emb for queries and keys laid out [B, T, heads, D] under their [B, heads, T, D]
    view (as every Llama-style attention projects them) with cos and sin [B, T, D]; other calls go to the original,
    which gives the same bits."""

    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (
            unsqueeze_dim != 1
            or q.dim() != 4
            or k.dim() != 4
            or cos.dim() != 3
            or cos.shape[-1] != q.shape[-1]
            or q.dtype != torch.float32
            or q.device.type != "cpu"
            or cos.shape[0] != q.shape[0]
        ):
            return original(q, k, cos, sin, unsqueeze_dim)
        q_out, k_out = ops.rotary(
            q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), cos.contiguous(), sin.contiguous()
        )
        return q_out.transpose(1, 2), k_out.transpose(1, 2)

    apply_rotary_pos_emb.__wrapped__ = original
    return _marked(apply_rotary_pos_emb)
