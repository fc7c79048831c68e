"""--engine vllm where vLLM is not installed: one line, exit 2, naming both ways to get it; `sumscore models` tells a
GPU user the two commands. (The engine itself is tested against our own in tests/vllm/, in vLLM's environment.)"""

import importlib.util

import pytest
from click.testing import CliRunner

from offline_sumscore.cli import main


def test_engine_vllm_without_vllm_is_one_line_and_exit_2(tmp_path):
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed in this environment")
    src = tmp_path / "in.jsonl"
    src.write_text('{"source": "A source.", "summary": "A summary."}\n')
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "out.jsonl"), "--engine", "vllm"])
    assert result.exit_code == 2, result.output
    said = [line for line in result.output.splitlines() if line.strip()]
    assert len(said) == 1 and "pip install 'offline-sumscore[vllm]'" in said[0] and "make vllm-env" in said[0]
    assert not (tmp_path / "out.jsonl").exists()


def test_models_and_help_say_how_to_score_on_vllm():
    models = CliRunner().invoke(main, ["models"])
    assert "pip install 'offline-sumscore[vllm]'" in models.output and "--engine vllm" in models.output
    helped = CliRunner().invoke(main, ["score", "--help"])
    assert "vllm" in helped.output and "offline-sumscore[vllm]" in helped.output
