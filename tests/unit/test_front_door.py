"""What a user meets first stays plain: a short README that links into the docs, scripts that read no data from
outside the repository unless told where it is, a package and tests that import no benchmark or research script (the
tests may import the benchmarks' library, benchmarks/lib, whose code they check), and an engine whose constructor
holds only what a user sets (the ladder's and the tests' switches go through engine/local/lab.py)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_FOLDERS = ("benchmarks", "research")
BENCHMARK_LIBRARY = "benchmarks.lib"  # code the benchmarks and research scripts share, not a script


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert readme.index("make demo") < 400 and "make test" in readme[:600]  # the two commands come first
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert any(link.startswith("docs/") for link in links)
    assert not [link for link in links if "://" not in link and not (ROOT / link).exists()]


def test_neither_the_package_nor_the_tests_import_a_benchmark_or_research_script():
    scripts = {p.stem for f in SCRIPT_FOLDERS for p in (ROOT / f).glob("*.py")}
    offenders = []
    for folder in ("offline_sumscore", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            mods = imported_modules(path)
            # The tests check the benchmarks' library as they check the package; the package, installed without the
            # repository, imports none of it.
            library = {m for m in mods if folder == "tests" and f"{m}.".startswith(f"{BENCHMARK_LIBRARY}.")}
            bad = {m for m in mods - library if m.split(".")[0] in SCRIPT_FOLDERS or m in scripts}
            if bad or re.search(r"sys\.path\.(insert|append)\([^)]*(benchmarks|research)", text):
                offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad) or 'sys.path'}")
    assert not offenders, offenders


def test_no_script_reads_data_from_outside_the_repository_by_default():
    shared = re.compile(r"""\.\./shared|/\s*["']shared["']""")  # a path into ../shared, written either way
    offenders = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in SCRIPT_FOLDERS
        for path in sorted((ROOT / folder).glob("*.*"))
        if path.suffix in (".py", ".sh")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if shared.search(line)
    ]
    assert not offenders, offenders


def test_the_engine_constructor_holds_only_what_a_user_sets():
    from offline_sumscore.engine.local import TransformersEngine

    params = list(inspect.signature(TransformersEngine.__init__).parameters)
    # each a CLI flag or Ray's, and the one developer hook, given explicitly (no engine reads a module global)
    assert params == ["self", "judge", "batch_size", "token_budget", "device_share", "lab"]
