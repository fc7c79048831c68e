"""What `pip install` gives is what the clone gives: the sdist and the wheel hold every file of the package, both pass
`twine check`, and the wheel installed into a fresh environment runs the demo outside the clone with every kernel
loaded and no warning.

The fresh environment reuses the set-up's packages (a .pth line pointing at its site-packages, whose own .pth files,
the clone's editable install among them, are not read), so nothing is downloaded. Building takes `python -m build
--no-isolation`: the set-up's setuptools, no network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PIP_NO_INDEX": "1"}


def package_files(tree: Path) -> set[str]:
    """Every file of the package as the tree holds it: what git tracks under offline_sumscore/ (every file a run
    may open: code, kernel sources, presets, examples), else every file there but bytecode."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "offline_sumscore"], cwd=tree, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        listed = []
    if not listed:
        listed = [
            p.relative_to(tree).as_posix()
            for p in (tree / "offline_sumscore").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        ]
    return set(listed)


def missing_from_wheel(wheel: Path, tree: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        held = set(archive.namelist())
    return sorted(package_files(tree) - held)


def missing_from_sdist(sdist: Path, tree: Path) -> list[str]:
    with tarfile.open(sdist) as archive:
        held = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    return sorted((package_files(tree) | {"pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md"}) - held)


def build(tree: Path, out: Path, *what: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", *what, "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **OFFLINE),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist, and the wheel built from it (python -m build's default: so the sdist must be complete too)."""
    out = tmp_path_factory.mktemp("dist")
    build(ROOT, out)
    return out


def only(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def test_the_wheel_and_the_sdist_hold_every_file_of_the_package(dist):
    assert "offline_sumscore/engine/cpu/block_codes.cpp" in package_files(ROOT)  # the list is not empty or wrong
    assert missing_from_wheel(only(dist, "*.whl"), ROOT) == []
    assert missing_from_sdist(only(dist, "*.tar.gz"), ROOT) == []


def test_a_kernel_source_left_out_of_the_package_data_is_caught(tmp_path):
    """The package data as a list kept by hand, one kernel source forgotten: the check above names it."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "offline_sumscore", tree / "offline_sumscore", ignore=shutil.ignore_patterns("__pycache__"))
    pyproject = (tree / "pyproject.toml").read_text()
    by_hand = (
        'offline_sumscore = ["examples/*.jsonl", "**/*.toml", "engine/cpu/*.h", "engine/cpu/attention_kernel.cpp", '
        '"engine/cpu/layer_ops.cpp", "engine/cpu/pick_kernel.cpp", "engine/cpu/gguf_codes.cpp"]'
    )
    pyproject, n = re.subn(r"^offline_sumscore = \[.*\]$", by_hand, pyproject, flags=re.M)
    assert n == 1, "the package data line moved; this test copies it"
    (tree / "pyproject.toml").write_text(pyproject)
    build(tree, tmp_path / "dist", "--wheel")
    assert missing_from_wheel(only(tmp_path / "dist", "*.whl"), tree) == ["offline_sumscore/engine/cpu/block_codes.cpp"]


def test_twine_check_passes(dist):
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.iterdir())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASSED") == 2


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment holding the wheel, beside the set-up's packages."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # Only the directory joins the path: the .pth files inside it (the clone's editable install) are not read.
    Path(site, "setup_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
        + [str(only(dist, "*.whl"))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return venv


def run_installed(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, **OFFLINE)
    env.pop("PYTHONPATH", None)
    # The set-up's converted judge (conversion is `sumscore convert`'s own test); the kernels from torch's cache.
    from offline_sumscore.engine.judge import models_root

    env["OFFLINE_SUMSCORE_MODELS"] = str(models_root())
    return subprocess.run(
        [str(venv / "bin" / "sumscore"), *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


def test_the_installed_wheel_runs_the_demo_outside_the_clone_with_every_kernel_and_no_warning(installed, tmp_path):
    import torch

    where = subprocess.run(
        [str(installed / "bin" / "python"), "-c", "import offline_sumscore; print(offline_sumscore.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(installed)), f"the clone's package was imported, not the wheel's: {where}"

    setup = run_installed(installed, tmp_path, "setup")
    assert setup.returncode == 0, setup.stdout + setup.stderr
    version = run_installed(installed, tmp_path, "--version")
    assert version.returncode == 0 and "torch " + torch.__version__ in version.stdout

    demo = run_installed(installed, tmp_path, "demo", "--metric", "two-axis", "-o", str(tmp_path / "rows.jsonl"))
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-3000:]
    assert "Warning" not in demo.stderr and "warn" not in demo.stderr.lower(), demo.stderr[-3000:]
    assert "building" not in demo.stderr, "a kernel was built during the first score, not at set-up"
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert rows and all(r.get("error") is None for r in rows)
    judge = rows[0]["judge"]
    if "AVX512" not in torch.backends.cpu.get_cpu_capability():
        pytest.skip(f"this CPU has no AVX-512 ({torch.backends.cpu.get_cpu_capability()}): no kernel applies here")
    assert "5 of 5 kernels ready" in setup.stdout, setup.stdout
    assert judge["engine"]["attention_kernel"].startswith("kernel"), judge["engine"]["attention_kernel"]
    assert judge["engine"]["pick_kernel"].startswith("kernel"), judge["engine"]["pick_kernel"]
    assert "on 4-bit block codes for" in judge["decisions"]["cpu_gemm"], judge["decisions"]["cpu_gemm"]
    assert not judge["decisions"]["layer_ops"].startswith("torch's operators"), judge["decisions"]["layer_ops"]
