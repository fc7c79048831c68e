"""The served-judge backend against a real server on loopback: `transformers serve` with the embedded judge.

`transformers serve` ignores response_format (it logs "Ignoring unsupported fields"), so this also checks, for real,
that the engine notices, falls back to the schema in the prompt, validates every output and says so in the rows.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from offline_sumscore.engine.judge import models_root
from offline_sumscore.engine.openai_compatible import PROMPT_MODE

pytestmark = pytest.mark.model
MODEL = models_root() / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def served():
    pytest.importorskip("fastapi", reason="transformers serve needs fastapi, uvicorn and openai (the test extra)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cli = Path(sys.executable).parent / "transformers"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.Popen(
        [str(cli), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 180
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited: {proc.stdout.read()[-2000:]}")
            time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("transformers serve did not open its port within 180 s")
    yield f"http://127.0.0.1:{port}/v1"
    proc.terminate()
    proc.wait(30)


def test_cli_scores_through_a_real_local_server_and_records_the_fallback(tmp_path, served):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(
        json.dumps(
            {
                "id": "x",
                "source": "The council of Lindford voted to build a library. Work begins in March.",
                "summary": "Lindford will build a library.",
                "questions": ["Will Lindford build a library?"],
            }
        )
        + "\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "offline_sumscore",
            "score",
            str(src),
            "-o",
            str(out),
            "--judge-url",
            served,
            "--judge-model",
            str(MODEL),
            "--max-claims",
            "4",
            "--max-text-chars",
            "40",
            "--no-reason",
            "--no-cache",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: the 135M judge may write JSON that fails validation
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["judge" if "judge" in row else "stages"] is not None
    assert "did not enforce response_format" in proc.stderr
    stages = row["stages"]
    assert stages["claims"]["tokens_in"] > 0 and stages["claims"]["raw_output"]  # the server really answered
    if row.get("error"):
        # Never a score from a bad output: the failure names the stage and keeps what the server wrote.
        assert row["score"] is None and row["error"]["raw_output"] is not None
    else:
        assert row["judge"]["engine"]["structured_output"] == PROMPT_MODE
        assert 0 <= row["score"] <= 1 and len(row["coverage_verdicts"]) == 1
