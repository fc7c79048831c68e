"""Every error the package raises on purpose derives from SumscoreError.

Messages are one line: where (file:line, id, stage), which field, the rule, the value given, what to do.
Structured attributes come first and the message is built from them, so callers can branch on them
and the CLI can print the message alone.
"""
from __future__ import annotations


class SumscoreError(Exception):
    """Base class; the CLI prints str(error) as one line and exits non-zero."""


class UsageError(SumscoreError, ValueError):
    """An option or argument is out of range. Also a ValueError, so plain Python callers can catch that."""


class InputError(SumscoreError, ValueError):
    """A row of input cannot be scored: names the location, the row id and the field."""

    def __init__(self, rule: str, *, field: str | None = None, line: int | None = None,
                 row_id: str | None = None, path: str | None = None, cause: str = "input"):
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

    def __init__(self, message: str, *, stage: str, raw_output: str = "", sample_id: str | None = None,
                 kind: str = "error", stages: dict | None = None):
        self.stage, self.raw_output, self.sample_id, self.kind = stage, raw_output, sample_id, kind
        self.stages = dict(stages or {})  # every stage run so far, the failed one included: the row's audit
        who = f' for id "{sample_id}"' if sample_id is not None else ""
        super().__init__(f'stage "{stage}"{who}: {message}')
