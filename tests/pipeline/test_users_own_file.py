"""A user's own file, end to end, on a scripted judge (fixed verdicts: the arithmetic and the plumbing, no model):
`doc,article,summary,model`, five documents with a summary from each of two systems (tests/data/two_systems.csv).
Their columns reach OUTPUT in every format and the report; one file compares its systems; every command that reads
rows takes the same field flags, and a missing column's error proposes the flag; a finished run leaves no working
file and can still be resumed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from offline_sumscore.cli import main
from offline_sumscore.io.outputs import read_results
from tests.conftest import write_jsonl

FILE = Path(__file__).resolve().parent.parent / "data" / "two_systems.csv"
LIKELIHOOD = ["--claims", "sentences", "--coverage", "key_sentences", "--key-sentences", "1"]
LIKELIHOOD += ["--verdicts", "likelihood", "--no-cache", "--quiet"]


def given_rows() -> list[dict]:
    with open(FILE, newline="") as fh:
        return list(csv.DictReader(fh))


def enqueue(scripted, pmis: list[float]):
    """One summary-sentence claim and one key sentence per row; each claim's PMI as given (the baselines -5)."""
    for pmi in pmis:
        scripted.enqueue("support", {"mean_logprob": pmi - 5.0, "tokens": 4})
        scripted.enqueue("coverage", {"mean_logprob": -2.0, "tokens": 4})
        scripted.enqueue("baseline", {"mean_logprob": -5.0, "tokens": 4}, {"mean_logprob": -5.0, "tokens": 4})


# System A faithful (high PMI), B with its planted errors (low PMI on d2, d3, d4), in the file's row order
PMIS = [3.0, 2.8, 3.1, 1.0, 2.9, 0.5, 3.2, 0.2, 2.7, 2.6]


def score(tmp_path, scripted, output: str, *extra: str):
    enqueue(scripted, PMIS)
    out = tmp_path / output
    target = str(out) + ("/" if output.endswith("/") else "")  # a folder of shards is named with its slash
    args = ["score", str(FILE), "-o", target, "--source-field", "article", *LIKELIHOOD, *extra]
    return CliRunner().invoke(main, args, catch_exceptions=False), out


def test_the_missing_column_error_names_the_flag_and_the_closest_column(tmp_path, use_scripted):
    result = CliRunner().invoke(main, ["score", str(FILE), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2
    assert "CSV header lacks column(s) source" in result.output
    assert "--source-field (closest: --source-field article)" in result.output
    labelled = write_jsonl(tmp_path / "l.jsonl", [{"article": "A text.", "summary": "A.", "label": "consistent"}])
    result = CliRunner().invoke(main, ["calibrate", str(labelled), "--quiet"])
    assert result.exit_code == 2 and 'field "source" is missing; this row has article, summary, label' in result.output
    assert "(closest: --source-field article)" in result.output


@pytest.mark.parametrize("output", ["out.jsonl", "out.csv", "out.parquet", "shards/"])
def test_every_input_column_reaches_output_apart_from_ours(tmp_path, use_scripted, output):
    result, out = score(tmp_path, use_scripted, output)
    assert result.exit_code == 0, result.output
    files = sorted(out.glob("part-*")) if output.endswith("/") else [out]
    rows = [r for f in files for r in read_results(f)]
    assert [r["input"] for r in rows] == given_rows()  # every column, untouched, in order
    assert [int(r["line"]) for r in rows] == list(range(2, 12)) and all(r["id"] in (None, "") for r in rows)
    assert all(isinstance(r["score"], (int, float, str)) for r in rows)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out") or p.name == "shards")
    left += sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    assert not any("rows.jsonl" in name for name in left), left  # no working file once the run is whole
    if output == "out.csv":
        header = out.read_text().splitlines()[0].split(",")
        assert header[:5] == ["id", "input.doc", "input.article", "input.summary", "input.model"]


def test_a_users_column_named_like_ours_cannot_overwrite_a_score(tmp_path, use_scripted):
    rows = [{"source": "The council met on Tuesday.", "summary": "The council met.", "score": "my own", "id": "r1"}]
    enqueue(use_scripted, [3.0])
    out = tmp_path / "o.csv"
    args = ["score", str(write_jsonl(tmp_path / "in.jsonl", rows)), "-o", str(out), *LIKELIHOOD]
    assert CliRunner().invoke(main, args, catch_exceptions=False).exit_code == 0
    (row,) = read_results(out)
    # the embedded design's coverage is the mean P(covered) of its key sentences: sigmoid(3.0 - 2.0) = 0.73
    assert float(row["score"]) == 0.73 and row["input"]["score"] == "my own" and row["input"]["id"] == "r1"


def test_resume_after_a_finished_csv_run_reads_its_rows_back(tmp_path, use_scripted):
    result, out = score(tmp_path, use_scripted, "out.csv")
    first = out.read_text()
    again = CliRunner().invoke(
        main, ["score", str(FILE), "-o", str(out), "--source-field", "article", *LIKELIHOOD, "--resume"]
    )
    assert again.exit_code == 0, again.output
    assert "10 rows kept from OUTPUT" in again.output and out.read_text() == first  # no row scored twice
    assert not Path(f"{out}.rows.jsonl").exists()


def test_the_cli_names_the_lowest_rows_by_line_and_the_users_columns(tmp_path, use_scripted):
    result, _ = score(tmp_path, use_scripted, "out.jsonl")
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("lowest 5 of 10"))
    assert lines[start + 1].startswith("  0.000  line 5 (doc d2, model B): The score is 0 because alignment (0)")
    assert "embedded judge" not in result.output  # a scripted judge is no embedded one: no note


def test_one_file_compares_its_systems_by_a_column(tmp_path, use_scripted):
    _, out = score(tmp_path, use_scripted, "out.jsonl")
    result = CliRunner().invoke(
        main, ["compare", str(out), "--system-field", "model", "--json", str(tmp_path / "c.json")]
    )
    assert result.exit_code == 0, result.output
    assert "5 documents scored by every system" in result.output
    report = json.loads((tmp_path / "c.json").read_text())
    assert {s["name"] for s in report["systems"]} == {"A", "B"}
    assert report["pairs"][0]["fields"]["alignment"]["mean_diff"] == pytest.approx(0.6)  # A 5/5, B 2/5 supported
    by_doc = CliRunner().invoke(
        main,
        [
            "compare",
            str(out),
            "--system-field",
            "model",
            "--document-field",
            "doc",
            "--id-field",
            "doc",
            "-o",
            str(tmp_path / "c.html"),
        ],
    )
    assert by_doc.exit_code == 0, by_doc.output
    assert "d4" in (tmp_path / "c.html").read_text()
    missing = CliRunner().invoke(main, ["compare", str(out), "--system-field", "team"])
    assert missing.exit_code == 2 and "row line 2 has no 'team' field" in missing.output


def test_the_report_names_rows_by_the_users_columns_and_its_wall_time(tmp_path, use_scripted):
    _, out = score(tmp_path, use_scripted, "out.jsonl")
    page = tmp_path / "r.html"
    assert CliRunner().invoke(main, ["report", str(out), "-o", str(page)]).exit_code == 0
    html = page.read_text()
    assert "line 9 (doc d4, model B)" in html and "id=embedded-judge" not in html
    assert "wall time</dt><dd>" in html and "summed over stages" not in html
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len({r["timing"]["run_started"] for r in rows}) == 1


def test_calibrate_takes_the_same_field_flags_as_score(tmp_path, use_scripted):
    labels = ["consistent", "consistent", "consistent", "inconsistent", "consistent"]
    labels += ["inconsistent", "consistent", "inconsistent", "consistent", "consistent"]
    labelled = tmp_path / "labelled.csv"
    with open(labelled, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["doc", "article", "summary", "model", "verdict"])
        writer.writeheader()
        writer.writerows(dict(row, verdict=y) for row, y in zip(given_rows(), labels))
    enqueue(use_scripted, PMIS)
    args = ["calibrate", str(labelled), "--source-field", "article", "--label-field", "verdict", "--quiet"]
    result = CliRunner().invoke(main, [*args, "-o", str(tmp_path / "cal.json")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "balanced accuracy 1.000" in result.output and "10 rows (7 consistent)" in result.output


def test_a_truncated_jsonl_line_says_where_once(tmp_path, use_scripted):
    src = tmp_path / "in.jsonl"
    src.write_text('{"source": "A text that goes on.", "summary": "A text')
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), "--quiet"])
    assert "(Unterminated string starting at: column 47)" in result.output and "at at" not in result.output
