"""Shared fixtures. Every test runs offline: no hub, whatever the environment says."""

from __future__ import annotations

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# A run without --model uses the small embedded judge here (CLI runs included: subprocesses inherit it): the suite's
# hundreds of real-model runs take minutes on it. The default judge itself is tested where it is named
# (tests/instruct/, tests/unit/test_default_judge.py); a test that needs the unset default removes this.
os.environ["OFFLINE_SUMSCORE_JUDGE"] = "smollm2-135m"

import pytest

from offline_sumscore.engine.scripted import ScriptedEngine

SOURCE = (
    "The city council of Lindford voted on Tuesday to build a new public library on Mill Street. "
    "Construction will begin in March and cost 4 million pounds."
)
SUMMARY = "Lindford will build a library on Mill Street for 4 million pounds."

# One scripted two-axis exchange (a brought judge's design: atomic claims, questions, yes-no verdicts): three claims,
# the third unsupported; two questions, the second missed. Alignment 2/3, coverage 1/2, score 0.5.
CLAIMS = {"claims": ["Lindford will build a library.", "It is on Mill Street.", "It costs 5 million pounds."]}
SUPPORT = ["Yes\nReason: stated", "Yes\nReason: stated", "No\nReason: the source says 4 million"]
QUESTIONS = {"questions": ["Did the council vote to build a library?", "Will construction begin in March?"]}
COVERAGE = ["Yes\nReason: says so", "No\nReason: no date given"]


def enqueue_two_axis(scripted, times: int = 1):
    """Queue the exchange above for `times` samples scored together."""
    for _ in range(times):
        scripted.enqueue("claims", CLAIMS).enqueue("questions", QUESTIONS)
        scripted.enqueue("support", *SUPPORT).enqueue("coverage", *COVERAGE)
    return scripted


@pytest.fixture(autouse=True)
def private_stage_cache(tmp_path, monkeypatch):
    """Every test gets its own stage cache file: no test may answer from another's verdicts."""
    path = tmp_path / "stage-cache.sqlite"
    monkeypatch.setenv("OFFLINE_SUMSCORE_CACHE", str(path))
    return path


@pytest.fixture
def scripted():
    return ScriptedEngine()


@pytest.fixture(scope="session")
def judge():
    """The real embedded judge, converted once by `make setup`. Fails loudly, never skips, when it is missing."""
    from offline_sumscore.engine.judge import load_judge

    return load_judge("smollm2-135m")


@pytest.fixture
def missing_compiler(monkeypatch):
    """Call with a kernel's NativeModule: its next build is a first one (announced on stderr) on a machine whose
    compiler is missing ("g++: command not found"), for the tests that it fails loudly."""

    def broken(**kwargs):
        raise OSError("g++: command not found")

    def break_build(native):
        monkeypatch.setattr(native, "built", {})
        monkeypatch.setattr(native, "cached", lambda: False)
        monkeypatch.setattr("torch.utils.cpp_extension.load_inline", broken)

    return break_build


@pytest.fixture
def use_scripted(monkeypatch, scripted):
    """The CLI's scorers answer from the scripted judge instead of loading a model."""
    from offline_sumscore import SummarizationScorer, SummaryScore

    for cls in (SummarizationScorer, SummaryScore):
        monkeypatch.setattr(cls, "engine", property(lambda self: scripted))
    return scripted


def as_in_a_terminal():
    """A child's preexec_fn: SIGINT as a foreground process gets it. A test run started in the background by a shell
    without job control passes SIGINT down ignored, and Python then never raises KeyboardInterrupt, so Ctrl-C could
    not be tested."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def embedded_tokenizer():
    """The embedded judge's tokenizer and chat template, from its converted folder (no weights loaded)."""
    from transformers import AutoTokenizer

    from offline_sumscore.engine.judge import models_root

    return AutoTokenizer.from_pretrained(str(models_root() / "SmolLM2-135M-Instruct"), local_files_only=True)


def judge_around(tokenizer, model=None, context_length: int = 8192):
    """A Judge of model (None: no model, for rendering and sizing prompts) speaking through tokenizer."""
    from offline_sumscore.engine.judge import Judge

    return Judge(
        model=model,
        tokenizer=tokenizer,
        name="t",
        path="",
        device="cpu",
        dtype="float32",
        identity="t",
        context_length=context_length,
    )
