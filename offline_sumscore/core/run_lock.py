"""One run per OUTPUT: an exclusive advisory lock (flock) on a file beside it, which names the run that holds it.

The kernel releases a flock when its holder dies, however it dies (kill -9 too), so a lock file left behind by a
dead run blocks nothing: the next run takes it over. The file itself is removed when the run ends.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from offline_sumscore.core.errors import RunLockedError


@contextmanager
def run_lock(path: str | os.PathLike, output: str) -> Iterator[Path]:
    """Hold the lock file `path` for the run writing `output`; RunLockedError, at once, when another run holds it."""
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunLockedError(
                f"OUTPUT {output} is being written by another run ({holder}; lock {path}): wait for it to end, "
                f"or write to another -o"
            ) from None
        # The file may have been removed by the run that held it, between our open and our lock: lock the path
        # that is there now, or two runs would each hold a file of their own.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        try:
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "started": started, "host": os.uname().nodename}).encode())
        except OSError:
            pass  # a full disk: the lock holds all the same, and a second run is still refused, its holder unnamed
        yield path
    finally:
        path.unlink(missing_ok=True)  # while still held: no other run can have taken this file meanwhile
        os.close(fd)


def _holder(fd: int) -> str:
    """The run that holds the lock, as its file names it: process id, start time and host."""
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"process {found['pid']} on {found['host']}, started {found['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a run that has not yet said which"
