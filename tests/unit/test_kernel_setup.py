"""The C++ kernels: every source is a registered kernel, `sumscore setup` builds them all at once with a line each,
and a machine without a compiler is told once and runs on torch's operators."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from offline_sumscore.engine.cpu import native_build
from offline_sumscore.engine.cpu.native_build import build_every_kernel, every_kernel, kernels_here
from tests.conftest import as_in_a_terminal

CPU_FOLDER = Path(native_build.__file__).parent
AVX512 = "AVX512" in torch.backends.cpu.get_cpu_capability()


def test_every_kernel_source_is_a_registered_kernel_and_every_shared_header_is_compiled_in():
    kernels = every_kernel()
    assert sorted(k.source.name for k in kernels) == sorted(p.name for p in CPU_FOLDER.glob("*.cpp"))
    assert len({k.name for k in kernels}) == len(kernels)
    assert sorted(p.name for p in native_build.SHARED) == sorted(p.name for p in CPU_FOLDER.glob("*.h"))
    assert all(k.instead.endswith(".") and "instead" in k.instead for k in kernels)


@pytest.fixture
def no_compiler(monkeypatch):
    """A machine with no C++ compiler and nothing in torch's cache: every kernel's next build is a first one."""
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setattr(native_build, "_said_no_compiler", threading.Event())
    for kernel in every_kernel():
        monkeypatch.setattr(kernel, "built", {})
        monkeypatch.setattr(kernel, "cached", lambda: False)


def test_without_a_compiler_every_kernel_fails_at_once_saying_what_runs_instead(no_compiler):
    said = []
    builds = build_every_kernel(said.append)
    here = len(kernels_here())  # all five with AVX-512; the GGUF block-code kernel alone without
    assert [b.outcome for b in builds] == ["failed"] * here and len(said) == here
    for build in builds:
        assert "no C++ compiler on this machine (CXX=/nonexistent/c++ is not found)" in build.line()
        assert build.kernel.instead in build.line() and build.seconds < 5  # told, not tried


def test_without_a_compiler_a_score_is_warned_once_for_every_kernel(no_compiler):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [kernel.build_or_warn() for kernel in every_kernel()]
    assert all(module is None for module, _ in results)
    assert len(caught) == 1 and "no C++ compiler" in str(caught[0].message)
    assert "torch's operators" in str(caught[0].message) and "sumscore setup" in str(caught[0].message)


def setup_command(*args, **env):
    return subprocess.run(
        [sys.executable, "-m", "offline_sumscore", "setup", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, **env),
    )


def test_setup_without_a_compiler_says_so_once_and_ends_well(tmp_path):
    proc = setup_command("--no-judge", CXX="/nonexistent/c++", TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    if not AVX512:
        assert "has no AVX-512" in proc.stdout
        return
    assert proc.stdout.count("no C++ compiler") == 1 and "runs on torch's operators" in proc.stdout
    assert "no kernels" in proc.stdout.splitlines()[-1] and "Traceback" not in proc.stderr


@pytest.mark.skipif(not AVX512, reason="the kernels are AVX-512 code; this CPU has none (setup says so in one line)")
def test_setup_after_the_set_up_loads_every_kernel_from_the_cache_with_a_line_each():
    proc = setup_command("--no-judge")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"kernels: building {len(every_kernel())} at once")
    for kernel in every_kernel():
        assert sum(line.strip().startswith(f"{kernel.what}: built") for line in lines) == 1, proc.stdout
    assert f"{len(every_kernel())} of {len(every_kernel())} kernels ready" in lines[-1] and "FAILED" not in proc.stdout
    assert "offline_sumscore: building" not in proc.stderr  # the lines above say it, not the first-use message


def test_ctrl_c_during_the_builds_ends_set_up_within_seconds(tmp_path):
    """Ctrl-C as a terminal sends it: to the whole foreground group, the compilers included."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))  # an empty cache: the builds take a while
    proc = subprocess.Popen(
        [sys.executable, "-m", "offline_sumscore", "setup", "--no-judge"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=as_in_a_terminal,
    )
    try:
        first = proc.stdout.readline()
        if first.startswith("kernels: this CPU has no AVX-512"):  # then the plain C++ kernel alone is built
            first = proc.stdout.readline()
        assert first.startswith(f"kernels: building {len(kernels_here())} at once"), first
        time.sleep(1)  # the compilers are running
        sent = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        said, _ = proc.communicate(timeout=20)
        took = time.time() - sent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and took < 5, (proc.returncode, took, said)
    assert "interrupted: set-up not finished; run `sumscore setup` again" in said and "Traceback" not in said


def test_each_torch_installation_builds_in_folders_of_its_own(monkeypatch, tmp_path):
    """.venv and .venv-vllm compile against different include paths: one shared folder would be rebuilt by each in
    turn, silently, at its next first use."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    kernel = every_kernel()[0]
    here = kernel.folder()
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "other-env" / "torch" / "__init__.py"))
    assert kernel.folder() != here and kernel.folder().parent == here.parent == tmp_path
    assert kernel.folder().name.startswith(kernel.name + "-") and not kernel.cached()
