"""The local engine's one developer hook: what the throughput ladder, the profiler and the engine's own tests change,
and no user does. An engine is given these settings when it is made (TransformersEngine(judge, lab=...), or an
EngineSpec's lab); without them it runs the defaults: every feature on, the prefix store at a quarter of the token
budget, the device's default tokens a pass, no timing hook. The features an engine ran under are recorded in every
row it scores (`judge.engine`), so a run made under the hook says so.

    from offline_sumscore.engine.local import EngineFeatures, TransformersEngine
    from offline_sumscore.engine.local.lab import LabSettings

    hook = LabSettings(features=EngineFeatures().without("drafts"), on_timing=timings.append)
    engine = TransformersEngine(judge, lab=hook)  # the ladder's rung without drafts, every pass timed
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from offline_sumscore.engine.local.features import EngineFeatures, Timing


@dataclass(frozen=True)
class LabSettings:
    features: EngineFeatures = field(default_factory=EngineFeatures)  # each feature on unless switched off
    store_tokens: int | None = None  # the prefix store's budget in tokens (None: a quarter of the token budget)
    pass_tokens: int | None = None  # tokens a pass computes at most (None: the device's default, capacity.py)
    on_timing: Callable[[Timing], None] | None = None  # called with every timed pass and mask fill (the profiler)
    attention_kernel: bool = True  # the passes' attention kernel where it applies (attention_kernel.py); else SDPA
    pick_kernel: bool = True  # the picks' kernel where it applies (pick_kernel.py); else torch's operators
