"""The real `sumscore score` command fed generated malformed input (seeded, so a failure reproduces): truncated
files, random bytes, mixed encodings, huge fields, wrong types. Whatever comes in: no traceback, an exit code in
{0, 1, 2}, every good row scored, every bad row named by its line, and the input file unchanged. The embedded
judge at its defaults scores a row in a fraction of a second, so the real command runs each case."""

import gzip
import json
import os
import random
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model

SOURCE = "The council of Lindford voted on Tuesday to build a library on Mill Street. Work begins in March."


def good(rng, n):
    return {
        "id": f"g{n}",
        "source": SOURCE,
        "summary": rng.choice(["Lindford will build a library.", "Work on the library begins in March."]),
    }


def bad_line(rng, n) -> bytes:
    """One malformed JSONL line of a random kind."""
    kind = rng.randrange(9)
    if kind == 0:
        return json.dumps(good(rng, n)).encode()[: rng.randrange(5, 40)]  # cut mid-object
    if kind == 1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60))).replace(b"\n", b" ").replace(b"\r", b" ")
    if kind == 2:
        return json.dumps(dict(good(rng, n), summary="Caf\u00e9 in Lindford."), ensure_ascii=False).encode("latin-1")
    if kind == 3:
        return json.dumps({"id": f"b{n}", "source": rng.choice([5, None, [], {"a": 1}]), "summary": "x"}).encode()
    if kind == 4:
        return json.dumps([SOURCE, "x"]).encode()  # a row that is not an object
    if kind == 5:
        return json.dumps({"id": f"b{n}", "source": SOURCE, "summary": "x" * 200_000}).encode()  # huge, too long
    if kind == 6:
        return json.dumps({"id": {"nested": n}, "source": SOURCE, "summary": "x"}).encode()
    if kind == 7:
        return json.dumps({"id": f"b{n}", "source": SOURCE + "\u0007", "summary": "x"}).encode()
    return json.dumps({"id": "g0", "source": SOURCE, "summary": "A repeat of the first id."}).encode()


def cases():
    rng = random.Random(20261130)
    mixed, expected = [], []
    for n in range(14):
        if n == 0 or rng.random() < 0.5:
            mixed.append(json.dumps(good(rng, n)).encode())
            expected.append(True)
        else:
            mixed.append(bad_line(rng, n))
            expected.append(False)
    body = b"\n".join(mixed) + b"\n"
    cut = body[: len(body) - rng.randrange(5, 30)]  # a file cut off inside its last line
    csv_lines = [
        "id,source,summary",
        f'c1,"{SOURCE}",A library.',
        "c2,only two",
        f'c3,"{SOURCE}",Work, in March',
        f'c4,"{SOURCE}","Quoted, with a comma."',
    ]
    return {
        "mixed.jsonl": (body, expected),
        "cut.jsonl": (cut, expected[:-1] + [False]),
        "random.jsonl": (bytes(rng.randrange(256) for _ in range(3000)), None),
        "ragged.csv": ("\n".join(csv_lines).encode() + b"\n", [True, False, False, True]),
        "cut.jsonl.gz": (gzip.compress(body)[:-40], None),
    }


@pytest.mark.parametrize("name", list(cases()))
def test_malformed_input_never_crashes_and_loses_no_good_row(tmp_path, name):
    data, expected = cases()[name]
    src = tmp_path / name
    src.write_bytes(data)
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out), "--quiet", "--no-cache"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode in (0, 1, 2), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert src.read_bytes() == data  # the input is never touched
    if proc.returncode == 2:  # the whole file is unreadable: one line that says so
        assert expected is None and proc.stderr.strip().startswith("Error:") and str(src) in proc.stderr
        return
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    if expected is None:
        expected = [False] * len(rows)
    assert len(rows) == len(expected)
    for row, ok in zip(rows, expected):
        if ok:
            assert row.get("error") is None and 0 <= row["score"] <= 1, row.get("error")
        else:
            assert row["score"] is None and f":{row['line']}" in row["error"]["message"], row["error"]
