"""llama.cpp's llama-server on a free loopback port, started and stopped by the tests, and the skip that names the
make target that builds it."""

import os
from pathlib import Path

import pytest

from tests.loopback import TestServer

ROOT = Path(__file__).resolve().parents[2]
LLAMA_SERVER = ROOT / ".llamacpp" / "bin" / "llama-server"
MAKE_IT = "llama.cpp's llama-server is not built here: `make llamacpp-env` builds it (CI does, before `make test`)"
NAME = "judge"


class LlamaServer(TestServer):
    def __init__(self, log, gguf: Path, *, parallel: int = 4, context: int = 2048):
        if not LLAMA_SERVER.exists():
            pytest.skip(MAKE_IT)

        def command(port: int) -> list[str]:
            args = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
            # context: per slot; llama-server splits -c across its --parallel slots
            args += ["-c", str(context * parallel), "--parallel", str(parallel), "-t", str(os.cpu_count() or 2)]
            return args + ["--alias", NAME, "--seed", "0", "--no-webui"]

        super().__init__("llama-server", command, log, ready="/health", patience=120)
