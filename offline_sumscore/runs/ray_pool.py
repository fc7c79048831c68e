"""Scoring on Ray: a pool of actors, each holding one loaded judge, scoring the same chunks with the same score_many
that one machine runs. `pip install 'offline-sumscore[ray]'`.

How the single-machine guarantees carry over:
- Same batches, same verdicts: the driver cuts the input into the same fixed chunks as `sumscore score` and sends
  each chunk whole to one actor, which scores it in one score_many call, so every chunk batches exactly as it
  would on one machine.
- Never a lost or duplicated row: only the driver writes OUTPUT, appending a chunk's rows when its result arrives
  (offline_sumscore.runs.bulk.run_bulk), and rewrites OUTPUT in input order at the end; --resume skips finished chunks.
- A killed actor: Ray restarts it (max_restarts) and retries the chunk it held (max_task_retries); the chunk's rows
  arrive once, from the retry.
- The stage cache: each actor opens the SQLite file at the configured path. Actors on one machine, or on nodes
  that share that path over a filesystem with working locks, share it; on nodes without a shared filesystem each
  node keeps its own cache at that path (nothing is shared between nodes; results are the same, only reuse is lost).
  SQLite over NFS without working locks is not safe: give such nodes a local --cache path.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from offline_sumscore.core.errors import UsageError
from offline_sumscore.core.samples import Sample
from offline_sumscore.runs.bulk import ChunkScorer, chunk_rows, score_samples, score_table


def require_ray():
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError:
        raise UsageError("--engine ray needs Ray: pip install 'offline-sumscore[ray]' (that is, ray[data])") from None
    import ray

    return ray


def build_scorer(config: dict):
    """An actor's scorer: always on our engine (a pool is our engines side by side; vLLM has its own pool)."""
    from offline_sumscore.engine.build import EngineSpec
    from offline_sumscore.scorers import METRICS

    cls = METRICS[config["metric"]]
    share = config.get("device_share")  # a fraction of a GPU per actor: its engine fills only that much of it
    return cls(
        config.get("model"),
        cache=config.get("cache"),
        engine=EngineSpec(kind="local"),
        **config.get("options", {}),
        **({"device_share": share} if share else {}),
    )


class ChunkActor:
    """One judge, loaded once in __init__; each call scores whole chunks (their Samples, as JSON)."""

    def __init__(self, config: dict):
        import torch

        threads = config.get("threads_per_judge")
        if threads:
            torch.set_num_threads(threads)  # an actor on a shared CPU must not take every core
        self.scorer = build_scorer(config)
        self.scorer.load()  # now, not on the first chunk

    def score_chunks(self, batch: dict) -> dict:
        """{"chunk": [k, ...], "samples": [JSON, ...]} -> {"chunk": [k, ...], "results": [JSON rows, ...]}."""
        chunks, results = [], []
        for k, payload in zip(batch["chunk"], batch["samples"]):
            samples = [
                Sample(**dict(d, **{f: tuple(d[f]) for f in ("questions", "key_facts") if d.get(f) is not None}))
                for d in json.loads(payload)
            ]
            chunks.append(int(k))
            results.append(json.dumps(score_samples(self.scorer, samples), ensure_ascii=False))
        return {"chunk": chunks, "results": results}


@dataclass(frozen=True)
class RayPool:
    """How `sumscore score --engine ray` scores: num_judges actors, each with its own loaded judge."""

    num_judges: int = 1
    address: str | None = None  # auto, ray://HOST:PORT, ...; None starts a local Ray with this machine's GPUs or CPUs
    gpus_per_judge: float | None = None  # None: 1 where this machine has a CUDA device, else 0
    cpus_per_judge: float = 1
    max_retries: int = 3  # restarts of a killed actor, and retries of the chunk it held

    def chunk_scorer(self, metric: str, model: Any, options: dict, cache: Any) -> ChunkScorer:
        """A bulk.run_bulk chunk scorer whose actors build the scorer that metric, model, options and cache name."""
        from offline_sumscore.engine.judge import resolve_model_path

        config = {
            "metric": metric,
            "model": str(resolve_model_path(model)) if model else None,
            "options": options,
            "cache": str(getattr(cache, "path", cache)) if cache else None,
        }
        gpus = self.gpus_per_judge
        if gpus is None:
            import torch

            gpus = 1.0 if torch.cuda.is_available() else 0.0
        return score_chunks_on_ray(
            config,
            num_judges=self.num_judges,
            address=self.address,
            gpus_per_judge=gpus,
            cpus_per_judge=self.cpus_per_judge,
            max_retries=self.max_retries,
        )


def _share(gpus_per_judge: float) -> float | None:
    """The share of one GPU an actor's engine may fill: actors with a fraction of a GPU each share it."""
    return gpus_per_judge if 0 < gpus_per_judge < 1 else None


def score_chunks_on_ray(
    config: dict,
    *,
    num_judges: int = 1,
    gpus_per_judge: float = 0,
    cpus_per_judge: float = 1,
    address: str | None = None,
    max_retries: int = 3,
) -> ChunkScorer:
    """A bulk.run_bulk chunk scorer that sends every chunk to a pool of num_judges ChunkActors."""
    ray = require_ray()

    def run(todo: list[tuple[int, list]]):
        if not ray.is_initialized():
            # Without an address: a local Ray with this machine's GPUs (or CPUs).
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=False,
                **({} if address else {"num_cpus": max(os.cpu_count() or 1, int(num_judges * cpus_per_judge))}),
            )
        by_k = dict(todo)
        payloads = []
        for k, chunk in todo:
            samples = [dict(asdict(item), columns=None) for item in chunk if isinstance(item, Sample)]
            if samples:
                payloads.append({"chunk": [k], "samples": [json.dumps(samples, ensure_ascii=False)]})
            else:  # a chunk of bad rows only: nothing for a judge to do
                yield k, chunk_rows(chunk, [], config["metric"])
        if not payloads:
            return
        # Plain actors, not a Ray Data pipeline: the restart bounds are named options of an actor there
        # (map_batches takes them only as ray_remote_args, deprecated in Ray 2.60 with nothing to replace them, and
        # Ray Data's own default restarts a killed actor and retries its chunk without end).
        judge = ray.remote(ChunkActor).options(
            num_gpus=gpus_per_judge or 0,
            num_cpus=cpus_per_judge,
            max_restarts=max_retries,
            max_task_retries=max_retries,
        )
        actor_config = dict(config, threads_per_judge=max(1, int(cpus_per_judge)), device_share=_share(gpus_per_judge))
        from ray.util import ActorPool

        pool = ActorPool([judge.remote(actor_config) for _ in range(min(num_judges, len(payloads)))])
        for out in pool.map_unordered(lambda actor, payload: actor.score_chunks.remote(payload), payloads):
            for k, results in zip(out["chunk"], out["results"]):
                yield int(k), chunk_rows(by_k[int(k)], json.loads(results), config["metric"])

    return run


def score_dataset(
    dataset: Any,
    scorer_config: dict,
    *,
    num_judges: int = 1,
    gpus_per_judge: float = 0,
    cpus_per_judge: float = 1,
    batch_size: int = 32,
    source: str = "source",
    summary: str = "summary",
    id: str = "id",
):
    """A Ray dataset of result rows (as `sumscore score` writes them, with `stages` etc. as JSON strings) from a Ray
    dataset of rows with source, summary (and id) columns. Each actor scores `batch_size` rows per score_many call.

    scorer_config: {"metric": "two-axis" | "summary-score", "model": path or None, "options": {...}, "cache": path}.
    """
    ray = require_ray()

    class _RowsActor(ChunkActor):
        def __call__(self, batch: dict) -> dict:
            n = len(batch[source])
            ids = [str(batch[id][i]) if id in batch else str(i) for i in range(n)]
            # checked as a local run checks them: a bad row fails alone, never reaches the judge
            rows = score_table(
                self.scorer, ids, batch[source], batch[summary], source_field=source, summary_field=summary
            )
            # every batch has an error column, so blocks with and without a failed row share one schema
            columns = sorted({key for r in rows for key in r} | {"error"})
            return {
                c: [
                    json.dumps(r.get(c), ensure_ascii=False) if isinstance(r.get(c), (dict, list)) else r.get(c)
                    for r in rows
                ]
                for c in columns
            }

    config = dict(scorer_config, device_share=_share(gpus_per_judge))
    return dataset.map_batches(
        _RowsActor,
        fn_constructor_kwargs={"config": config},
        batch_size=batch_size,
        compute=ray.data.ActorPoolStrategy(size=num_judges),
        num_gpus=gpus_per_judge or None,
        num_cpus=cpus_per_judge,
    )
