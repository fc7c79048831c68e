"""Reading a running process's memory from /proc: memory in use (PSS), the kernel's resident maximum (VmHWM), and
the most a command's processes held at once while it ran (watch). benchmarks/memory_peak.py is its command line, and
says why both counts."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path


def field_kib(pid: int, file: str, name: str) -> int:
    """One "Name: N kB" line of /proc/PID/FILE, in KiB; 0 where the process has gone or it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def pss_kib(pid: int) -> int:
    return field_kib(pid, "smaps_rollup", "Pss")


def hwm_kib(pid: int) -> int:
    return field_kib(pid, "status", "VmHWM")


def tree(pid: int) -> list[int]:
    """The process and its descendants now (each one's children from /proc)."""
    found, queue = [], [pid]
    while queue:
        p = queue.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                queue += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def watch(command: list[str], watched: int | None, every: float) -> dict:
    started = time.perf_counter()
    child = subprocess.Popen(command)
    peak, hwm, samples = 0, {}, 0
    try:
        while child.poll() is None:
            pids = [watched] if watched else tree(child.pid)
            peak = max(peak, sum(pss_kib(p) for p in pids))
            for p in pids:
                hwm[p] = max(hwm.get(p, 0), hwm_kib(p))
            samples += 1
            time.sleep(every)
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        child.wait(timeout=30)
        raise
    return {
        "command": command,
        "watched": f"pid {watched}" if watched else "the command's process tree",
        "peak_pss_gib": round(peak / 2**20, 3),
        "max_vmhwm_gib": round(max(hwm.values(), default=0) / 2**20, 3),
        "samples": samples,
        "every_s": every,
        "returncode": child.returncode,
        "wall_s": round(time.perf_counter() - started, 1),
    }
