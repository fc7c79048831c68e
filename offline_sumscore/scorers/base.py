"""What both scorers share: engine resolution, the wave driver, score/ascore/score_many.

A scorer writes, per sample, a plan: a generator that yields a list of StageRequests (one wave) and gets back
their StageResults, until it returns the finished result. The driver advances every sample's plan together,
so each wave goes to the engine as one list across all samples: that is how batching crosses samples
without the scorer knowing about batches, or the engine about metrics.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any

from offline_sumscore.core.errors import Failure, JudgeOutputError, UsageError, check_count
from offline_sumscore.core.results import FailedRow
from offline_sumscore.core.samples import Sample, as_sample
from offline_sumscore.core.source_pieces import fit_pieces
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import Engine
from offline_sumscore.engine.build import EngineSpec, build_engine, with_settings
from offline_sumscore.engine.retry import RetryingEngine
from offline_sumscore.engine.stage_cache import CachedEngine, StageCache

Plan = Generator[list[StageRequest], list[StageResult], Any]


def soft_score(probs: list[float | None]) -> float | None:
    """Mean P(yes) over verdicts, where the engine read them; None when none was read (e.g. a scripted judge)."""
    known = [p for p in probs if p is not None]
    return sum(known) / len(known) if len(known) == len(probs) and known else None


def first_prob(result: StageResult) -> float | None:
    return result.choice_probs[0] if result.choice_probs else None


class PlanFeed:
    """Plans as a stream of requests (engine.Feed): each plan's next wave is ready the moment its own answers are
    in, and a new plan starts whenever fewer than in_flight are running, in the order given. on_done(i, outcome)
    gets each plan's result (or its JudgeOutputError) as it finishes."""

    def __init__(self, plans: Iterable[Plan], on_done: Callable[[int, Any], None], in_flight: int):
        self.plans, self.on_done, self.in_flight = iter(enumerate(plans)), on_done, max(1, in_flight)
        self.running: dict[int, list] = {}  # plan index -> [plan, its wave's results, answers still missing]
        self.ready: list[tuple[int, StageRequest]] = []
        self.owner: dict[int, tuple[int, int]] = {}  # ticket -> (plan index, slot in its wave)
        self.tickets = 0
        self.exhausted = False

    def take(self) -> list[tuple[int, StageRequest]]:
        while not self.exhausted and len(self.running) < self.in_flight:
            try:
                i, plan = next(self.plans)
            except StopIteration:
                self.exhausted = True
                break
            self._advance(i, plan, None)
        ready, self.ready = self.ready, []
        return ready

    def give(self, ticket: int, result: StageResult) -> None:
        i, slot = self.owner.pop(ticket)
        entry = self.running[i]
        entry[1][slot] = result
        entry[2] -= 1
        if entry[2] == 0:
            self._advance(i, entry[0], entry[1])

    def _advance(self, i: int, plan: Plan, sent: list[StageResult] | None) -> None:
        while True:
            try:
                wave = plan.send(sent)  # type: ignore[arg-type]
            except StopIteration as done:
                self.running.pop(i, None)
                return self.on_done(i, done.value)
            except JudgeOutputError as exc:
                self.running.pop(i, None)
                return self.on_done(i, exc)
            if wave:
                break
            sent = []  # an empty wave is answered at once
        self.running[i] = [plan, [None] * len(wave), len(wave)]
        for slot, request in enumerate(wave):
            self.owner[self.tickets] = (i, slot)
            self.ready.append((self.tickets, request))
            self.tickets += 1


def require(result: StageResult, stages: dict[str, dict], key: str | None = None) -> Any:
    """The stage's parsed value, or a loud JudgeOutputError carrying the raw output. The audit is stored under
    key (default: the stage name; per-question stages use "coverage.0", "coverage.1", ...)."""
    stages[key or result.request.stage] = result.audit()
    if not result.ok:
        raise JudgeOutputError(
            result.error or "no output",
            stage=result.request.stage,
            raw_output=result.raw_output,
            sample_id=result.request.sample_id,
            kind=result.error_kind or Failure.ERROR,
            stages=stages,
        )
    return result.value


def refuse(result: StageResult, stages: dict[str, dict], key: str, why: str) -> JudgeOutputError:
    """The error for a stage whose output parsed but is no answer (Failure.DEGENERATE): its audit under key says why,
    beside the raw output, and the row fails at that stage instead of scoring on it. Raise what it returns."""
    stages[key] = dict(stages.get(key) or result.audit(), error=why, error_kind=Failure.DEGENERATE)
    return JudgeOutputError(
        why,
        stage=result.request.stage,
        raw_output=result.raw_output,
        sample_id=result.request.sample_id,
        kind=Failure.DEGENERATE,
        stages=stages,
    )


def _progress_bar(total: int, metric: str):
    from tqdm.auto import tqdm  # transformers' own dependency: always installed beside it

    return tqdm(total=total, desc=f"scoring ({metric})", unit="sample", file=sys.stderr)


class ScorerBase:
    metric = ""

    def __init__(
        self,
        model: Any = None,
        *,
        engine: Engine | EngineSpec | None = None,
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int | None = None,
        token_budget: int | None = None,
        cache: str | os.PathLike | StageCache | None = None,
        device_share: float = 1.0,
    ):
        for name, value in (("batch_size", batch_size), ("token_budget", token_budget)):
            if value is not None:
                check_count(name, value)
        # The settings given one by one, or in a spec: every way in builds the same value (which checks them), whose
        # auto build.resolve decides (an engine given is used as it is).
        self.spec = with_settings(
            engine if isinstance(engine, EngineSpec) else None,
            model=model,
            device=device,
            dtype=dtype,
            batch_size=batch_size,
            token_budget=token_budget,
            device_share=device_share,
        )
        self._engine = engine if isinstance(engine, Engine) else None
        self._stacked_engine = None
        self.notify: Callable[[str], None] | None = None  # where to say that a row's source goes in pieces
        self.cache = cache if cache is None or isinstance(cache, StageCache) else StageCache(cache)

    def load(self) -> Engine:
        """Load the judge now (constructing a scorer loads nothing; the first score would)."""
        return self.engine

    @property
    def engine(self) -> Engine:
        """The engine, built on first use: constructing a scorer loads nothing."""
        if self._engine is None:
            self._engine = build_engine(self.spec)
        return self._engine

    @property
    def stacked_engine(self) -> Engine:
        """What the plans' requests go to: the engine, behind one retry of failed stages, behind the stage cache
        when there is one (so a retried success is cached under the request as first asked)."""
        if self._stacked_engine is None:
            stacked: Any = RetryingEngine(self.engine)
            self._stacked_engine = CachedEngine(stacked, self.cache) if self.cache is not None else stacked
        return self._stacked_engine

    def source_pieces(self, source: str, build: Callable[[str], Sequence[StageRequest]]) -> list[str]:
        """The source whole, or split on sentence boundaries into the fewest pieces such that every request that
        carries a piece (build(piece)) fits the judge's context. Never truncated."""
        spare = self.stacked_engine.spare_tokens

        def least(text: str) -> int | None:
            found = [s for s in (spare(r) for r in build(text)) if s is not None]
            return min(found) if found else None

        pieces = fit_pieces(source, least)
        if len(pieces) > 1 and self.notify:
            first = build(pieces[0])[0]
            self.notify(
                f"row {first.sample_id}: its source ({len(source):,} characters) is longer than the judge's "
                f"context; judged in {len(pieces)} pieces"
            )
        return pieces

    def plan(self, sample: Sample) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def design(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def needs_likelihoods(self) -> bool:
        """Whether the design in use reads the judge's log-probabilities of a given text (likelihood verdicts, or
        SummaryScore's likelihood answers)."""
        return "likelihood" in (self.design.get("verdicts"), self.design.get("answers"))

    def score_many(self, items: Iterable[Any], *, on_error: str = "raise", progress: bool = False) -> list[Any]:
        """Score many samples, batching each stage across all of them.

        items: Samples, (source, summary) pairs, or dicts with source, summary (and id, questions).
        on_error: "raise" raises the first JudgeOutputError; "return" puts a FailedRow in its place.
        progress: a progress bar on stderr, a tick per finished sample (as `sumscore score` shows).
        """
        if on_error not in ("raise", "return"):
            raise UsageError(f"on_error must be 'raise' or 'return'. Given: {on_error}")
        samples = [as_sample(item, i) for i, item in enumerate(items)]
        final: list[Any] = [None] * len(samples)
        bar = _progress_bar(len(samples), self.metric) if progress else None

        def keep(i: int, outcome: Any) -> None:
            final[i] = outcome
            if bar is not None:
                bar.update(1)

        try:
            self.stream(samples, keep, in_flight=len(samples))
        finally:
            if bar is not None:
                bar.close()
        for outcome in final:
            if on_error == "raise" and isinstance(outcome, FailedRow):
                raise outcome.exception
        return final

    def stream(
        self, samples: Sequence[Sample], on_done: Callable[[int, Any], None], *, in_flight: int | None = None
    ) -> None:
        """Score samples as one stream through the engine: at most in_flight at a time (None: as many as the engine
        asks for, Engine.in_flight), each started the moment another finishes, in order. on_done(i, result) gets each
        result (a FailedRow where the judge failed) the moment it is final, which is not in input order."""
        stacked = self.stacked_engine
        if self.needs_likelihoods() and not stacked.gives_likelihoods():
            # Said once before anything is asked, rather than as a failed stage on every row.
            described = stacked.describe()
            raise UsageError(
                f"the judge at {described.get('url', described.get('engine'))} cannot give likelihood verdicts: a "
                f"served judge returns no log-probabilities of a given text. Score with --verdicts yes-no "
                f"(SummaryScore: --answers questions)."
            )
        in_flight = in_flight or stacked.in_flight()

        def finish(i: int, outcome: Any) -> None:
            if isinstance(outcome, JudgeOutputError):
                outcome = FailedRow.judge_failed(outcome, id=samples[i].id, metric=self.metric)
            else:
                # The row records the judge and, under it, the engine settings that produced the verdicts, as they
                # are when the row is final (a served judge may have fallen back to another mode on the way).
                described = stacked.describe()
                outcome.judge = dict(
                    described.get("judge", {}), engine={k: v for k, v in described.items() if k != "judge"}
                )
            on_done(i, outcome)

        stacked.stream(PlanFeed((self.plan(s) for s in samples), finish, in_flight))

    def _score_one(self, sample: Sample) -> Any:
        return self.score_many([sample])[0]

    async def ascore(self, *args, **kwargs) -> Any:
        """score() for async callers (DeepEval's a_measure, Ragas's ascore), with the same arguments: the model runs
        in a worker thread, and the engine serialises calls on one model."""
        return await asyncio.to_thread(self.score, *args, **kwargs)
