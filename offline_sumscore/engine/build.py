"""The one place an engine is chosen and made: the local engine on a loaded (or loadable) judge, vLLM's engine on a
judge it loads itself, or a judge served on this machine behind an OpenAI-compatible URL."""

from __future__ import annotations

from typing import Any

from offline_sumscore.core.errors import UsageError
from offline_sumscore.engine import Engine

LOCAL = "local"  # our engine's runtime, as rows record it (judge.runtime); the stage cache keys it as it always did


def choose_engine(kind: str, model=None, device: str | None = None) -> tuple[str, str]:
    """(the engine to run: local or vllm, the line that says so and why). auto: ours on a CPU, where it is the engine
    measured (docs/performance.md); on a CUDA device vLLM where it is installed, the GPU engine proven by its own
    project, since ours has not been measured on a GPU yet; ours where vLLM is absent or cannot load the model (a
    .gguf file). When a GPU check shows ours ahead of vLLM there, this rule changes."""
    if kind != "auto":
        return kind, f"{kind} (asked for with --engine {kind})"
    import importlib.util

    import torch

    if (device or "auto") == "cpu" or not torch.cuda.is_available():
        return LOCAL, "local (auto: no CUDA device; on a CPU ours is the engine measured, ahead of vLLM's CPU build)"
    from offline_sumscore.engine.judge import judge_reference

    if judge_reference(model).endswith(".gguf"):
        return LOCAL, "local (auto: a CUDA device, but vLLM here loads model directories, not a .gguf file)"
    if importlib.util.find_spec("vllm") is None:
        return LOCAL, (
            "local (auto: a CUDA device and no vLLM installed; ours has not been measured on a GPU yet: "
            "pip install 'offline-sumscore[vllm]' for the GPU engine proven by its own project)"
        )
    return "vllm", (
        "vllm (auto: a CUDA device and vLLM installed: the GPU engine proven by its own project, where ours has not "
        "been measured yet; --engine local for ours)"
    )


def local_engine(
    model: Any = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    batch_size: int | None = None,
    token_budget: int | None = None,
    device_share: float = 1.0,
) -> Engine:
    """TransformersEngine on model: a loaded Judge, a path to a model directory or .gguf file, a preset name, or
    None for the default judge (loaded now)."""
    from offline_sumscore.engine.judge import Judge, load_judge
    from offline_sumscore.engine.local import TransformersEngine

    judge = model if isinstance(model, Judge) else load_judge(model, device=device, dtype=dtype)
    return TransformersEngine(judge, batch_size=batch_size, token_budget=token_budget, device_share=device_share)


def served_engine(
    url: str, model: str | None, *, concurrency: int = 4, timeout: float = 120.0, api_key: str | None = None
) -> Engine:
    """A judge served elsewhere on this machine (vLLM, llama.cpp server, Ollama, transformers serve). api_key goes
    to the server as a bearer token and nowhere else (no row, report or log holds it)."""
    from offline_sumscore.engine.openai_compatible import ServedEngine

    if not model:
        raise UsageError("--judge-url needs --judge-model (the name the server serves the model as)")
    return ServedEngine(url, model, concurrency=concurrency, timeout=timeout, api_key=api_key)


def vllm_engine(model: Any = None, *, dtype: str = "auto", enforce_eager: bool | None = None) -> Engine:
    """VLLMEngine on model (a model directory or preset; None: the default judge): vLLM loads the weights itself.
    On a CPU it runs eagerly unless told otherwise: vLLM's compile of a model takes minutes on a few cores, once per
    model (cached), and a judge is usually loaded for one run."""
    from offline_sumscore.engine.vllm_engine import VLLMEngine  # it says how to install vLLM where it is absent

    if enforce_eager is None:
        import torch

        enforce_eager = None if torch.cuda.is_available() else True
    return VLLMEngine(model, dtype=dtype, enforce_eager=enforce_eager)
