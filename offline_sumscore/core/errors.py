"""Every error the package raises on purpose derives from SumscoreError.

Messages are one line: where (file:line, id, stage), which field, the rule, the value given, what to do.
Structured attributes come first and the message is built from them, so callers can branch on them
and the CLI can print the message alone.
"""

from __future__ import annotations

from typing import Any


class Failure:
    """Why a stage has no value: StageResult.error_kind, JudgeOutputError.kind, and the second half of a failed row's
    cause ("claims:cap"). The retry layer reruns CAP (with twice the cap) and MODEL once."""

    CAP = "cap"  # the output reached its token cap before the JSON closed
    SCHEMA = "schema"  # the output does not parse into the stage's schema
    CONTEXT = "context"  # the prompt leaves no room in the judge's context
    MEMORY = "memory"  # out of memory even alone, on a batch of one row
    MODEL = "model"  # the engine or the model failed: an exception in the call, NaN logits, a server error
    REJECTED = "rejected"  # a served judge refused the request (its structured-output mode, say)
    BOUND = "bound"  # a list still reached its safety bound after it was drawn again from halves of the text
    DEGENERATE = "degenerate"  # the output parses but answers nothing asked: the prompt's own words echoed, say
    ERROR = "error"  # a stage result that names no kind


class SumscoreError(Exception):
    """Base class; the CLI prints str(error) as one line and exits non-zero."""


class UsageError(SumscoreError, ValueError):
    """An option or argument is out of range. Also a ValueError, so plain Python callers can catch that."""


class InputError(SumscoreError, ValueError):
    """A row of input cannot be scored: names the location, the row id and the field."""

    def __init__(
        self,
        rule: str,
        *,
        field: str | None = None,
        line: int | None = None,
        row_id: str | None = None,
        path: str | None = None,
        cause: str = "input",
    ):
        self.rule, self.field, self.line, self.row_id, self.path = rule, field, line, row_id, path
        self.cause = cause  # a short label ("missing_field", "invalid_json", ...): the CLI counts failed rows by it
        where = []
        if path is not None or line is not None:
            where.append(f"{path or 'input'}:{line}" if line is not None else str(path))
        if row_id is not None:
            where.append(f'(id "{row_id}")')
        loc = " ".join(where)
        fld = f'field "{field}" ' if field else ""
        super().__init__(f"{loc}: {fld}{rule}" if loc else f"{fld}{rule}")


class ModelLoadError(SumscoreError):
    """The judge model cannot be loaded; the message says what to do."""


class JudgeOutputError(SumscoreError):
    """A judge stage produced no valid result. raw_output keeps what the model did produce."""

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        raw_output: str = "",
        sample_id: str | None = None,
        kind: str = Failure.ERROR,
        stages: dict | None = None,
    ):
        self.stage, self.raw_output, self.sample_id, self.kind = stage, raw_output, sample_id, kind
        self.stages = dict(stages or {})  # every stage run so far, the failed one included: the row's audit
        who = f' for id "{sample_id}"' if sample_id is not None else ""
        super().__init__(f'stage "{stage}"{who}: {message}')


def check_count(name: str, value: Any, most: int | None = None) -> int:
    """value as a count: an integer >= 1 (and <= most, where a mistyped 100000 must be refused, not run for days),
    else a UsageError naming the parameter and the value given."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (most is not None and value > most):
        bound = f"from 1 to {most}" if most is not None else ">= 1"
        raise UsageError(f"{name} must be an integer {bound}. Given: {value}")
    return value


class WriteError(SumscoreError):
    """A file the run writes (OUTPUT, a shard, a report, its record) could not be written: no space left, no
    permission, an I/O error. Names the file and the cause; what was already written stays intact."""

    def __init__(self, path: Any, exc: OSError, kept: str = ""):
        import errno

        self.path, self.errno = str(path), exc.errno
        name = errno.errorcode.get(exc.errno or 0, "")
        cause = f"{exc.strerror or exc}" + (f" ({name})" if name else "")
        super().__init__(f"cannot write {self.path}: {cause}" + (f"; {kept}" if kept else ""))


class RunLockedError(SumscoreError):
    """Another run holds OUTPUT: two runs on one OUTPUT would score every row twice, or race on --resume."""
