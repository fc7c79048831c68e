"""llama.cpp's llama-server on a free loopback port, started and stopped by the tests, and the skip that names the
make target that builds it."""

import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = ROOT / ".llamacpp" / "bin" / "llama-server"
MAKE_IT = "llama.cpp's llama-server is not built here: `make llamacpp-env` builds it (CI does, before `make test`)"
NAME = "judge"


class LlamaServer:
    def __init__(self, log, gguf: Path, *, parallel: int = 4, context: int = 2048):
        if not LLAMA_SERVER.exists():
            pytest.skip(MAKE_IT)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url, self.log, self.proc = f"http://127.0.0.1:{self.port}/v1", log, None
        self.args = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port)]
        # context: per slot; llama-server splits -c across its --parallel slots
        self.args += ["-c", str(context * parallel), "--parallel", str(parallel), "-t", str(os.cpu_count() or 2)]
        self.args += ["--alias", NAME, "--seed", "0", "--no-webui"]

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                if self.proc.poll() is not None:
                    pytest.fail(f"llama-server exited {self.proc.returncode}; its log: {self.log.name}")
                time.sleep(0.3)
        self.stop()
        pytest.fail(f"llama-server did not answer within 120 s; its log: {self.log.name}")

    def pause(self) -> None:
        os.killpg(self.proc.pid, signal.SIGSTOP)  # a stalled server: the port open, nothing answered

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # as a crash would
            self.proc.wait(30)
