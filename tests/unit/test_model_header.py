"""A model that cannot judge is refused from its header, in seconds, before a weight is loaded or a GGUF converted.

The GGUF files here are written with the gguf package: the header a real file has (architecture, context length,
chat template or none) and one small tensor, since nothing past the header may be read. The embedded judge's own
GGUF and converted folder are read as they are.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from offline_sumscore import ModelLoadError
from offline_sumscore.engine import judge as judge_module
from offline_sumscore.engine.model_header import MIN_CONTEXT, read_gguf_metadata, read_header, refuse_unable

TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>"


def write_gguf(path, *, arch="llama", context=8192, template=None, vocab=3):
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(context)
    writer.add_name("a test model")
    writer.add_token_list([f"t{i}" for i in range(vocab)])  # an array of strings, passed over by the reader
    if template is not None:
        writer.add_chat_template(template)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def judge_dir():
    """The embedded judge's converted folder (`make setup`)."""
    return judge_module.models_root() / judge_module.EMBEDDED_NAME


@pytest.fixture
def no_loading(monkeypatch):
    """Any attempt to read weights or convert fails the test: the refusal must come first."""

    def loaded(*args, **kwargs):
        raise AssertionError("weights were loaded before the model was refused")

    monkeypatch.setattr(judge_module, "_load_gguf", loaded)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", loaded)


def test_the_header_is_read_past_a_vocabulary_without_reading_the_tensors(tmp_path):
    path = write_gguf(tmp_path / "chat.gguf", template=TEMPLATE, vocab=150_000)
    started = time.perf_counter()
    metadata = read_gguf_metadata(path)
    assert time.perf_counter() - started < 5
    assert metadata["general.architecture"] == "llama" and metadata["llama.context_length"] == 8192
    assert metadata["tokenizer.chat_template"] == TEMPLATE
    assert "tokenizer.ggml.tokens" not in metadata  # arrays are skipped


def test_a_gguf_without_a_chat_template_is_refused_before_it_is_converted(tmp_path, no_loading):
    path = write_gguf(tmp_path / "base.gguf")
    started = time.perf_counter()
    with pytest.raises(ModelLoadError, match=r"has no chat template \(the GGUF key tokenizer.chat_template\)"):
        judge_module.load_judge(path)
    with pytest.raises(ModelLoadError, match="before loading any weight"):
        judge_module.convert_gguf(path, tmp_path / "converted")
    assert time.perf_counter() - started < 10
    assert not (tmp_path / "converted").exists()


def test_sumscore_convert_refuses_a_base_gguf_in_seconds_with_one_line(tmp_path):
    path = write_gguf(tmp_path / "gemma-base.gguf", arch="gemma3")
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "offline_sumscore", "convert", str(path), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.perf_counter() - started < 10, "the refusal took as long as a conversion"
    assert proc.returncode == 2 and "has no chat template" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_a_model_directory_without_a_chat_template_is_refused_before_its_weights_load(judge_dir, tmp_path, no_loading):
    copy = tmp_path / "base-model"
    shutil.copytree(judge_dir, copy)
    (copy / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    started = time.perf_counter()
    with pytest.raises(ModelLoadError, match="has no chat template"):
        judge_module.load_judge(copy)
    assert time.perf_counter() - started < 10


def test_the_embedded_judge_says_what_it_is_in_both_forms(judge_dir):
    gguf_header = read_header(judge_module.embedded_gguf_path())
    assert (gguf_header.architecture, gguf_header.context_length, gguf_header.has_chat_template) == (
        "llama",
        8192,
        True,
    )
    folder = refuse_unable(judge_dir)
    assert (folder.architecture, folder.context_length, folder.has_chat_template) == ("LlamaForCausalLM", 8192, True)


def test_an_architecture_transformers_cannot_load_from_gguf_is_named(tmp_path, no_loading):
    path = write_gguf(tmp_path / "rwkv.gguf", arch="rwkv6", template=TEMPLATE)
    with pytest.raises(ModelLoadError, match="architecture 'rwkv6', which transformers does not load from GGUF"):
        judge_module.load_judge(path)


def test_a_context_too_short_for_the_instructions_is_refused(tmp_path, no_loading):
    path = write_gguf(tmp_path / "short.gguf", context=512, template=TEMPLATE)
    with pytest.raises(ModelLoadError, match=f"a context of 512 tokens; a judge needs at least {MIN_CONTEXT}"):
        judge_module.load_judge(path)


@pytest.mark.parametrize("cut", [3, 20, 60])
def test_a_truncated_header_is_a_one_line_error(tmp_path, cut):
    whole = write_gguf(tmp_path / "whole.gguf", template=TEMPLATE).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[:cut])
    with pytest.raises(ModelLoadError) as info:
        read_header(tmp_path / "cut.gguf")
    assert "\n" not in str(info.value) and (
        "truncated or corrupt" in str(info.value) or "not a GGUF" in str(info.value)
    )


def test_the_tensors_listed_end_where_the_file_ends_and_a_byte_short_is_refused_before_loading(tmp_path, no_loading):
    """Two files written by others (the embedded judge's, one written by the gguf package) end where their headers
    say; the small one cut by a byte is refused by read_header and by load_judge, naming what is missing."""
    from offline_sumscore.engine.model_header import read_gguf_layout

    embedded = judge_module.embedded_gguf_path()
    assert read_gguf_layout(embedded).data_end() == embedded.stat().st_size
    small = write_gguf(tmp_path / "small.gguf", template=TEMPLATE)
    layout = read_gguf_layout(small)
    assert [(t.name, t.shape, t.nbytes()) for t in layout.tensors] == [("token_embd.weight", (8, 3), 96)]
    assert layout.data_end() == small.stat().st_size
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(small.read_bytes()[:-1])
    for refuse in (read_header, judge_module.load_judge):
        with pytest.raises(ModelLoadError, match=r"is truncated: its GGUF header lists 1 tensors ending at byte") as e:
            refuse(cut)
        assert "(1 missing)" in str(e.value) and "\n" not in str(e.value)


def test_the_weights_size_read_from_a_gguf_header_is_the_size_read_from_its_converted_safetensors(judge_dir):
    """Two readers, two files of the embedded judge: the GGUF's tensor descriptions and the converted folder's
    safetensors headers count the same elements (135M: 513 MiB in float32, half that in bfloat16)."""
    from offline_sumscore.engine.model_header import weights_in_memory

    from_gguf = weights_in_memory(judge_module.embedded_gguf_path(), 4)
    assert from_gguf == weights_in_memory(judge_dir, 4) == 2 * weights_in_memory(judge_dir, 2)
    assert round(from_gguf / 2**20) == 513
