"""Shared fixtures. Every test runs offline: no hub, whatever the environment says."""
from __future__ import annotations

import json
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest

from offline_sumscore.engine.scripted import ScriptedEngine

SOURCE = ("The city council of Lindford voted on Tuesday to build a new public library on Mill Street. "
          "Construction will begin in March and cost 4 million pounds.")
SUMMARY = "Lindford will build a library on Mill Street for 4 million pounds."


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
    from offline_sumscore.judge import load_judge

    return load_judge()


@pytest.fixture
def use_scripted(monkeypatch, scripted):
    """The CLI's scorers answer from the scripted judge instead of loading a model."""
    from offline_sumscore import SummarizationScorer, SummaryScore

    for cls in (SummarizationScorer, SummaryScore):
        monkeypatch.setattr(cls, "engine", property(lambda self: scripted))
    return scripted


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
