"""--judge-url against a real llama.cpp server (llama-server, `make llamacpp-env`) on the embedded judge's own GGUF.

llama-server answers the JSON stages under their schemas (response_format) and the Yes/No verdicts under their
grammar (GBNF, its `grammar` field), and P(yes) is read on every verdict from its log-probabilities, which it takes
before the grammar (choice_logprobs.py). Its verdicts are our engine's on the same claims and questions within
TOLERANCE: the weights are the same Q4_1 codes, but llama.cpp rounds each activation to 8 bits before its dot
products and we do not. A stalled server, a server killed mid-run and Ctrl-C fail or keep rows by name; a design that
needs a text's log-probabilities is refused in one line before anything is asked.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from offline_sumscore.engine.gguf_convert import embedded_gguf_path
from offline_sumscore.engine.openai_compatible import GRAMMAR_MODE, LLAMA_CPP
from tests.llamacpp.server import NAME, LlamaServer
from tests.vllm.designs import DEMO

pytestmark = [pytest.mark.model, pytest.mark.llamacpp]
ORDINARY = DEMO.parents[2] / "tests" / "data" / "ordinary_summaries.jsonl"
DESIGN = ["--claims", "sentences", "--coverage", "questions", "--verdicts", "yes-no", "--max-questions", "3"]
DESIGN += ["--prompt-style", "full"]
# P(yes) from llama-server against ours on the same prompt: at most this far apart, and a verdict may differ only where
# either side's P(yes) is this close to the threshold. Measured on these 11 rows' 34 verdicts: 0.093 apart at most,
# 0.023 on average, one verdict of 34 on the other side of 0.5 (on SummEval rows under the ladder's caps, 0.224 at
# most: the 135M judge is that sensitive to 8-bit activations; the 1.5B's stayed within 0.032).
TOLERANCE = 0.2


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = open(tmp_path_factory.mktemp("llama_server") / "server.log", "w")
    served = LlamaServer(log, embedded_gguf_path())
    served.start()
    yield served
    served.stop()
    log.close()


def rows_of(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def score(src, out, *judge, wait=True, extra=()):
    args = [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out), "--no-cache", "--quiet"]
    args += [*judge, *DESIGN, *extra]
    if not wait:
        return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return subprocess.run(args, capture_output=True, text=True, timeout=600)


def served(server) -> list[str]:
    return ["--judge-url", server.url, "--judge-model", NAME]


def test_llama_server_answers_every_stage_valid_with_p_yes_and_our_engines_verdicts(server, tmp_path):
    # The questions drawn by llama-server itself: JSON under the schema, never the prompt fallback.
    src, out = tmp_path / "in.jsonl", tmp_path / "served.jsonl"
    demo = [json.loads(line) for line in DEMO.open()]
    write(src, demo)
    done = score(src, out, *served(server))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for row in rows_of(out):
        engine = row["judge"]["engine"]
        assert engine["server"] == LLAMA_CPP and engine["structured_output"] == GRAMMAR_MODE, engine
        assert not engine["refused_fields"], engine
        assert all(stage["error"] is None for stage in row["stages"].values()), row["id"]
        assert row["questions"], row["id"]
    # Then both engines on the same claims (sentences) and the same questions (given): every P(yes) read, and
    # within TOLERANCE of ours.
    rows = demo + [json.loads(line) for line in ORDINARY.open()]
    for row in rows:
        row["questions"] = [f"Does the text say what {row['summary'].split()[0]} did?", "Is a date given?"]
    write(src, rows)
    ours, theirs = tmp_path / "ours.jsonl", tmp_path / "theirs.jsonl"
    for path, judge in ((ours, ["--model", "smollm2-135m"]), (theirs, served(server))):
        done = score(src, path, *judge)
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    compared = 0
    for mine, other in zip(rows_of(ours), rows_of(theirs), strict=True):
        pairs = [
            (a["p_supported"], b["p_supported"], a["supported"], b["supported"])
            for a, b in zip(mine["claims"], other["claims"], strict=True)
        ]
        pairs += [
            (a["p_answered"], b["p_answered"], a["answered"], b["answered"])
            for a, b in zip(mine["coverage_verdicts"], other["coverage_verdicts"], strict=True)
        ]
        for p_ours, p_theirs, v_ours, v_theirs in pairs:
            assert p_theirs is not None, f"{other['id']}: P(yes) not read from llama-server"
            assert abs(p_ours - p_theirs) <= TOLERANCE, (other["id"], p_ours, p_theirs)
            if v_ours != v_theirs:
                assert min(abs(p_ours - 0.5), abs(p_theirs - 0.5)) <= TOLERANCE, (other["id"], p_ours, p_theirs)
            compared += 1
    assert compared >= 30


def test_a_design_that_needs_a_texts_likelihoods_is_refused_before_anything_is_asked(server, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(src, [json.loads(line) for line in DEMO.open()])
    args = [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out), *served(server)]
    done = subprocess.run(
        [*args, "--verdicts", "likelihood", "--no-cache"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = [line for line in done.stderr.splitlines() if "likelihood" in line]
    assert len(said) == 1 and said[0].startswith("Error: the judge at http://127.0.0.1"), done.stderr
    assert "cannot give likelihood verdicts" in said[0] and "--verdicts yes-no" in said[0], said
    assert not rows_of(out)


def four_rows(path) -> list[str]:
    demo = [json.loads(line) for line in DEMO.open()]
    rows = [dict(demo[i % len(demo)], id=f"row-{i}") for i in range(4)]
    write(path, rows)
    return [r["id"] for r in rows]


def start_and_wait(server, src, out, *extra):
    run = score(src, out, *served(server), wait=False, extra=("--chunk-size", "1", "--in-flight", "1", *extra))
    deadline = time.time() + 300
    while len(rows_of(out)) < 2:
        assert run.poll() is None, run.stdout.read()
        assert time.time() < deadline, "fewer than 2 rows in OUTPUT after 300 s"
        time.sleep(0.1)
    return run


def test_a_stalled_server_fails_the_open_rows_by_name_and_keeps_the_finished(server, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = four_rows(src)
    run = start_and_wait(server, src, out, "--judge-timeout", "4")
    server.pause()
    try:
        said = run.communicate(timeout=300)[0]
    finally:
        server.resume()
    assert run.returncode == 1, said
    rows = {r["id"]: r for r in rows_of(out)}
    failed = [r for r in rows.values() if r.get("error")]
    assert sorted(rows) == sorted(ids) and len(rows) - len(failed) >= 2 and failed, said
    assert all("did not answer within the 4 s" in r["error"]["message"] for r in failed), failed[0]["error"]


def test_ctrl_c_while_the_server_stalls_ends_the_run_within_seconds(server, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    four_rows(src)
    run = start_and_wait(server, src, out)
    server.pause()
    try:
        time.sleep(0.5)
        sent = time.time()
        run.send_signal(signal.SIGINT)
        said = run.communicate(timeout=10)[0]
        took = time.time() - sent
    finally:
        server.resume()
        run.kill()
    assert run.returncode == 130 and took < 10, (run.returncode, took, said)
    kept = rows_of(out)
    assert len(kept) >= 2 and not any(r.get("error") for r in kept) and f"{len(kept)} rows kept" in said


def test_a_server_killed_mid_run_fails_the_open_rows_and_resume_finishes(server, tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ids = four_rows(src)
    run = start_and_wait(server, src, out, "--judge-timeout", "4")  # refused connections retried for 4 s, not 15
    server.stop()
    said = run.communicate(timeout=300)[0]
    assert run.returncode == 1, said
    first = rows_of(out)
    finished = [r for r in first if not r.get("error")]
    failed = [r for r in first if r.get("error")]
    assert len(first) == 4 and len(finished) >= 2 and failed, said
    assert all("Connection refused" in r["error"]["message"] for r in failed), failed[0]["error"]
    server.start()
    again = score(src, out, *served(server), extra=("--resume",))
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    final = {r["id"]: r for r in rows_of(out)}
    assert sorted(final) == sorted(ids) and not any(r.get("error") for r in final.values())
    for r in finished:  # nothing finished was lost or redone
        assert final[r["id"]]["stages"] == r["stages"]
