"""A run stops when asked and keeps what it finished, on a served judge that answers a few requests and then stops
answering (a loopback server, no model): Ctrl-C ends it within seconds with its finished rows in OUTPUT; killed
outright, OUTPUT holds them too, since every row is written the moment it is final; and a server that stops
answering fails its requests within --judge-timeout, naming it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.openai_compatible import ServedEngine
from offline_sumscore.scorers.stages.verdict import yes_no_verdict
from tests.conftest import as_in_a_terminal, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
REPLIES = {"claims": '{"claims": ["A library will be built."]}', "questions": '{"questions": ["Is it built?"]}'}


class StallingServer:
    """Answers its first `answered` requests at once (claims, questions or "Yes"), then holds every later one open
    without a word, as a stuck server does."""

    def __init__(self, answered: int):
        self.answered, self.seen, self.release = answered, 0, threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.seen += 1
                if outer.seen > outer.answered:
                    outer.release.wait(120)  # stuck: no reply until the test ends
                    return
                stage = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
                content = REPLIES.get(stage, "Yes")
                payload = {"choices": [{"message": {"content": content}, "finish_reason": "stop"}]}
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(payload).encode())

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.release.set()
        self.httpd.shutdown()


@pytest.fixture
def stalling():
    server = StallingServer(answered=8)  # one sample at a time, 4 requests each: two rows, then nothing
    yield server
    server.close()


def sigint_ignored():
    """A child's preexec_fn: SIGINT ignored, as a shell without job control starts a script's background job (`sumscore
    score ... &`); the run must install its own handler, or Ctrl-C and `kill -INT` do nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def start_run(tmp_path, url: str, started_as=as_in_a_terminal) -> tuple[subprocess.Popen, Path]:
    rows = [{"id": f"r{i}", "source": f"Source number {i} is long enough to judge.", "summary": "S."} for i in range(6)]
    src, out = write_jsonl(tmp_path / "in.jsonl", rows), tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out), "--judge-url", url]
    command += ["--judge-model", "m", "--verdicts", "yes-no", "--claims", "atomic", "--coverage", "questions"]
    command += ["--max-questions", "1", "--no-reason", "--in-flight", "1", "--judge-concurrency", "1", "--no-cache"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    output = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    proc = subprocess.Popen(command, cwd=ROOT, env=env, preexec_fn=started_as, **output)
    return proc, out


def rows_in(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines() if line.endswith("}")] if out.exists() else []


def wait_for_rows(out: Path, proc: subprocess.Popen, n: int, seconds: float = 60) -> None:
    deadline = time.time() + seconds
    while len(rows_in(out)) < n:
        assert proc.poll() is None, proc.stdout.read()
        assert time.time() < deadline, f"fewer than {n} rows in OUTPUT after {seconds} s"
        time.sleep(0.1)


def interrupt(proc) -> tuple[str, float]:
    """SIGINT to the run: what it said, and the seconds it took to end (at most 10: past that the test fails)."""
    interrupted = time.time()
    proc.send_signal(signal.SIGINT)
    said, _ = proc.communicate(timeout=10)
    return said, time.time() - interrupted


@pytest.mark.parametrize("started_as", [as_in_a_terminal, sigint_ignored])
def test_ctrl_c_on_a_served_judge_ends_the_run_within_seconds_keeping_its_finished_rows(tmp_path, stalling, started_as):
    proc, out = start_run(tmp_path, stalling.url, started_as)
    try:
        wait_for_rows(out, proc, 2)
        time.sleep(0.5)  # the next row's requests are out, and the server holds them
        said, took = interrupt(proc)
    finally:
        proc.kill()
    assert proc.returncode == 130 and took < 10, (proc.returncode, took, said)
    assert f"interrupted: 2 rows kept in {out}" in said
    assert [r["id"] for r in rows_in(out)] == ["r0", "r1"]


class SilentServer:
    """Accepts every connection and reads what is sent, and never answers a byte: a server hung before its first
    reply."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.accepted = threading.Event()
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed: the test is over
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()
            self.accepted.set()

    @staticmethod
    def _read(conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


def test_a_run_started_with_sigint_ignored_on_a_silent_server_ends_at_sigint_within_seconds(tmp_path):
    """SIGINT ignored by the parent (a script's background job) and a server that never answers: the run used to
    wait out every request's --judge-timeout (over 40 s); SIGINT ends it within seconds, exit 130, nothing written as
    finished."""
    server = SilentServer()
    proc, out = start_run(tmp_path, server.url, sigint_ignored)
    try:
        assert server.accepted.wait(60), "the run sent no request"
        time.sleep(2)  # the run waits on its requests
        assert proc.poll() is None, proc.stdout.read()
        said, took = interrupt(proc)
    finally:
        proc.kill()
        server.close()
    assert proc.returncode == 130 and took < 10, (proc.returncode, took, said)
    assert "Traceback" not in said and f"interrupted: 0 rows kept in {out}" in said
    assert rows_in(out) == []


def test_a_run_killed_after_its_first_rows_finds_them_in_output(tmp_path, stalling):
    proc, out = start_run(tmp_path, stalling.url)
    try:
        wait_for_rows(out, proc, 2)
    finally:
        proc.kill()  # SIGKILL: nothing runs after it
        proc.wait()
    assert [r["id"] for r in rows_in(out)] == ["r0", "r1"]  # each written the moment it was final, fsynced


def test_a_server_that_stops_answering_fails_the_request_within_its_timeout_naming_it():
    server = StallingServer(answered=0)
    try:
        engine = ServedEngine(server.url, "m", timeout=1.5, concurrency=1)
        request = StageRequest(
            "s", "coverage", ({"role": "user", "content": "Q?"},), yes_no_verdict(None), verdict_choice=("Y", "N")
        )
        started = time.time()
        (result,) = engine.run([request])
        took = time.time() - started
    finally:
        server.close()
    assert took < 4 and result.error_kind == "model"
    assert "did not answer within the 1.5 s a request may take (--judge-timeout" in result.error
