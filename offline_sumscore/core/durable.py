"""Files that survive a crash: written whole under a temporary name, fsynced, renamed over the target, and the
rename itself fsynced. A reader sees the old file or the new one, never a half of either. Directories likewise
(replace_dir: a converted judge)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def _fsync_dir(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the entries themselves (a rename, a new file) survive a power cut
    finally:
        os.close(dir_fd)


def replace_file(path: str | os.PathLike, write: Callable[[Path], None], *, suffix: str = ".writing") -> None:
    """write(tmp) fills a temporary file beside path; then it replaces path atomically and durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + suffix)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (no space, say) leaves the old file and no half of a new one
        raise
    _fsync_dir(path.parent)


def replace_dir(tmp: str | os.PathLike, target: str | os.PathLike) -> None:
    """Move a finished directory tmp (beside target) into target's place: every file in it and the directory itself
    fsynced first, then renamed, and the rename fsynced. target must not exist (os.replace cannot replace a
    non-empty directory)."""
    tmp, target = Path(tmp), Path(target)
    for f in tmp.rglob("*"):
        if f.is_file():
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(tmp)
    os.replace(tmp, target)
    _fsync_dir(target.parent)


def replace_bytes(path: str | os.PathLike, data: bytes) -> None:
    replace_file(path, lambda tmp: tmp.write_bytes(data))


def replace_text(path: str | os.PathLike, text: str) -> None:
    replace_bytes(path, text.encode("utf-8"))
