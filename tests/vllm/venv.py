"""Where vLLM's own environment lives, and the skip that names the make target that makes it."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
VLLM_CLI = ROOT / ".venv-vllm" / "bin" / "vllm"
SERVER = "vllm.entrypoints.openai.api_server"  # what `vllm serve` starts
MAKE_IT = "vLLM's environment .venv-vllm is not made here: `make vllm-env` makes it (CI does, before `make test`)"


def vllm_env() -> None:
    if not VLLM_CLI.exists():
        pytest.skip(MAKE_IT)
