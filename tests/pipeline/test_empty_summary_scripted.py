"""An empty summary is a result, not a failed row (issue 67): `sumscore score` writes it scored 0 with its reason, and
`sumscore compare` keeps its document and counts the 0 against the system that wrote nothing. Scripted judge."""

import json

import pytest
from click.testing import CliRunner

from offline_sumscore.cli import main
from offline_sumscore.io.outputs import read_results
from offline_sumscore.scorers.reasons import EMPTY_SUMMARY_REASON
from tests.conftest import SOURCE, SUMMARY, enqueue_two_axis, write_jsonl

DOCS = {
    "d1": SOURCE,
    "d2": "Heavy rain flooded parts of the river town of Ostby overnight. About 200 homes were evacuated.",
    "d3": "Marta Ruiz won the regional chess championship in Valencia on Sunday. She is 17 years old.",
}


def score(tmp_path, rows, name, *options):
    src, out = write_jsonl(tmp_path / f"{name}.in.jsonl", rows), tmp_path / f"{name}.jsonl"
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet", *options], catch_exceptions=False)
    return result, out


@pytest.mark.parametrize("metric", ["two-axis", "summary-score"])
def test_scripted_cli_writes_an_empty_summary_as_a_scored_row_without_error(tmp_path, use_scripted, metric):
    rows = [
        {"id": "empty", "source": SOURCE, "summary": ""},
        {"id": "blank", "source": SOURCE, "summary": " \n\t "},
        {"id": "short-source", "source": "Rain.", "summary": "        "},  # whitespace is no sign of swapped columns
    ]
    result, out = score(tmp_path, rows, "sys", "--metric", metric)
    assert result.exit_code == 0, result.output
    written = read_results(out)
    assert [r["id"] for r in written] == ["empty", "blank", "short-source"]
    for row in written:
        assert row["score"] == 0 and row.get("error") is None and row["empty_summary"] is True
        assert row["reason"] == EMPTY_SUMMARY_REASON and row["stages"] == {}
    assert use_scripted.requests == []  # no judge call
    assert f"metric {metric}: 3 rows, 0 failed" in result.output


def test_scripted_cli_scores_an_empty_csv_cell_and_still_fails_an_empty_source(tmp_path, use_scripted):
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    src.write_text(f'id,source,summary\nnothing,"{SOURCE}",\nno-source," ",A summary.\n')
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 1  # the empty source's row failed, alone
    nothing, no_source = read_results(out)
    assert float(nothing["score"]) == 0 and not nothing["error"] and nothing["reason"] == EMPTY_SUMMARY_REASON
    assert no_source["error"]["cause"] == "input:empty_text" and no_source["error"]["field"] == "source"
    assert 'in.csv:3 (id "no-source"): field "source" is empty' in no_source["error"]["message"]


def test_scripted_compare_keeps_the_document_whose_summary_is_empty_and_counts_its_0(tmp_path, use_scripted):
    written = [{"doc": d, "source": s, "summary": SUMMARY} for d, s in DOCS.items()]
    silent = [dict(row, summary="" if row["doc"] == "d3" else SUMMARY) for row in written]
    enqueue_two_axis(use_scripted, 5)  # every row with a summary scores 0.5 (conftest's exchange)
    _, a = score(tmp_path, written, "writer")
    _, b = score(tmp_path, silent, "silent")
    js = tmp_path / "compare.json"
    result = CliRunner().invoke(
        main,
        ["compare", str(a), str(b), "--by", "doc", "--json", str(js), "--resamples", "200"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "3 documents scored by every system" in result.output and "left out" not in result.output
    report = json.loads(js.read_text())
    assert report["systems"][1]["failed"] == 0 and report["systems"][1]["scored"] == 3
    stats = report["pairs"][0]["fields"]["score"]
    assert (stats["mean_a"], stats["mean_b"]) == (0.5, pytest.approx(1 / 3))  # the silent system's 0 counts
    assert (stats["wins"], stats["ties"], stats["losses"]) == (1, 2, 0)
