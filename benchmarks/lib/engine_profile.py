"""Where an engine's time goes, the pieces the profile and the research probes share: operator self time summed
into categories, each timed piece of work's phase, and the passes' shapes replayed through the bare decoder (the
bound no scheduling of them can beat)."""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from offline_sumscore.engine.local import Timing

CATEGORIES = [  # first match wins, on the operator's name
    ("matmuls (weights)", ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm", "mkldnn::_linear")),
    (
        "attention",
        ("scaled_dot_product", "aten::_scaled_dot", "aten::softmax", "aten::_softmax", "flash", "pass_attention"),
    ),
    (
        "KV writes and gathers",
        (
            "aten::index_put",
            "aten::_index_put",
            "aten::cat",
            "aten::index",
            "aten::copy_",
            "aten::clone",
            "aten::slice_scatter",
            "aten::index_select",
            "aten::repeat_interleave",
            "aten::zeros",
            "aten::new_zeros",
            "aten::fill_",
        ),
    ),
]


def category(name: str) -> str:
    for label, keys in CATEGORIES:
        if any(k in name for k in keys):
            return label
    return "other operators (norms, activations, rotary, elementwise)"


def operator_seconds(prof) -> dict[str, float]:
    """A profiler's operator self time summed into CATEGORIES, in seconds."""
    spent: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        spent[category(event.key)] += event.self_cpu_time_total / 1e6
    return spent


def phase(t: Timing) -> str:
    """What a timed piece of work was: a step that carries prompts (some row feeds more than 16 tokens), a decoding
    step, a likelihood pass, or a step's grammar masks."""
    return "prompt step" if t.kind == "step" and t.width > 16 else t.kind


def bound_shapes(log: list[dict]) -> list[tuple[int, int]]:
    """The bound's input shapes: a prompt step's tokens spread evenly over its rows (as many tokens, attention within
    each row), a decoding step's tokens as that many one-token rows; likelihood passes left out."""
    shapes = []
    for p in log:
        if p["phase"] == "prompt step":
            shapes.append((p["rows"], -(-p["real"] // p["rows"])))
        elif p["phase"] == "step":
            shapes.append((p["real"], 1))
    return shapes


def replay(decoder, shapes: list[tuple[int, int]], device) -> float:
    """Seconds for the bare decoder to run these input shapes, one pass each, with no cache."""
    started = time.perf_counter()
    for shape in shapes:
        decoder(input_ids=torch.zeros(shape, dtype=torch.long, device=device), use_cache=False)
    return time.perf_counter() - started
