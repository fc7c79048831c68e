"""A long run holds no finished row: each row goes to OUTPUT the moment it is final, and the stream keeps nothing of
it (scripted outcomes, no model). A stream once kept them all, and a 5,000-row soak's memory and pace grew with
them."""

from __future__ import annotations

import gc
import json
import weakref

from offline_sumscore.io.inputs import read_rows
from offline_sumscore.runs.bulk import stream_rows_here


class Row(dict):
    """A result row that a weak reference can watch (a plain dict cannot be)."""


class Outcome:
    def __init__(self, i: int):
        self.i = i

    def to_dict(self) -> dict:
        return Row(score=1.0, n=self.i)


class ScriptedStream:
    """A scorer whose stream finishes every sample at once, in order."""

    metric = "two-axis"

    def stream(self, samples, done, in_flight):
        for i in range(len(samples)):
            done(i, Outcome(i))


def test_a_written_rows_are_not_held_by_the_stream_and_each_is_emitted_the_moment_it_is_final(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(json.dumps({"id": f"r{i}", "source": f"Source {i}.", "summary": "S."}) + "\n" for i in range(12))
    )
    items = list(read_rows(src))
    written: list[list[weakref.ref]] = []
    alive_at_emit = []

    def emit(items, rows):
        gc.collect()
        alive_at_emit.append(sum(ref() is not None for refs in written for ref in refs))  # earlier rows
        written.append([weakref.ref(r) for r in rows])

    stream_rows_here(ScriptedStream(), items, emit)
    assert [len(refs) for refs in written] == [1] * 12
    assert alive_at_emit == [0] * 12
