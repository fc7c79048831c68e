"""A GGUF judge prepared once (engine/gguf_weights.py): its quantized linears and embedding listed as the file's own
block codes, each rebuilt to the bit as transformers loads it, the rest in bfloat16 safetensors equal to transformers'
own float32 load rounded; a finished folder is reused, an unfinished one or one checked by another kernel is redone;
and the bfloat16 linears of a CPU without fast bfloat16 matmul (engine/cpu/bf16_linears.py)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from offline_sumscore.engine import gguf_load, gguf_weights
from offline_sumscore.engine.cpu import bf16_linears
from offline_sumscore.engine.judge import _pick_dtype, embedded_gguf_path


def _fake_write(calls):
    """A stand-in for the conversion (seconds of dequantizing): counts its calls, writes one file."""

    def write(gguf, out):
        calls.append(out)
        (out / "config.json").write_text("{}\n")
        return {"tensors": 0, "kernel": gguf_weights.kernel_identity()}

    return write


@pytest.fixture
def fake_write(monkeypatch):
    calls = []
    monkeypatch.setattr(gguf_weights, "_write", _fake_write(calls))
    return calls


def test_a_prepared_folder_is_reused(tmp_path, fake_write):
    gguf = embedded_gguf_path()
    first = gguf_weights.prepare_gguf(gguf, tmp_path)
    stamp = (first / gguf_weights.MARKER).stat().st_mtime_ns
    again = gguf_weights.prepare_gguf(gguf, tmp_path)
    assert again == first and len(fake_write) == 1
    assert (first / gguf_weights.MARKER).stat().st_mtime_ns == stamp
    assert first.parent == tmp_path / "prepared" and len(first.name) == 16
    assert not list(first.parent.glob("*.tmp-*"))  # the temporary folder went with the rename


def test_a_folder_without_its_marker_is_redone(tmp_path, fake_write):
    gguf = embedded_gguf_path()
    folder = gguf_weights.prepare_gguf(gguf, tmp_path)
    (folder / gguf_weights.MARKER).unlink()  # a killed or damaged preparation
    (folder / "stray.safetensors").write_bytes(b"half a shard")
    assert gguf_weights.prepare_gguf(gguf, tmp_path) == folder and len(fake_write) == 2
    assert gguf_weights.is_prepared(folder) and not (folder / "stray.safetensors").exists()


def test_a_folder_checked_by_another_kernel_source_is_redone(tmp_path, fake_write):
    gguf = embedded_gguf_path()
    folder = gguf_weights.prepare_gguf(gguf, tmp_path)
    marker = json.loads((folder / gguf_weights.MARKER).read_text())
    (folder / gguf_weights.MARKER).write_text(json.dumps({**marker, "kernel": "0" * 16}))  # before a kernel change
    assert not gguf_weights.is_prepared(folder)
    assert gguf_weights.prepare_gguf(gguf, tmp_path) == folder and len(fake_write) == 2


def test_the_hash_comes_from_the_fetchers_sidecar_when_its_size_matches(tmp_path, monkeypatch):
    gguf = tmp_path / "judge.gguf"
    gguf.write_bytes(b"GGUF not really")
    sidecar = gguf.with_name("judge.gguf.sha256")
    sidecar.write_text(f"{'ab' * 32} {gguf.stat().st_size}\n")  # as judge_files.fetch_preset writes it
    assert gguf_weights.content_hash(gguf, tmp_path) == "ab" * 32
    sidecar.write_text(f"{'ab' * 32} 1\n")  # another file's: hashed instead
    real = gguf_weights.content_hash(gguf, tmp_path)
    assert real != "ab" * 32 and len(real) == 64
    memo = json.loads((tmp_path / "prepared" / "hashes.json").read_text())
    assert list(memo.values()) == [real]  # memoised: the next call reads no byte of the file
    monkeypatch.setattr(gguf_weights, "hash_file", None)  # reading the file again would now fail
    assert gguf_weights.content_hash(gguf, tmp_path) == real


def test_auto_dtype_on_a_cpu_keeps_a_prepared_gguf_in_bfloat16():
    assert _pick_dtype("auto", "cpu", prepared=True)[0] == torch.bfloat16
    assert _pick_dtype("auto", "cpu")[0] == torch.float32  # a model directory, the embedded judge: as before
    assert _pick_dtype("float32", "cpu", prepared=True)[0] == torch.float32


def _bf16_layers(monkeypatch, fast: bool):
    monkeypatch.setattr(bf16_linears, "fast_bf16_matmul", lambda: (fast, "test"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 160), torch.nn.Linear(160, 96)).to(torch.bfloat16)
    model.get_output_embeddings = lambda: model[1]  # stands in for the vocabulary projection
    reference = [(m.weight.detach().clone(), m.bias.detach().clone()) for m in model]
    return model, reference, bf16_linears.hybrid_linears(model)


def test_hybrid_linear_is_float32_for_many_rows_and_bfloat16_for_few(monkeypatch):
    model, ((weight, bias), _), said = _bf16_layers(monkeypatch, fast=False)
    assert "float32" in said and "1 linear layers" in said
    assert "forward" not in vars(model[1])  # the vocabulary projection is never upcast
    for rows in (bf16_linears.FLOAT32_ROWS, 3 * bf16_linears.FLOAT32_ROWS + 1):
        x = torch.randn(rows, 96).to(torch.bfloat16)
        # float32 arithmetic on the bfloat16 weight and input, rounded once: equal within one bfloat16 rounding of
        # the output (rtol 2**-8; in practice the same bits, the same float32 kernel on the same values).
        expected = torch.nn.functional.linear(x.float(), weight.float(), bias.float()).to(torch.bfloat16)
        torch.testing.assert_close(model[0](x), expected, rtol=2**-8, atol=1e-6)
        bf16 = torch.nn.functional.linear(x, weight, bias)
        assert (model[0](x).float() - expected.float()).abs().max() <= (bf16.float() - expected.float()).abs().max()
    for rows in (1, bf16_linears.FLOAT32_ROWS - 1):  # decoding: torch's bfloat16 linear, to the bit
        x = torch.randn(2, rows, 96).to(torch.bfloat16)[:1]
        assert torch.equal(model[0](x), torch.nn.functional.linear(x, weight, bias))


def test_a_cpu_with_native_bfloat16_keeps_torchs_linear(monkeypatch):
    model, _, said = _bf16_layers(monkeypatch, fast=True)
    assert "natively" in said and not any("forward" in vars(m) for m in model)


@pytest.fixture(scope="module")
def prepared_embedded(tmp_path_factory):
    """The embedded judge's GGUF prepared as any other GGUF is (a copy under another name, its own models root)."""
    root = tmp_path_factory.mktemp("models")
    started = time.perf_counter()
    folder = gguf_weights.prepare_gguf(embedded_gguf_path(), root)
    return root, folder, time.perf_counter() - started


@pytest.fixture(scope="module")
def transformers_float32():
    """transformers' own float32 load of the embedded judge's GGUF, the reference both tests below compare with (half
    a minute on 2 cores: loaded once)."""
    from offline_sumscore.engine.judge import _load_gguf

    model, _ = _load_gguf(embedded_gguf_path())
    return model


@pytest.mark.model
def test_every_prepared_tensor_is_transformers_float32_load(prepared_embedded, transformers_float32):
    """SmolLM2-135M is a llama GGUF in Q4_1: its q and k projections are un-permuted by transformers' tensor
    processor, which the coded tensors repeat as a row order, and its head is tied to the embedding."""
    from safetensors.torch import load_file

    from offline_sumscore.engine.cpu import gguf_codes

    _, folder, _ = prepared_embedded
    model = transformers_float32
    reference = model.state_dict()
    dense = {}
    for shard in sorted(folder.glob("*.safetensors")):
        dense.update(load_file(shard))
    coded = json.loads((folder / gguf_weights.CODED).read_text())
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(dense) and not set(dense) & {c["name"] for c in coded}
    # The head is tied to the embedding: listed once, and loading ties it again.
    assert set(reference) - set(dense) - {c["name"] for c in coded} == {"lm_head.weight"}
    assert model.config.tie_word_embeddings
    for name, tensor in dense.items():  # norms: in bfloat16
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(tensor, reference[name].to(torch.bfloat16)), name
    kernel, _ = gguf_codes.kernel()
    mapping = gguf_codes.map_file(embedded_gguf_path())
    permuted = []
    for entry in coded:
        tensor = gguf_codes.CodedTensor(**{**entry, "permutation": gguf_load._order(entry)})
        rebuilt = gguf_codes.dequantize(kernel, tensor.codes(mapping), tensor.type, tensor.columns)
        assert torch.equal(rebuilt.view(torch.int32), reference[tensor.name].view(torch.int32)), tensor.name
        permuted += [tensor.name] if tensor.permutation is not None else []
    assert len(coded) == 30 * 7 + 1  # every projection of 30 layers and the embedding
    assert len(permuted) == 60 and all(n.endswith(("q_proj.weight", "k_proj.weight")) for n in permuted)
    stamp = (folder / gguf_weights.MARKER).stat().st_mtime_ns
    assert gguf_weights.prepare_gguf(embedded_gguf_path(), prepared_embedded[0]) == folder
    assert (folder / gguf_weights.MARKER).stat().st_mtime_ns == stamp


@pytest.mark.model
def test_a_gguf_judge_holds_its_codes_not_a_float_copy(prepared_embedded, transformers_float32, tmp_path, monkeypatch):
    from offline_sumscore.engine.cpu import gguf_codes
    from offline_sumscore.engine.judge import load_judge

    root, folder, _ = prepared_embedded
    monkeypatch.setenv("OFFLINE_SUMSCORE_MODELS", str(root))
    brought = tmp_path / "smollm2.gguf"  # the same bytes under another name: not the embedded judge's path
    brought.symlink_to(embedded_gguf_path())
    judge = load_judge(brought, device="cpu")
    assert judge.dtype == "bfloat16" and "block codes" in judge.decisions["weights"] and not judge.embedded
    embedding, head = judge.model.get_input_embeddings(), judge.model.get_output_embeddings()
    assert isinstance(embedding, gguf_codes.CodedEmbedding) and isinstance(head, gguf_codes.CodedLinear)
    assert head.codes.data_ptr() == embedding.codes.data_ptr()  # tied: the same codes
    floats = sum(p.numel() * p.element_size() for p in judge.model.parameters())
    codes = sum(b.numel() for b in judge.model.buffers() if b.dtype == torch.uint8)
    assert floats < 0.01 * codes  # norms only: no float copy of a weight
    ids = judge.tokenizer("The library opens in March.", return_tensors="pt")["input_ids"]
    reference = transformers_float32
    with torch.no_grad():
        ours = torch.log_softmax(judge.model(ids).logits.float(), -1)
        theirs = torch.log_softmax(reference(ids).logits, -1)
    assert ours.dtype == torch.float32 and torch.isfinite(ours).all()
    # bfloat16 activations against float32 ones: the same next token at every place, and the log-probabilities of
    # every token the reference gives 1% or more within 0.3 (the far tail moves more: 0.6 at worst here)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    likely = theirs.exp() >= 0.01
    assert (ours - theirs).abs()[likely].max() < 0.3 and (ours - theirs).abs().max() < 1.5
