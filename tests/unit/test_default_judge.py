"""Which judge a run without --model uses (engine/judge.py): the 1.5B preset when it is here, one line saying how to get
it when it is not, $OFFLINE_SUMSCORE_JUDGE naming another. No weights load: a sparse file of the preset's size stands
in for the fetched GGUF."""

import pytest

from offline_sumscore import ModelLoadError
from offline_sumscore.engine import judge
from offline_sumscore.engine.build import EngineSpec, resolve


@pytest.fixture
def empty_models(tmp_path, monkeypatch):
    """An empty models root and no judge named in the environment (conftest names the fast judge for the suite)."""
    monkeypatch.setenv("OFFLINE_SUMSCORE_MODELS", str(tmp_path))
    monkeypatch.delenv(judge.JUDGE_ENV, raising=False)
    return tmp_path


def _place_default(root):
    preset = judge.presets()[judge.DEFAULT_JUDGE]
    path = root / preset["path"]
    with open(path, "wb") as f:
        f.truncate(preset["fetch"]["bytes"])  # sparse: the size a load checks, no bytes written
    return path


def test_the_default_is_the_1_5b_when_no_judge_is_named(empty_models):
    assert judge.default_judge() == "qwen2.5-coder-1.5b"
    assert judge.judge_reference(None).endswith("Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf")


def test_absent_default_says_in_one_line_how_to_get_it(empty_models):
    with pytest.raises(ModelLoadError) as caught:
        judge.resolve_model_path(None)
    message = str(caught.value)
    assert "\n" not in message
    assert "sumscore setup --judge qwen2.5-coder-1.5b" in message
    assert "--model smollm2-135m" in message


def test_present_default_resolves_to_its_file_and_its_header_is_checked(empty_models, monkeypatch):
    from offline_sumscore.engine import model_header

    checked = []
    monkeypatch.setattr(model_header, "refuse_unable", checked.append)  # the stand-in has no GGUF header
    path = _place_default(empty_models)
    assert judge.resolve_model_path(None) == path
    assert checked == [path]


def test_a_cut_off_default_is_refused_by_size(empty_models):
    path = _place_default(empty_models)
    with open(path, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelLoadError, match="1000 bytes"):
        judge.resolve_model_path("qwen2.5-coder-1.5b")


def test_the_environment_names_another_default(empty_models, monkeypatch):
    monkeypatch.setenv(judge.JUDGE_ENV, "smollm2-135m")
    assert judge.default_judge() == "smollm2-135m"
    assert judge.judge_reference(None).endswith("SmolLM2-135M-Instruct")


def test_a_gguf_default_runs_on_the_local_engine_even_beside_a_gpu(empty_models, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    spec, reason = resolve(EngineSpec(device="cuda"))
    assert spec.kind == "local" and ".gguf" in reason
