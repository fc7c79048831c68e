"""The package stays readable in one sitting: no file over 500 lines, no function over 80 (100 in benchmarks/ and
research/).
Read from the source with ast, nested functions counted on their own as well as inside their parent."""

from __future__ import annotations

import ast
from pathlib import Path

import offline_sumscore

PACKAGE = Path(offline_sumscore.__file__).parent
BENCHMARKS = PACKAGE.parent / "benchmarks"
RESEARCH = PACKAGE.parent / "research"
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = {PACKAGE: 80, BENCHMARKS: 100, RESEARCH: 100}


def long_functions(source: str, limit: int) -> list[tuple[str, int]]:
    """(name, lines) of every function or method in source longer than limit lines, decorators left out."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_file_in_the_package_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines()))}
    assert not {p: n for p, n in long.items() if n > MAX_FILE_LINES}


def test_no_function_is_over_80_lines_in_the_package_or_100_in_scripts():
    over = [
        f"{path.relative_to(root.parent)}: {name} has {lines} lines (at most {limit})"
        for root, limit in MAX_FUNCTION_LINES.items()
        for path in sorted(root.rglob("*.py"))
        for name, lines in long_functions(path.read_text(), limit)
    ]
    assert not over, "\n".join(over)


def test_the_length_check_sees_methods_and_nested_functions():
    body = "\n".join(f"        x{i} = {i}" for i in range(81))
    source = f"class A:\n    def method(self):\n{body}\n\n\ndef outer():\n    def inner():\n{body}\n    return inner\n"
    assert sorted(long_functions(source, 80)) == [("inner", 82), ("method", 82), ("outer", 84)]
