"""What both scorers share: engine resolution, the wave driver, score/ascore/score_many.

A scorer writes, per sample, a plan: a generator that yields a list of StageRequests (one wave) and gets back
their StageResults, until it returns the finished result. The driver advances every sample's plan together,
so each wave goes to the engine as one list across all samples: that is how batching crosses samples
without the scorer knowing about batches, or the engine about metrics.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any, Callable, Generator, Iterable, Sequence

from ..chunking import fit_pieces
from ..engine import Engine
from ..engine.retry import RetryingEngine
from ..errors import JudgeOutputError, UsageError
from ..results import FailedRow
from ..samples import Sample, as_sample
from ..stage_cache import CachedEngine, StageCache
from ..stages import StageRequest, StageResult

Plan = Generator[list[StageRequest], list[StageResult], Any]


def soft_score(probs: list[float | None]) -> float | None:
    """Mean P(yes) over verdicts, where the engine read them; None when none was read (e.g. a scripted judge)."""
    known = [p for p in probs if p is not None]
    return sum(known) / len(known) if len(known) == len(probs) and known else None


def first_prob(result: StageResult) -> float | None:
    return result.choice_probs[0] if result.choice_probs else None


def drive(engine: Engine, plans: Sequence[Plan]) -> list[Any]:
    """Run every plan to completion, one engine call per wave. A plan that raises JudgeOutputError ends as that
    exception in its slot; the other plans go on."""
    outcomes: list[Any] = [None] * len(plans)
    waiting: dict[int, list[StageRequest]] = {}

    def advance(i: int, sent: list[StageResult] | None) -> None:
        try:
            waiting[i] = plans[i].send(sent)  # type: ignore[arg-type]
        except StopIteration as done:
            outcomes[i] = done.value
        except JudgeOutputError as exc:
            outcomes[i] = exc

    for i in range(len(plans)):
        advance(i, None)
    while waiting:
        order = list(waiting.items())
        waiting.clear()
        flat = [req for _, reqs in order for req in reqs]
        results = engine.run(flat) if flat else []
        at = 0
        for i, reqs in order:
            advance(i, results[at:at + len(reqs)])
            at += len(reqs)
    return outcomes


def check_count(name: str, value: Any, most: int) -> None:
    """An integer option between 1 and a sane upper bound (a mistyped 100000 is refused, not run for days)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
        raise UsageError(f"{name} must be an integer from 1 to {most}. Given: {value}")


def require(result: StageResult, stages: dict[str, dict], key: str | None = None) -> Any:
    """The stage's parsed value, or a loud JudgeOutputError carrying the raw output. The audit is stored under
    key (default: the stage name; per-question stages use "coverage.0", "coverage.1", ...)."""
    stages[key or result.request.stage] = result.audit()
    if not result.ok:
        exc = JudgeOutputError(result.error or "no output", stage=result.request.stage,
                               raw_output=result.raw_output, sample_id=result.request.sample_id,
                               kind=result.error_kind or "error")
        exc.stages = dict(stages)  # every stage run so far, the failed one included, for the row's audit
        raise exc
    return result.value


class ScorerBase:
    metric = ""

    def __init__(self, model: Any = None, *, engine: Engine | None = None, device: str = "auto",
                 dtype: str = "auto", batch_size: int | None = None, token_budget: int | None = None,
                 cache: str | os.PathLike | StageCache | None = None):
        for name, value in (("batch_size", batch_size), ("token_budget", token_budget)):
            if value is not None and value < 1:
                raise UsageError(f"{name} must be >= 1. Given: {value}")
        self._model, self._engine, self._runner = model, engine, None
        self.notify: Callable[[str], None] | None = None  # where to say that a row's source goes in pieces
        self.device, self.dtype, self.batch_size, self.token_budget = device, dtype, batch_size, token_budget
        self.cache = cache if cache is None or isinstance(cache, StageCache) else StageCache(cache)

    @property
    def engine(self) -> Engine:
        """The engine, built on first use: constructing a scorer loads nothing."""
        if self._engine is None:
            from ..engine.runner import TransformersEngine
            from ..judge import Judge, load_judge

            judge = self._model if isinstance(self._model, Judge) else load_judge(
                self._model, device=self.device, dtype=self.dtype)
            self._engine = TransformersEngine(judge, batch_size=self.batch_size, token_budget=self.token_budget)
        return self._engine

    @property
    def runner(self) -> Engine:
        """What the plans' requests go to: the engine, behind one retry of failed stages, behind the stage cache
        when there is one (so a retried success is cached under the request as first asked)."""
        if self._runner is None:
            runner: Any = RetryingEngine(self.engine)
            self._runner = CachedEngine(runner, self.cache) if self.cache is not None else runner
        return self._runner

    def source_pieces(self, source: str, build: Callable[[str], Sequence[StageRequest]]) -> list[str]:
        """The source whole, or split on sentence boundaries into the fewest pieces such that every request that
        carries a piece (build(piece)) fits the judge's context. Never truncated."""
        spare = getattr(self.runner, "spare_tokens", None)
        if spare is None:
            return [source]

        def least(text: str) -> int | None:
            found = [s for s in (spare(r) for r in build(text)) if s is not None]
            return min(found) if found else None

        pieces = fit_pieces(source, least)
        if len(pieces) > 1 and self.notify:
            first = build(pieces[0])[0]
            self.notify(f"row {first.sample_id}: its source ({len(source):,} characters) is longer than the judge's "
                        f"context; judged in {len(pieces)} pieces")
        return pieces

    def plan(self, sample: Sample) -> Plan:  # pragma: no cover - abstract
        raise NotImplementedError

    def score_many(self, items: Iterable[Any], *, on_error: str = "raise") -> list[Any]:
        """Score many samples, batching each stage across all of them.

        items: Samples, (source, summary) pairs, or dicts with source, summary (and id, questions).
        on_error: "raise" raises the first JudgeOutputError; "return" puts a FailedRow in its place.
        """
        if on_error not in ("raise", "return"):
            raise UsageError(f"on_error must be 'raise' or 'return'. Given: {on_error}")
        samples = [as_sample(item, i) for i, item in enumerate(items)]
        runner = self.runner
        outcomes = drive(runner, [self.plan(s) for s in samples])
        described = runner.describe()
        # The row records the judge and, under it, the engine settings that produced the verdicts.
        judge = dict(described.get("judge", {}), engine={k: v for k, v in described.items() if k != "judge"})
        final = []
        for sample, outcome in zip(samples, outcomes):
            if isinstance(outcome, JudgeOutputError):
                if on_error == "raise":
                    raise outcome
                outcome = FailedRow(id=sample.id, metric=self.metric, stages=getattr(outcome, "stages", {}),
                                    error={"stage": outcome.stage, "cause": f"{outcome.stage}:{outcome.kind}",
                                           "message": str(outcome), "raw_output": outcome.raw_output})
            else:
                outcome.judge = judge
            final.append(outcome)
        return final

    def score_file(self, input_path: str | os.PathLike, output_path: str | os.PathLike, *, resume: bool = False,
                   chunk_size: int | None = None, source_field: str = "source", summary_field: str = "summary",
                   id_field: str = "id") -> list[dict]:
        """Score a JSONL, CSV or Parquet file, a datasets save_to_disk directory or a folder of shards into a JSONL,
        Parquet or CSV file, as `sumscore score` does (bad rows fail alone; resumable). Returns the rows."""
        from ..bulk import DEFAULT_CHUNK_SIZE, run_bulk
        from ..formats import output_kind, write_rows
        from ..samples import read_rows

        items = list(read_rows(input_path, source_field=source_field, summary_field=summary_field,
                               id_field=id_field))
        record = str(output_path) if output_kind(output_path) == ".jsonl" else f"{output_path}.rows.jsonl"
        report = run_bulk(items, self, record, resume=resume, chunk_size=chunk_size or DEFAULT_CHUNK_SIZE)
        if record != str(output_path):
            write_rows(report.rows, output_path)
        return report.rows

    def _score_one(self, sample: Sample) -> Any:
        return self.score_many([sample])[0]

    async def _ascore_one(self, sample: Sample) -> Any:
        # The model runs in a worker thread; the engine serialises generate calls on one model.
        return await asyncio.to_thread(self._score_one, sample)
