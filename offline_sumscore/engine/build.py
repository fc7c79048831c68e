"""The one place an engine is chosen and made. Every way in (the CLI's flags, score_file, a scorer, load_judge, the
benchmarks) says what it wants as an EngineSpec, a plain value; `resolve` turns its `auto` into an engine kind, once,
for all of them, and `build_engine` makes it: the local engine on a loaded (or loadable) judge, vLLM's engine on a
judge it loads itself, or a judge served on this machine behind an OpenAI-compatible URL. A pool of Ray actors is
not one engine: score_file hands it the spec's pool settings, and each actor builds a local engine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from offline_sumscore.core.errors import UsageError
from offline_sumscore.engine import Engine

LOCAL = "local"  # our engine's runtime, as rows record it (judge.runtime); the stage cache keys it as it always did
KINDS = ("auto", LOCAL, "vllm", "served", "ray")


@dataclass(frozen=True)
class EngineSpec:
    """Which engine answers a scorer's requests, and with what settings. Fields that do not apply to the kind are
    left at their defaults (a served judge has no dtype here; a local one no URL)."""

    kind: str = "auto"  # auto, local, vllm, served (a URL) or ray (a pool of actors, each a local engine)
    model: Any = None  # a preset name, a model directory, a .gguf file, a loaded Judge; None: the default judge
    device: str = "auto"  # local: auto, cpu, cuda, cuda:N
    dtype: str = "auto"  # local and vllm
    batch_size: int | None = None  # local: rows a batch may hold (None: from free memory)
    token_budget: int | None = None  # local: cached tokens a batch may hold (None: from free memory)
    device_share: float = 1.0  # local: the share of the device this engine may fill (Ray actors sharing a GPU)
    url: str | None = None  # served: an OpenAI-compatible base URL
    served_model: str | None = None  # served: the name the server serves the model as
    api_key: str | None = field(default=None, repr=False)  # served: a bearer token, never printed or recorded
    concurrency: int | None = None  # served: requests at once (None: the server's slots where it says, else 4)
    timeout: float = 120.0  # served: seconds a request may take, its retries included
    ray_address: str | None = None  # ray: auto, ray://HOST:PORT; None starts a local Ray
    num_judges: int = 1  # ray: actors, one loaded judge each
    gpus_per_judge: float | None = None  # ray: None is 1 where Ray sees a CUDA device, else 0
    cpus_per_judge: float = 1  # ray
    lab: Any = None  # local: the developer hook's LabSettings (engine/local/lab.py); None: every feature on

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UsageError(f"engine kind must be one of {', '.join(KINDS)}. Given: {self.kind}")
        if self.url and self.kind not in ("auto", "served"):
            raise UsageError(f"--engine {self.kind} runs the judge here; --judge-url asks a server: give one of them")
        if self.kind == "served" and not self.url:
            raise UsageError("a served engine needs --judge-url (an OpenAI-compatible base URL)")
        if self.url and not self.served_model:
            raise UsageError("--judge-url needs --judge-model (the name the server serves the model as)")
        if not 0 < self.device_share <= 1:
            raise UsageError(f"device_share must be in (0, 1]. Given: {self.device_share}")


def with_settings(spec: EngineSpec | None, **given) -> EngineSpec:
    """spec (None: EngineSpec()) with the settings given one by one (model, device, dtype, ...) where they are not
    the defaults; a setting given both ways, with two values, is refused by name."""
    spec, defaults = spec or EngineSpec(), EngineSpec()
    given = {k: v for k, v in given.items() if v is not getattr(defaults, k) and v != getattr(defaults, k)}
    for name, value in given.items():
        held = getattr(spec, name)
        if held is not getattr(defaults, name) and held != getattr(defaults, name) and held is not value:
            raise UsageError(f"{name} is given twice, as {value!r} and in the engine spec as {held!r}: give it once")
    return replace(spec, **given)


def resolve(spec: EngineSpec) -> tuple[EngineSpec, str]:
    """(the spec with its kind decided, the line that says which engine runs and why). auto: a served judge where a
    URL is given; else ours on a CPU, where it is the engine measured (docs/performance.md); on a CUDA device vLLM
    where it is installed, the GPU engine proven by its own project, since ours has not been measured on a GPU yet;
    ours where vLLM is absent or cannot load the model (a .gguf file, a judge already loaded). When a GPU check shows
    ours ahead of vLLM there, this rule changes."""
    if spec.url:  # the CLI's served kind: --judge-url, not --engine
        return replace(spec, kind="served"), f"served: {spec.served_model} at {spec.url}"
    if spec.kind == "vllm":  # refused now, before a row is read, rather than when the judge would load
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            from offline_sumscore.engine.vllm_engine import NOT_INSTALLED

            raise UsageError(NOT_INSTALLED)
    if spec.kind in ("auto", LOCAL):  # the kinds that read a .gguf file in this process
        from offline_sumscore.engine.model_header import refuse_cut_gguf

        refuse_cut_gguf(spec.model)
    if spec.kind != "auto":
        return spec, f"{spec.kind} (asked for with --engine {spec.kind})"
    kind, why = _auto_kind(spec.model, spec.device)
    return replace(spec, kind=kind), why


def _auto_kind(model: Any, device: str | None) -> tuple[str, str]:
    import importlib.util

    import torch

    from offline_sumscore.engine.judge import Judge, judge_reference

    if (device or "auto") == "cpu" or not torch.cuda.is_available():
        return LOCAL, "local (auto: no CUDA device; on a CPU ours is the engine measured, ahead of vLLM's CPU build)"
    if isinstance(model, Judge):
        return LOCAL, "local (auto: a CUDA device, but the judge given is already loaded for our engine)"
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


def build_engine(spec: EngineSpec) -> Engine:
    """The engine the spec names (auto resolved first). A ray spec is refused: a pool is not one engine."""
    spec, _ = resolve(spec)
    if spec.kind == "served":
        return served_engine(
            spec.url, spec.served_model, concurrency=spec.concurrency, timeout=spec.timeout, api_key=spec.api_key
        )
    if spec.kind == "vllm":
        return vllm_engine(spec.model, dtype=spec.dtype)
    if spec.kind == "ray":
        raise UsageError("--engine ray is a pool of actors, each with its own engine: score it with score_file")
    return local_engine(
        spec.model,
        device=spec.device,
        dtype=spec.dtype,
        batch_size=spec.batch_size,
        token_budget=spec.token_budget,
        device_share=spec.device_share,
        lab=spec.lab,
    )


def local_engine(
    model: Any = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    batch_size: int | None = None,
    token_budget: int | None = None,
    device_share: float = 1.0,
    lab: Any = None,
) -> Engine:
    """TransformersEngine on model: a loaded Judge, a path to a model directory or .gguf file, a preset name, or
    None for the default judge (loaded now)."""
    from offline_sumscore.engine.judge import Judge, load_judge
    from offline_sumscore.engine.local import TransformersEngine

    judge = model if isinstance(model, Judge) else load_judge(model, device=device, dtype=dtype)
    return TransformersEngine(
        judge, batch_size=batch_size, token_budget=token_budget, device_share=device_share, lab=lab
    )


def served_engine(
    url: str, model: str, *, concurrency: int | None = None, timeout: float = 120.0, api_key: str | None = None
) -> Engine:
    """A judge served elsewhere on this machine (vLLM, llama.cpp server, Ollama, transformers serve); EngineSpec has
    checked that it names a model. api_key goes to the server as a bearer token and nowhere else (no row, report or
    log holds it)."""
    from offline_sumscore.engine.openai_compatible import ServedEngine

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
