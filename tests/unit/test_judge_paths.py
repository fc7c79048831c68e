"""A model path that cannot be a judge gets a one-line ModelLoadError that says what to do (no model loaded)."""

import pytest

from offline_sumscore import ModelLoadError
from offline_sumscore.engine.judge import resolve_model_path


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist; pass a Hugging Face model directory or a .gguf file"):
        resolve_model_path(tmp_path / "absent")


def test_directory_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match=r"is not a model directory \(no config.json\)"):
        resolve_model_path(tmp_path)


def test_model_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"has no weights \(\*.safetensors or \*.bin\)"):
        resolve_model_path(tmp_path)


def test_file_that_is_not_gguf(tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file but not a .gguf"):
        resolve_model_path(tmp_path / "weights.pt")


def test_messages_are_one_line(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        resolve_model_path(tmp_path / "absent")
    assert "\n" not in str(info.value)


def test_capacity_counts_memory_reserved_but_unused_and_divides_a_shared_device():
    from offline_sumscore.engine.local.capacity import kv_token_budget, usable_memory
    from offline_sumscore.runs.ray_pool import _share

    gib = 2**30
    assert usable_memory(10 * gib, 6 * gib, 1.0) == 16 * gib  # PyTorch's cached blocks are this process's to use
    assert usable_memory(10 * gib, 6 * gib, 0.5) == 8 * gib  # two actors on one GPU: each fills half
    per_token = 131072  # Llama-3.1-8B in bf16: 2 x 32 layers x 8 heads x 128 x 2 bytes
    assert kv_token_budget(usable_memory(10 * gib, 6 * gib, 1.0), per_token) == 65536
    assert kv_token_budget(usable_memory(10 * gib, 6 * gib, 0.5), per_token) == 32768
    assert _share(0.5) == 0.5 and _share(1) is None and _share(0) is None


def test_ram_counts_what_linux_can_reclaim_and_falls_back_to_free_pages(tmp_path):
    from offline_sumscore.engine.local.capacity import available_ram

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         4000000 kB\nMemAvailable:   20000000 kB\n")
    assert available_ram(str(meminfo)) == (20000000 * 1024, "available RAM")  # the page cache counts: reclaimable
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:         4000000 kB\n")  # a kernel without the field
    free, what = available_ram(str(meminfo))
    assert what == "free RAM" and free > 0
    assert available_ram(str(tmp_path / "absent"))[1] == "free RAM"


class _Weights:
    """A parameter of so many bytes, as weight_bytes reads one (nothing allocated)."""

    def __init__(self, size: int):
        self.size = size

    def numel(self):
        return self.size // 2

    def element_size(self):
        return 2

    def data_ptr(self):
        return id(self)


def _bounded_device(total: int, free: int):
    from offline_sumscore.engine.local.device_memory import DeviceMemory

    class Device(DeviceMemory):
        kind, bounded = "cuda", True

        def total(self):
            return total

        def free(self):
            return free

    return Device()


LLAMA_8B = dict(num_key_value_heads=8, num_attention_heads=32, head_dim=128, hidden_size=4096, num_hidden_layers=32)


def test_a_gpu_sizes_its_kv_budget_as_vllm_does_from_total_memory_less_weights_and_a_measured_pass():
    """Llama-3.1-8B on an H200: 90% of 141 GiB less 16 GiB of weights and a 4 GiB pass, a fifth of it the prefix
    store's. The old rule (half the free memory, rounded down to a power of two) gave 2^18 tokens, 32 GiB: 26% of the
    free memory."""
    from types import SimpleNamespace

    import torch

    from offline_sumscore.engine.local.capacity import capacity

    gib = 2**30
    model = SimpleNamespace(
        config=SimpleNamespace(**LLAMA_8B),
        dtype=torch.bfloat16,
        parameters=lambda: [_Weights(16 * gib)],
        buffers=lambda: [],
    )

    def sized(share=1.0, free=124 * gib, given=None):
        return capacity(
            model,
            _bounded_device(141 * gib, free),
            rows=512,
            token_budget=given,
            device_share=share,
            pass_tokens=16384,
            activation_peak=lambda: 4 * gib,
        )

    whole, per_token = sized(), 131072
    kv = 0.9 * 140 * gib - 16 * gib - 4 * gib  # 90% of what it could hold (124 free + its 16 of weights), less both
    assert 0.77 * kv < (whole.token_budget + whole.store_tokens) * per_token <= kv  # a few % for rounding and spare
    assert whole.store_tokens * per_token == pytest.approx(0.2 * kv, rel=1e-3)
    assert whole.token_budget > 4 * 2**18 * 0.6  # 2.4x the old rule's tokens at least
    assert "90% of the device's memory less the weights' 16.00 GiB and a full pass's measured peak of 4.00 GiB" in (
        whole.reason
    )
    half = sized(share=0.5)  # two engines on one GPU: each its share, less its own weights
    assert half.token_budget < whole.token_budget / 2
    busy = sized(free=60 * gib)  # another process holds memory: 90% of what is free and its weights, less both
    assert (busy.token_budget + busy.store_tokens) * per_token <= 0.9 * 76 * gib - 20 * gib
    assert sized(given=8192).token_budget == 8192
    with pytest.raises(ModelLoadError, match="does not fit this device with room to judge"):
        sized(free=5 * gib)


def test_a_judges_identity_is_its_weights_and_config_not_where_they_lie(tmp_path):
    """The same weights at two paths are one judge: rows scored from either compare, and the stage cache serves
    both. Another config or another weights header is another judge."""
    import json
    import struct

    from offline_sumscore.engine.judge import _identity

    def model_dir(name: str, header: dict):
        folder = tmp_path / name
        folder.mkdir()
        head = json.dumps(header).encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + b"\0" * 8)
        return folder

    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    config = {"model_type": "llama", "hidden_size": 8}
    here, there = model_dir("here", header), model_dir("there", header)
    same_here = _identity(here, dict(config, _name_or_path=str(here)))
    assert same_here == _identity(there, dict(config, _name_or_path=str(there)))
    assert same_here != _identity(here, dict(config, hidden_size=16, _name_or_path=str(here)))
    other = model_dir("other", {"w": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]}})
    assert same_here != _identity(other, dict(config, _name_or_path=str(other)))


def test_a_judges_repr_names_it_without_printing_its_model():
    from offline_sumscore.engine.judge import Judge

    class Huge:
        def __repr__(self):
            return "LlamaForCausalLM(" + "layer, " * 10_000 + ")"

    judge = Judge(
        model=Huge(),
        tokenizer=Huge(),
        name="n",
        path="p",
        device="cpu",
        dtype="float32",
        identity="i",
        context_length=8,
    )
    text = repr(judge)
    assert text.startswith("Judge(name='n', path='p'") and "LlamaForCausalLM" not in text and len(text) < 400


def test_a_pass_that_runs_out_of_memory_beside_the_weights_is_one_line_naming_both():
    """Sizing measures one full pass; where it runs out of memory beside the weights (a device a little larger than
    them), the run ends in one ModelLoadError line, not the measuring pass's torch.OutOfMemoryError."""
    from types import SimpleNamespace

    import torch

    from offline_sumscore.engine.local.capacity import capacity

    model = SimpleNamespace(
        config=SimpleNamespace(**LLAMA_8B),
        dtype=torch.bfloat16,
        parameters=lambda: [_Weights(16 * 2**30)],
        buffers=lambda: [],
    )

    def out_of_memory():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(ModelLoadError) as info:
        capacity(
            model,
            _bounded_device(17 * 2**30, 1 * 2**30),
            rows=512,
            token_budget=None,
            device_share=1.0,
            pass_tokens=16384,
            activation_peak=out_of_memory,
        )
    said = str(info.value)
    assert "\n" not in said and "does not fit this device with room to judge" in said
    assert "its weights take 16,384 MiB and one pass of 16384 tokens ran out of memory" in said


def test_weights_that_run_the_device_out_of_memory_as_they_load_are_one_line_naming_their_size(monkeypatch):
    """Under an emulated GPU of 600 MiB the embedded judge's 513 MiB pass the check before loading; a load that then
    runs out of memory (as one on a busy GPU does) is said in one line naming the weights' size and the device."""
    import torch

    from offline_sumscore.engine import judge as judge_module

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")

    monkeypatch.setenv("OFFLINE_SUMSCORE_DEVICE_MEMORY", "600")
    monkeypatch.setattr(judge_module, "_load_weights", out_of_memory)
    with pytest.raises(ModelLoadError) as info:
        judge_module.load_judge("smollm2-135m")
    said = str(info.value)
    assert "\n" not in said and "the device ran out of memory loading its weights (513 MiB)" in said
    assert "emulated GPU of 600 MiB" in said


def test_weights_larger_than_the_device_are_refused_from_the_files_before_loading(monkeypatch):
    from offline_sumscore.engine import judge as judge_module

    def loaded(*args):
        raise AssertionError("the weights were loaded before the judge was refused")

    monkeypatch.setenv("OFFLINE_SUMSCORE_DEVICE_MEMORY", "300")
    monkeypatch.setattr(judge_module, "_load_weights", loaded)
    with pytest.raises(ModelLoadError) as info:
        judge_module.load_judge("smollm2-135m")
    said = str(info.value)
    assert "\n" not in said and "its weights take 513 MiB in float32, more than the whole device holds" in said
    assert "emulated GPU of 300 MiB" in said and "--dtype bfloat16" in said and "(refused before loading)" in said
