"""The documentation site builds offline with --strict, and --strict does fail it: a broken link, and a Python
reference that no longer resolves, each stop the build with a line naming what broke."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]'; make setup does)")


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def copy_of_the_site(tmp_path: Path) -> tuple[Path, Path]:
    """mkdocs.yml and docs/ copied, the config pointing at the copy and at the package in this checkout."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    text = (ROOT / "mkdocs.yml").read_text()
    text = text.replace("docs_dir: docs", f"docs_dir: {docs}").replace("paths: [.]", f"paths: [{ROOT}]")
    config = tmp_path / "mkdocs.yml"
    config.write_text(text)
    return config, docs


def test_the_site_builds_strict_with_generated_references(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "sumscore score" in cli and "--resume" in cli and "--judge-api-key" in cli  # from the click app
    python = (tmp_path / "site" / "reference" / "python" / "index.html").read_text()
    assert "SummarizationScorer" in python and "score_many" in python  # from the docstrings


def test_a_broken_link_fails_the_build(tmp_path):
    config, docs = copy_of_the_site(tmp_path)
    assert build(config, tmp_path / "good").returncode == 0  # the copy itself builds
    with open(docs / "index.md", "a") as fh:
        fh.write("\nSee [the old page](no-such-page.md).\n")
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_a_reference_that_does_not_resolve_fails_the_build(tmp_path):
    config, docs = copy_of_the_site(tmp_path)
    with open(docs / "reference" / "python.md", "a") as fh:
        fh.write("\n::: offline_sumscore.no_such_function\n")
    done = build(config, tmp_path / "site")
    assert done.returncode != 0
    assert "no_such_function" in done.stderr
