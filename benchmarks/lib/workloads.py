"""The ladder's workloads: each config's sizes, the scorer options every generating rung runs with, and the three
input sets (standard: one summary per source; shared: several summaries of each source; bulk: as a bulk run meets
them), read from an agreement file or, without one, the bundled demo rows repeated."""

from __future__ import annotations

import json
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "offline_sumscore" / "examples" / "demo.jsonl"

CONFIGS = {
    # Caps keep the embedded judge's degenerate repetition to a realistic length.
    "cpu": dict(
        samples=6,
        questions=3,
        text_chars=80,
        reason_chars=60,
        source_chars=1200,
        reference_samples=6,
        shared_docs=3,
        per_doc=4,
        shared_reference_samples=4,
    ),
    # Random weights write to every cap, so the caps set the load; they are sized so that the whole ladder fits a
    # single 10-minute device call (15 minutes of GPU a session). Rungs 0 and 1 run on the first 2 samples only:
    # the naive loop decodes every token at batch 1. Rates are per sample, so rungs compare across sample counts.
    "gpu": dict(
        samples=48,
        questions=6,
        text_chars=60,
        reason_chars=40,
        source_chars=3000,
        reference_samples=2,
        shared_docs=8,
        per_doc=6,
        shared_reference_samples=2,
    ),
}


def rungs_asked(args) -> list[str]:
    """Every rung the command line asks for on some workload run (the bulk rungs only where --bulk runs one)."""
    asked = f"{args.rungs},{args.shared_rungs}" + (f",{args.bulk_rungs}" if args.bulk else "")
    return [r for r in asked.split(",") if r]


def ladder_caps(cfg: dict) -> dict:
    """The scorer options every generating rung runs with (the ladder's workload): the summary's sentences as
    claims, questions drawn from the source, yes-no verdicts, each bounded by the config."""
    return dict(
        claims="sentences",
        coverage="questions",
        verdicts="yes-no",
        max_questions=cfg["questions"],
        max_text_chars=cfg["text_chars"],
        max_reason_chars=cfg["reason_chars"],
    )


def frozen_inputs(path: Path, n: int, source_chars: int) -> list[dict]:
    """The first n items of a JSONL file with source/summary, one summary per document, sources cut at a sentence
    end near source_chars (so the CPU run fits its time box). Without a file (path None), or past its end, the
    bundled demo set, repeated: the table's heading says which (inputs_note)."""
    rows: list[dict] = []
    if path is not None:
        seen = set()
        for line in path.open():
            item = json.loads(line)
            doc = item["id"].split(":")[1] if ":" in item["id"] else item["id"]
            if doc in seen:
                continue
            seen.add(doc)
            source = item["source"]
            if len(source) > source_chars:
                cut = source.rfind(". ", 0, source_chars)
                source = source[: cut + 1] if cut > 0 else source[:source_chars]
            rows.append({"id": item["id"], "source": source, "summary": item["summary"]})
            if len(rows) == n:
                break
    if len(rows) < n:
        base = [json.loads(line) for line in DEMO.open()]
        while len(rows) < n:
            item = dict(base[len(rows) % len(base)])
            item["id"] = f"{item['id']}-{len(rows)}"
            rows.append(item)
    return rows


def inputs_note(path: Path | None) -> str:
    """What the ladder ran on, for its table and JSON: a ladder on the demo rows measures three short texts again and
    again, and must say so."""
    if path is None:
        return "the three bundled demo rows, repeated (no --data given: not comparable with a ladder on real data)"
    return str(path)


def shared_inputs(path: Path, docs: int, per_doc: int, source_chars: int) -> list[dict]:
    """per_doc summaries of each of the first docs documents with that many (ids "system:doc"), sources cut as in
    frozen_inputs. Without a file, the bundled demo set, each source paired with every demo summary."""
    by_doc: dict[str, list[dict]] = {}
    if path is not None:
        for line in path.open():
            item = json.loads(line)
            doc = item["id"].split(":")[1] if ":" in item["id"] else item["id"]
            by_doc.setdefault(doc, []).append(item)
    chosen = [items[:per_doc] for items in by_doc.values() if len(items) >= per_doc][:docs]
    if len(chosen) < docs:
        base = [json.loads(line) for line in DEMO.open()]
        chosen = [
            [dict(b, source=base[d % len(base)]["source"], id=f"{b['id']}:{d}") for b in (base * per_doc)[:per_doc]]
            for d in range(docs)
        ]
    rows = []
    for items in chosen:
        source = items[0]["source"]
        if len(source) > source_chars:
            cut = source.rfind(". ", 0, source_chars)
            source = source[: cut + 1] if cut > 0 else source[:source_chars]
        rows.extend({"id": item["id"], "source": source, "summary": item["summary"]} for item in items)
    return rows


def bulk_inputs(path: Path, n: int, source_chars: int) -> list[dict]:
    """n samples as a bulk run meets them: every document's first summary, then every document's second, and so on
    (SummEval dev: 58 documents, 12 summaries each), sources cut as in frozen_inputs."""
    if not n:
        return []
    by_doc: dict[str, list[dict]] = {}
    if path is not None:
        for line in path.open():
            item = json.loads(line)
            by_doc.setdefault(item["id"].split(":")[1] if ":" in item["id"] else item["id"], []).append(item)
    rows = []
    for depth in range(max((len(v) for v in by_doc.values()), default=0)):
        rows += [items[depth] for items in by_doc.values() if depth < len(items)]
    rows = rows[:n] or frozen_inputs(path, n, source_chars)
    for row in rows:
        if len(row["source"]) > source_chars:
            cut = row["source"].rfind(". ", 0, source_chars)
            row["source"] = row["source"][: cut + 1] if cut > 0 else row["source"][:source_chars]
    return [{"id": r["id"], "source": r["source"], "summary": r["summary"]} for r in rows]
