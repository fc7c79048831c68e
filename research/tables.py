"""Where a research script's table goes: printed, and written to research/results/NAME.md."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def publish(name: str, lines: list[str]) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / f"{name}.md").write_text(text)
