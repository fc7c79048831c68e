"""A judge server as a child process on a free loopback port: started, asked until a page of it answers, paused,
stopped. The llama-server and `vllm serve` tests and the ladder's llama.cpp rung each start one this way."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path


class ServerNotReady(RuntimeError):
    """The server exited, or did not answer within its patience; the message names its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LoopbackServer:
    """command(port) -> the argv that serves on that port; ready: the path whose 200 says it serves (/health,
    /v1/models). Its output goes to log (an open file). It runs in a session of its own, so stop() and pause()
    reach every process it starts."""

    def __init__(
        self,
        name: str,
        command: Callable[[int], list[str]],
        log,
        *,
        ready: str,
        patience: float = 120,
        env: dict | None = None,
    ):
        self.name, self.log, self.ready, self.patience, self.env = name, log, ready, patience, env
        self.port = free_port()
        self.args = command(self.port)
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.root}/v1"
        self.proc: subprocess.Popen | None = None
        self.peak_kb = 0

    def start(self) -> None:
        """Starts it and returns once `ready` answers 200. Raises ServerNotReady where it exits first or does not
        answer within `patience` seconds (it is killed then)."""
        self.proc = subprocess.Popen(
            self.args, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.time() + self.patience
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.root}{self.ready}", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                if self.proc.poll() is not None:
                    said = f"{self.name} exited {self.proc.returncode}; its log: {self.log.name}"
                    raise ServerNotReady(said) from None
                time.sleep(0.3)
        self.stop(graceful=False)
        raise ServerNotReady(f"{self.name} did not answer within {self.patience:.0f} s; its log: {self.log.name}")

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)  # a stalled server: the port open, nothing answered

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def peak_rss_kb(self) -> int:
        """Its peak resident memory (VmHWM) over every start so far, in kB (read while it runs, and at stop)."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))
        except (OSError, AttributeError):
            pass
        return self.peak_kb

    def stop(self, graceful: bool = True) -> None:
        """graceful: SIGTERM, then SIGKILL after 30 s; else SIGKILL at once, as a crash would."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.peak_rss_kb()
        os.killpg(self.proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
