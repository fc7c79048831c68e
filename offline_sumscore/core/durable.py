"""Files that survive a crash: written whole under a temporary name, fsynced, renamed over the target, and the
rename itself fsynced. A reader sees the old file or the new one, never a half of either."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def replace_file(path: str | os.PathLike, write: Callable[[Path], None], *, suffix: str = ".writing") -> None:
    """write(tmp) fills a temporary file beside path; then it replaces path atomically and durably."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + suffix)
    write(tmp)
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def replace_bytes(path: str | os.PathLike, data: bytes) -> None:
    replace_file(path, lambda tmp: tmp.write_bytes(data))


def replace_text(path: str | os.PathLike, text: str) -> None:
    replace_bytes(path, text.encode("utf-8"))
