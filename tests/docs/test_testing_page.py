"""The scripted judge as docs/testing.md shows it to users: the page's example runs as written (scripted judge, no
model), so the page cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_scripted_judge_example_runs_as_written():
    example = next(b for b in python_blocks(PAGE.read_text()) if "ScriptedEngine()" in b)
    namespace: dict = {}
    exec(compile(example, str(PAGE), "exec"), namespace)  # its asserts are the test
    result = namespace["result"]
    assert [c["supported"] for c in result.claims] == [True, False]
    assert namespace["judge"].requests, "the scorer asked the scripted judge nothing"
