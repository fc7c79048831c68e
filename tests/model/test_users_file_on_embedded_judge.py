"""A user's own file (tests/data/two_systems.csv: `doc,article,summary,model`, five documents, two systems, errors
planted in system B) scored by the real embedded judge through the CLI, as a new user would: the evidence its
reasons give names only words the texts hold, a paraphrase that opens differently from the article has no conflict,
a number written in words is a number, and the user is told what this judge is good for."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.model

FILE = Path(__file__).resolve().parent.parent / "data" / "two_systems.csv"
NUMBER = re.compile(r"\d[\d,.]*\d|\d")
EVIDENCE = re.compile(r"'([^']*)' where the source makes the judge expect '([^']*)'")


def sumscore(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "offline_sumscore", *args], capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    out = tmp_path_factory.mktemp("users_file") / "out.jsonl"
    proc = sumscore("score", str(FILE), "-o", str(out), "--source-field", "article", "--no-cache", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc, [json.loads(line) for line in out.read_text().splitlines()], out


def numbers(text: str) -> set[str]:
    return set(NUMBER.findall(text))


def test_no_reason_or_evidence_names_a_number_neither_text_holds(scored):
    _, rows, _ = scored
    assert len(rows) == 10 and not any(r.get("error") for r in rows)
    for row in rows:
        held = numbers(row["input"]["article"]) | numbers(row["input"]["summary"])
        for written, expected in EVIDENCE.findall(row["reason"]):
            assert numbers(written) | numbers(expected) <= held, (row["line"], row["reason"])
        for entry in row["claims"] + row["coverage_verdicts"]:
            for what in ("conflict", "evidence"):
                if entry.get(what):
                    assert numbers(entry[what]["expected_word"] or "") <= held, (row["line"], entry[what])
    # the planted "21 million" (the article says 12): the judge expects "12", never the glued "11"
    budget = next(r for r in rows if r["input"]["doc"] == "d2" and r["input"]["model"] == "B")
    conflict = budget["claims"][0]["conflict"]
    assert (conflict["word"], conflict["expected_word"]) == ("21", "12")
    # the reason names the figure the article gives in its place, with the words after it
    assert "(21 million: the source says 12 million dollar budget)" in budget["reason"], budget["reason"]


def test_a_paraphrase_that_opens_unlike_the_article_has_no_conflict(scored):
    _, rows, _ = scored
    trial = next(r for r in rows if r["input"]["summary"].startswith("In a 1,200-patient trial"))
    (claim,) = trial["claims"]
    assert "conflict" not in claim and claim["supported"], claim
    # the judge did expect the article's first word there: the evidence still says so, as a whole word
    assert claim["evidence"]["word"] == "In" and claim["evidence"]["expected_word"] == "Pharmaceutical"


def test_a_duration_written_in_words_is_a_changed_number(scored):
    _, rows, _ = scored
    fire = next(r for r in rows if r["input"]["doc"] == "d3" and r["input"]["model"] == "B")
    (claim,) = fire["claims"]
    assert not claim["supported"] and claim["conflict"]["word"] == "two"
    assert claim["conflict"]["expected_word"] == "six"


def test_the_embedded_judge_says_what_it_is_good_for_on_stdout_and_in_the_report(scored, tmp_path):
    proc, rows, out = scored
    assert "note: scored by the embedded judge" in proc.stdout and "--model DIR" in proc.stdout
    assert proc.stdout.index("mean score") < proc.stdout.index("lowest 5 of 10") < proc.stdout.index("note:")
    assert all(r["input"]["doc"] and r["input"]["model"] in ("A", "B") for r in rows)
    page = tmp_path / "report.html"
    assert sumscore("report", str(out), "-o", str(page)).returncode == 0
    html = page.read_text()
    assert "id=embedded-judge" in html and "(doc d2, model B)" in html
    compared = sumscore("compare", str(out), "--system-field", "model")
    assert compared.returncode == 0 and "5 documents scored by every system" in compared.stdout
