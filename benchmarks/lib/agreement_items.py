"""Recorded agreement data: the JSONL of (document, summary) items with human scores or labels and hosted judges'
outputs that benchmarks/agreement.py measures a judge against, and that users bring of their own (the format is in
benchmarks/README.md). Reading it (every malformed line named), telling its kind, and drawing whole documents.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from offline_sumscore.core.errors import InputError


def read_items(path: Path) -> list[dict]:
    """Every item of an agreement file; a malformed line is an InputError naming the file, line and field."""
    items = []
    with open(path, encoding="utf-8") as fh:
        for line_no, text in enumerate(fh, 1):
            if not text.strip():
                continue
            try:
                item = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"is not valid JSON ({exc.msg} at column {exc.colno})", line=line_no, path=str(path)
                ) from None
            if not isinstance(item, dict):
                raise InputError("must be a JSON object", line=line_no, path=str(path))
            for field, kind in (("id", str), ("source", str), ("summary", str), ("human", dict)):
                if not isinstance(item.get(field), kind):
                    raise InputError(
                        f"must be a {'string' if kind is str else 'JSON object'}; got {type(item.get(field)).__name__}",
                        field=field,
                        line=line_no,
                        row_id=str(item.get("id")),
                        path=str(path),
                    )
            if not isinstance(item.get("judges", {}), dict):
                raise InputError(
                    "must be a JSON object", field="judges", line=line_no, row_id=item["id"], path=str(path)
                )
            item.setdefault("judges", {})
            parts = item["id"].split(":")
            item.setdefault("doc_id", parts[1] if len(parts) == 3 else item["id"])
            item["_line"] = line_no
            items.append(item)
    if not items:
        raise InputError("holds no items", path=str(path))
    return items


def kind_of(items: list[dict]) -> str:
    first = items[0]
    if "keyfacts" in first and "keyfact_present_majority" in first["human"]:
        return "keyfacts"
    if "sentences" in first and "sentence_error_majority" in first["human"]:
        return "sentences"
    return "scores"


def primary_human(item: dict, kind: str) -> float | None:
    h = item["human"]
    if kind == "sentences":
        return h.get("faithfulness")
    if kind == "keyfacts":
        return h.get("completeness")
    nums = [v for v in h.values() if isinstance(v, (int, float))]
    return h.get("consistency", nums[0] if nums else None)


def pick_documents(items: list[dict], kind: str, documents: int | None, limit: int | None, seed: int) -> list[dict]:
    """Whole documents (all their summaries), stratified by the documents' mean primary human score: documents are
    sorted by it, cut into `documents` equal strata, and one is drawn from each with a seeded RNG. --limit then
    keeps whole documents while the item count stays within it. Reproducible for a given file, count and seed."""
    by_doc: dict[str, list[dict]] = {}
    for item in items:
        by_doc.setdefault(item["doc_id"], []).append(item)
    docs = sorted(by_doc)
    if documents and documents < len(docs):

        def mean(d):
            vals = [v for v in (primary_human(i, kind) for i in by_doc[d]) if v is not None]
            return sum(vals) / len(vals) if vals else 0.0

        ranked = sorted(docs, key=lambda d: (mean(d), d))
        rng = random.Random(seed)
        bounds = [round(k * len(ranked) / documents) for k in range(documents + 1)]
        docs = sorted(rng.choice(ranked[bounds[k] : bounds[k + 1]]) for k in range(documents))
    chosen = []
    for d in docs:
        if limit and chosen and len(chosen) + len(by_doc[d]) > limit:
            break
        chosen.extend(by_doc[d])
    return chosen
