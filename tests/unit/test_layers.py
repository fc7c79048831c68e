"""The package's folders are its layers, and each module imports only from its own layer or those below it.

The graph is read from the source with ast (every import, those inside functions included), so a lazy import that
reaches upward is caught as well as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import offline_sumscore

PACKAGE = Path(offline_sumscore.__file__).parent
# Bottom to top. A module at the package's top (testing, __init__, __main__) stands above every folder.
LAYERS = ["core", "engine", "scorers", "analysis", "io", "peers", "runs", "cli"]


def module_name(path: Path) -> str:
    parts = ["offline_sumscore", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, known: set[str]) -> set[str]:
    """The package's modules that path imports (a name imported from a package counts as its submodule when it is
    one, else as the package)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "offline_sumscore")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "offline_sumscore":
                continue
            for alias in node.names:
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in known else target)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    known = {module_name(p) for p in paths}
    return {module_name(p): imported(p, known) for p in paths}


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS):  # inside a folder, or the folder itself
        return LAYERS.index(parts[1])
    return len(LAYERS)  # a top-level module, or the package


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each a cycle or several."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_every_folder_is_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders == set(LAYERS), f"a folder that is no layer, or a layer without a folder: {folders ^ set(LAYERS)}"


def layer_name(module: str) -> str:
    return LAYERS[layer(module)] if layer(module) < len(LAYERS) else "top"


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [
        f"{m} ({layer_name(m)}) imports {d} ({layer_name(d)})"
        for m, deps in import_graph().items()
        for d in sorted(deps)
        if layer(d) > layer(m)
    ]
    assert not upward, "\n".join(upward)


def test_the_metrics_share_their_stages_and_neither_imports_the_other():
    """A stage both metrics ask for lives in scorers/stages/, one module a kind; summary-score reads nothing of the
    two-axis metric's own modules, nor the two-axis metric anything of summary-score's."""
    graph = import_graph()
    summary = graph["offline_sumscore.scorers.summary_score"]
    assert not {d for d in summary if d.startswith("offline_sumscore.scorers.two_axis")}, summary
    assert "offline_sumscore.scorers.summary_score" not in graph["offline_sumscore.scorers.two_axis"]
    stages = {d for d in summary if d.startswith("offline_sumscore.scorers.stages.")}
    two_axis = graph["offline_sumscore.scorers.two_axis"]
    reached = two_axis | {d for m in two_axis for d in graph.get(m, set())}
    ragas_only = {f"offline_sumscore.scorers.stages.{kind}" for kind in ("keyphrases", "answers")}
    assert stages - ragas_only <= reached, stages - reached  # every other stage summary-score asks for, both ask for
    shared = {f"offline_sumscore.scorers.stages.{kind}" for kind in ("questions", "verdict", "likelihood")}
    assert shared <= stages & reached
    # and no stage's prompt or grammar is left in core: a change to a stage is a change to its one module
    from offline_sumscore.core import prompts, schemas

    assert not {n for n in dir(prompts) if n.endswith("_prompt")} | {n for n in dir(schemas) if n.endswith("s_list")}


def test_the_package_has_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_checks_catch_what_they_are_for():
    """The walk sees a lazy import inside a function, and the cycle finder finds a cycle: a graph with one in it
    fails, so a green run above means something."""
    assert "offline_sumscore.engine.judge" in import_graph()["offline_sumscore"]  # load_judge imports it lazily
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("offline_sumscore.core.errors") < layer("offline_sumscore.runs.bulk") < layer("offline_sumscore.cli")
