"""The decoder's one-pass layer kernels (engine/cpu/layer_ops.cpp) against transformers' own operators: RMSNorm and
SiLU x up within float32 rounding, rotary embedding to the bit; what fuse_layer_ops replaces and what it leaves
alone; a build that fails, said loudly. On the real embedded judge: tests/model/test_embedded_judge.py; on every
family the engine runs: tests/engine/test_architectures.py."""

from __future__ import annotations

import warnings

import pytest
import torch

from offline_sumscore.engine.cpu import layer_ops

AVX512 = "AVX512" in torch.backends.cpu.get_cpu_capability()
needs_avx512 = pytest.mark.skipif(not AVX512, reason="the layer kernels are built for CPUs with AVX-512")


@pytest.fixture(scope="module")
def ops():
    return layer_ops.NATIVE.build()


def tiny_llama(**overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=72,  # not a multiple of 16: every kernel's last, partial vector
        intermediate_size=136,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=24,
        vocab_size=97,
        **overrides,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


@needs_avx512
@pytest.mark.parametrize("features", [16, 72, 576, 4096])
def test_rms_norm_equals_llamas_within_float32_rounding(ops, features):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(features, eps=1e-5)
    torch.manual_seed(1)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(37, features) * 5
    exact = (norm.weight.double() * (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5))).float()
    got = ops.rms_norm(x, norm.weight.detach(), 1e-5)
    theirs = norm(x).detach()
    assert (got - exact).abs().max() <= 4 * (theirs - exact).abs().max() + 1e-6
    assert torch.allclose(got, theirs, rtol=1e-6, atol=1e-6)


@needs_avx512
def test_silu_times_up_equals_torchs_in_place_for_every_sign_and_size(ops):
    torch.manual_seed(2)
    gate = torch.cat([torch.randn(1000) * 6, torch.tensor([0.0, -0.0, 90.0, -90.0, 1e-30, -200.0, 200.0])])
    up = torch.randn_like(gate)
    want = torch.nn.functional.silu(gate.double()) * up.double()
    out = ops.silu_mul_(gate.clone(), up)
    assert torch.isfinite(out).all()
    assert ((out.double() - want).abs() <= 1e-6 * want.abs() + 1e-30).all()
    g = gate.clone()
    assert ops.silu_mul_(g, up).data_ptr() == g.data_ptr()  # in place: the gate projection's output is reused


@needs_avx512
@pytest.mark.parametrize("dim", [16, 24, 64, 128])
def test_rotary_gives_the_same_bits_as_transformers(ops, dim):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    plain = layer_ops._function(apply_rotary_pos_emb)  # transformers' own, even if another test patched it
    torch.manual_seed(3)
    q = torch.randn(1, 29, 5, dim).transpose(1, 2)  # [B, heads, T, D] over [B, T, heads, D], as projected
    k = torch.randn(1, 29, 1, dim).transpose(1, 2)
    cos, sin = torch.randn(1, 29, dim), torch.randn(1, 29, dim)
    want_q, want_k = plain(q, k, cos, sin)
    got_q, got_k = layer_ops._rotary(ops, plain)(q, k, cos, sin)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    # Other shapes (a batch whose cos broadcasts) go to the original.
    q2, k2 = torch.randn(2, 5, 7, dim), torch.randn(2, 1, 7, dim)
    assert torch.equal(
        layer_ops._rotary(ops, plain)(q2, k2, cos[:, :7], sin[:, :7])[0], plain(q2, k2, cos[:, :7], sin[:, :7])[0]
    )


@needs_avx512
def test_a_llama_on_the_kernels_equals_itself_on_torchs_operators():
    model = tiny_llama()
    ids = torch.randint(0, 97, (1, 40))
    with torch.inference_mode():
        want = model(input_ids=ids).logits
    said = layer_ops.fuse_layer_ops(model)
    assert said.startswith("one-pass kernels") and "5 RMSNorms, 2 SiLU MLPs, rotary embedding (llama)" in said, said
    with torch.inference_mode():
        got = model(input_ids=ids).logits
    assert (got - want).abs().max() < 1e-4 * want.abs().max()


@needs_avx512
def test_what_is_not_llamas_keeps_torchs_operators():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size=50,
    )
    model = Gemma2ForCausalLM(config).eval()
    said = layer_ops.fuse_layer_ops(model)
    assert "0 RMSNorms, 0 SiLU MLPs" in said, said  # Gemma's norms scale by 1 + weight; its MLP is GELU
    assert all("forward" not in vars(m) for m in model.modules())


def test_the_switch_keeps_torchs_operators(monkeypatch):
    monkeypatch.setenv("OFFLINE_SUMSCORE_LAYER_OPS", "torch")
    model = tiny_llama()
    assert layer_ops.fuse_layer_ops(model) == "torch's operators (OFFLINE_SUMSCORE_LAYER_OPS=torch)"
    assert all("forward" not in vars(m) for m in model.modules())


@needs_avx512
def test_a_build_that_fails_is_said_loudly_and_nothing_is_replaced(missing_compiler, capsys):
    missing_compiler(layer_ops.NATIVE)
    model = tiny_llama()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said = layer_ops.fuse_layer_ops(model)
    assert said.startswith("torch's operators (the layer kernels failed to build") and "g++" in said
    assert any("g++: command not found" in str(w.message) for w in caught)
    assert "building the decoder's layer kernels" in capsys.readouterr().err
    assert all("forward" not in vars(m) for m in model.modules())
