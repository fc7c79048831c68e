"""One engine spec, resolved in one place: score_file, a scorer and `sumscore score` pick the same engine from the
same settings. The device is faked (torch.cuda.is_available, vLLM "installed"); the engine factories raise the
kind they were asked to make, so nothing loads."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from offline_sumscore.cli.app import main
from offline_sumscore.core.errors import UsageError
from offline_sumscore.engine import build
from offline_sumscore.engine.build import EngineSpec, resolve, with_settings
from offline_sumscore.runs.files import score_file
from offline_sumscore.scorers import SummarizationScorer


class Chosen(Exception):
    """Raised by a faked engine factory: which engine the caller was about to make, and with what."""


@pytest.fixture
def fake_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "vllm" else found(name))

    def factory(kind):
        def make(model=None, **settings):
            raise Chosen(kind, str(model), settings)

        return make

    monkeypatch.setattr(build, "vllm_engine", factory("vllm"))
    monkeypatch.setattr(build, "local_engine", factory("local"))


@pytest.fixture
def rows(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"id": "a", "source": "The council met on Monday.", "summary": "It met."}) + "\n")
    return path


def chosen(call) -> tuple[str, str]:
    with pytest.raises(Chosen) as caught:
        call()
    return caught.value.args[0], caught.value.args[1]


def test_score_file_on_a_cuda_machine_picks_the_engine_the_cli_picks(fake_gpu, rows, tmp_path):
    model = str(tmp_path / "judge-dir")  # a model directory: vLLM loads it
    from_python = chosen(lambda: score_file(rows, tmp_path / "a.jsonl", model=model))
    outcome = CliRunner().invoke(main, ["score", str(rows), "-o", str(tmp_path / "b.jsonl"), "--model", model])
    assert isinstance(outcome.exception, Chosen), outcome.output
    assert from_python == outcome.exception.args[:2] == ("vllm", model)
    # and a scorer made directly, on its first score
    assert chosen(lambda: SummarizationScorer(model).load()) == ("vllm", model)


def test_settings_given_one_by_one_reach_the_resolution(fake_gpu, rows, tmp_path):
    model = str(tmp_path / "judge-dir")
    # device cpu among score_file's options: no GPU to run vLLM on, whichever way it is given
    assert chosen(lambda: score_file(rows, tmp_path / "a.jsonl", model=model, options={"device": "cpu"}))[0] == "local"
    outcome = CliRunner().invoke(
        main, ["score", str(rows), "-o", str(tmp_path / "b.jsonl"), "--model", model, "--device", "cpu"]
    )
    assert outcome.exception.args[0] == "local"
    assert chosen(lambda: SummarizationScorer(model, device="cpu").load())[0] == "local"
    spec = EngineSpec(kind="local", model=model, batch_size=8)
    with pytest.raises(Chosen) as caught:
        score_file(rows, tmp_path / "c.jsonl", engine=spec)
    assert caught.value.args[2]["batch_size"] == 8


def test_a_setting_given_twice_with_two_values_is_refused():
    assert with_settings(EngineSpec(device="cpu"), device="cpu").device == "cpu"
    assert with_settings(EngineSpec(device="cpu"), dtype="bfloat16").dtype == "bfloat16"
    with pytest.raises(UsageError, match="device is given twice"):
        with_settings(EngineSpec(device="cpu"), device="cuda")
    with pytest.raises(UsageError, match="engine kind must be one of"):
        EngineSpec(kind="llama")
    with pytest.raises(UsageError, match="--judge-url asks a server"):
        EngineSpec(kind="vllm", url="http://127.0.0.1:8000/v1")


def test_a_url_resolves_to_the_served_engine_without_touching_torch():
    spec, why = resolve(EngineSpec(url="http://127.0.0.1:8000/v1", served_model="m"))
    assert spec.kind == "served" and why == "served: m at http://127.0.0.1:8000/v1"
    assert "secret" not in repr(EngineSpec(api_key="secret"))  # a spec printed never shows the key


def test_load_judge_takes_a_spec_for_our_engine_only():
    from offline_sumscore import load_judge

    with pytest.raises(UsageError, match="a served engine loads its own"):
        load_judge(EngineSpec(url="http://127.0.0.1:8000/v1", served_model="m", kind="served"))
