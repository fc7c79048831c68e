"""The engine's features, counters and timings: what the throughput ladder switches and what it reads back."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EngineFeatures:
    """Each feature of the engine, on by default. The throughput ladder turns them off one at a time to measure
    each, and the engine tests check each against the plain path it replaces; verdicts are the same either way."""

    shared_prefix: bool = True  # requests sharing a long prefix compute it once (a source, a summary)
    forced_tokens: bool = True  # text the grammar fixes goes in without being decoded
    logit_verdicts: bool = True  # a row ends the moment its grammar is complete; P(yes) read off the distribution
    prefix_store: bool = True  # computed prefixes are kept across steps, samples and calls
    continuous: bool = True  # a driver's stream goes straight in (else: one run() call per wave)
    drafts: bool = True  # n-gram drafts checked in the same pass (speculative decoding without a draft model)

    def without(self, *names: str) -> EngineFeatures:
        return replace(self, **{name: False for name in names})


@dataclass
class EngineStats:
    """Token and time counters of one engine, for results and the benchmark."""

    prefill_tokens: int = 0  # prompt tokens run through the model (a shared prefix counted once)
    forced_tokens: int = 0  # tokens the grammar fixed, inserted without being decoded
    decoded_tokens: int = 0  # tokens picked from the model's distribution
    forward_passes: int = 0
    skipped_forwards: int = 0  # rows finished without a forward pass (grammar complete)
    oom_splits: int = 0
    stored_tokens: int = 0  # prompt tokens whose keys and values came from the prefix store, not a forward pass
    draft_tokens: int = 0  # guessed tokens fed after rows' pending tokens (drafts.py)
    accepted_draft_tokens: int = 0  # of those, the ones the judge's own picks agreed with (kept)
    nan_rows: int = 0  # rows failed because the judge's logits came out NaN (a poisoned pass, never a verdict)
    heap_trims: int = 0  # times the host's C heap handed its free memory back (host_heap.py)
    heap_trim_seconds: float = 0.0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Timing:
    """One timed piece of work, handed to the engine's on_timing hook (the profiler's): a forward pass ("step" or
    "likelihood": its rows, widest feed, tokens and attention cells) or the grammar masks of a step ("masks")."""

    kind: str
    seconds: float
    rows: int = 0
    width: int = 0
    tokens: int = 0
    cells: int = 0  # attention cells (query x key) the pass's calls computed, padding included
    needed_cells: int = 0  # the cells its tokens needed
