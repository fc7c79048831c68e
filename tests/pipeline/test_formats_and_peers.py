"""Formats (JSONL, CSV, Parquet, datasets directories, DataFrames) and the peer-shaped outputs, on a scripted judge."""

import pytest
from click.testing import CliRunner

from offline_sumscore import SummarizationScorer, SummaryScore
from offline_sumscore.cli import main
from offline_sumscore.io.outputs import read_results, write_rows
from offline_sumscore.peers.mastra import to_mastra
from offline_sumscore.runs.files import score_file
from offline_sumscore.runs.frame import score_frame
from offline_sumscore.testing import assert_summary
from tests.conftest import QUESTIONS, enqueue_two_axis, write_jsonl

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

ROWS = [
    {"id": "a", "source": "Source A is long enough to judge.", "summary": "Sum A"},
    {"id": "b", "source": "Source B is long enough to judge.", "summary": "Sum B"},
]


def feed(scripted, n):
    enqueue_two_axis(scripted, n)


def scored_rows(scripted):
    feed(scripted, 2)
    return [r.to_dict() for r in SummarizationScorer(engine=scripted).score_many(ROWS)]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_results_round_trip_through_each_output_format(tmp_path, scripted, suffix):
    rows = scored_rows(scripted)
    path = tmp_path / f"out{suffix}"
    write_rows(rows, path)
    back = read_results(path)
    assert [r["id"] for r in back] == ["a", "b"]
    for key in ("claims", "coverage_verdicts", "questions", "stages", "judge", "settings"):
        assert back[0][key] == rows[0][key], key  # nested again after the round trip
    if suffix == ".csv":
        raw = (tmp_path / "out.csv").read_text()
        assert '"[{""claim"": ""Lindford will build a library.""' in raw  # a JSON string in the CSV cell
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        assert pa.types.is_list(schema.field("claims").type)  # verdict lists stay nested in Parquet
        assert pa.types.is_string(schema.field("stages").type)  # per-row audit keys: a JSON string


def test_cli_reads_parquet_and_writes_csv(tmp_path, use_scripted):
    feed(use_scripted, 2)
    src = tmp_path / "in.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), src)
    out = tmp_path / "out.csv"
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    back = read_results(out)
    assert [r["id"] for r in back] == ["a", "b"] and [float(r["score"]) for r in back] == [0.5, 0.5]


def test_cli_reads_a_datasets_save_to_disk_directory(tmp_path, use_scripted):
    datasets = pytest.importorskip("datasets")
    feed(use_scripted, 2)
    datasets.Dataset.from_list(
        [{"doc": r["source"], "abstract": r["summary"], "id": r["id"]} for r in ROWS]
    ).save_to_disk(str(tmp_path / "ds"))
    out = tmp_path / "out.parquet"
    result = CliRunner().invoke(
        main,
        [
            "score",
            str(tmp_path / "ds"),
            "-o",
            str(out),
            "--source-field",
            "doc",
            "--summary-field",
            "abstract",
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    assert [r["id"] for r in read_results(out)] == ["a", "b"]


def test_an_empty_directory_is_one_line(tmp_path, use_scripted):
    (tmp_path / "d").mkdir()
    result = CliRunner().invoke(main, ["score", str(tmp_path / "d"), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2 and "is a directory with no .jsonl, .json, .csv, .parquet shards" in result.output


def test_a_folder_of_shards_is_one_input_in_name_order(tmp_path, use_scripted):
    import pyarrow.parquet as pq

    feed(use_scripted, 3)
    shards = tmp_path / "shards"
    shards.mkdir()
    write_jsonl(shards / "part-0.jsonl", [ROWS[0]])
    pq.write_table(pa.Table.from_pylist([ROWS[1], dict(ROWS[0], summary="Dup")]), shards / "part-1.parquet")
    write_jsonl(shards / "part-2.jsonl", [{"source": "No id here, long enough.", "summary": "x"}])
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(shards), "-o", str(out), "--quiet"])
    rows = read_results(out)
    assert result.exit_code == 1 and [r["id"] for r in rows] == ["a", "b", "a", None]  # no id given: null
    assert rows[2]["error"]["cause"] == "input:duplicate_id" and "part-0.jsonl" in rows[2]["error"]["message"]
    assert rows[3]["row_key"] == "line:part-2.jsonl:1" and rows[3]["score"] == 0.5


def test_score_frame_adds_result_columns_in_order_and_marks_a_bad_row(scripted):
    feed(scripted, 2)
    df = pd.DataFrame(
        {"text": [ROWS[0]["source"], "   ", ROWS[1]["source"]], "summ": [ROWS[0]["summary"], "x", ROWS[1]["summary"]]}
    )
    out = score_frame(df, source="text", summary="summ", scorer=SummarizationScorer(engine=scripted))
    assert out["score"][0] == out["score"][2] == 0.5 and pd.isna(out["score"][1])  # pandas' missing value
    assert out.loc[1, "error"]["cause"] == "input:empty_text" and "text" in out.loc[1, "error"]["message"]
    assert out.loc[0, "claims"][2]["supported"] is False and list(out["text"]) == list(df["text"])
    with pytest.raises(ValueError, match="no column 'document'"):
        score_frame(df, source="document", summary="summ", scorer=SummarizationScorer(engine=scripted))


def test_mastra_shape_names_every_field_as_mastra_does(tmp_path, use_scripted):
    feed(use_scripted, 1)
    src, out = write_jsonl(tmp_path / "in.jsonl", ROWS[:1]), tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--output-format", "mastra", "--quiet"])
    assert result.exit_code == 0, result.output
    (row,) = read_results(out)
    assert set(row) == {"id", "score", "reason", "preprocessStepResult", "analyzeStepResult"}
    assert row["preprocessStepResult"]["alignment"][2] == {
        "claim": "It costs 5 million pounds.",
        "supported": False,
        "reason": "the source says 4 million",
    }
    assert row["preprocessStepResult"]["questions"] == QUESTIONS["questions"]
    assert row["analyzeStepResult"]["coverage"][1] == {
        "question": "Will construction begin in March?",
        "answered": False,
        "reason": "no date given",
    }
    assert not (tmp_path / "out.jsonl.rows.jsonl").exists()  # the working record is gone once the run is whole
    with pytest.raises(ValueError, match="two-axis"):
        to_mastra({"metric": "summary-score", "score": 1})


def test_ragas_style_result_has_value(scripted):
    scripted.enqueue("keyphrases", {"keyphrases": ["Some text"]}).enqueue(
        "ragas_questions", {"questions": ["Is it so?"]}
    )
    scripted.enqueue("ragas_answers", {"answer": "1"})
    r = SummaryScore(engine=scripted, length_penalty=False).score(
        reference_contexts=["Some text.", "More."], response="Text."
    )
    assert r.value == r.score == 1.0


def test_assert_summary_fails_with_the_reason_and_the_failing_verdicts(scripted):
    feed(scripted, 1)
    with pytest.raises(AssertionError) as exc:
        assert_summary(
            ROWS[0]["source"], ROWS[0]["summary"], min_score=0.7, scorer=SummarizationScorer(engine=scripted)
        )
    text = str(exc.value)
    assert text.startswith("summary scored 0.50 < 0.70: The score is 0.5 because coverage")
    assert "unsupported claim: It costs 5 million pounds. (the source says 4 million)" in text
    assert "unanswered question: Will construction begin in March?" in text
    feed(scripted, 1)
    assert (
        assert_summary(
            ROWS[0]["source"], ROWS[0]["summary"], min_score=0.5, scorer=SummarizationScorer(engine=scripted)
        ).score
        == 0.5
    )


class Case:  # DeepEval's LLMTestCase fields, for a run without deepeval installed
    def __init__(self, input, actual_output):
        self.input, self.actual_output = input, actual_output


def test_deepeval_shaped_metric_measures_with_threshold_and_strict_mode(scripted):
    from offline_sumscore.peers.deepeval import LocalSummarizationMetric

    feed(scripted, 2)
    metric = LocalSummarizationMetric(threshold=0.4, scorer=SummarizationScorer(engine=scripted))
    assert metric.measure(Case(ROWS[0]["source"], ROWS[0]["summary"])) == 0.5
    assert metric.success and metric.is_successful() and metric.reason.startswith("The score is 0.5")
    strict = LocalSummarizationMetric(strict_mode=True, scorer=SummarizationScorer(engine=scripted, strict_mode=True))
    strict.measure(Case(ROWS[0]["source"], ROWS[0]["summary"]))
    assert strict.score == 0.0 and not strict.success and strict.threshold == 1


def test_deepeval_metric_runs_inside_deepeval_when_installed(scripted):
    deepeval = pytest.importorskip("deepeval")
    from deepeval.metrics import BaseMetric
    from deepeval.test_case import LLMTestCase

    from offline_sumscore.peers.deepeval import LocalSummarizationMetric

    feed(scripted, 1)
    metric = LocalSummarizationMetric(
        threshold=0.4, scorer=SummarizationScorer(engine=scripted), assessment_questions=QUESTIONS["questions"]
    )
    assert isinstance(metric, BaseMetric)
    metric.measure(LLMTestCase(input=ROWS[0]["source"], actual_output=ROWS[0]["summary"]))
    assert metric.score == 0.5 and metric.is_successful()
    assert deepeval is not None


def test_python_api_scores_a_parquet_file_into_csv(tmp_path, scripted):
    import pyarrow.parquet as pq

    feed(scripted, 2)
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "in.parquet")
    run = score_file(tmp_path / "in.parquet", tmp_path / "out.csv", SummarizationScorer(engine=scripted))
    assert [r["score"] for r in run.report.rows] == [0.5, 0.5]
    assert [r["id"] for r in read_results(tmp_path / "out.csv")] == ["a", "b"]


def test_output_to_a_folder_writes_shards_in_order(tmp_path, use_scripted):
    feed(use_scripted, 3)
    src = write_jsonl(tmp_path / "in.jsonl", ROWS + [dict(ROWS[0], id="c")])
    result = CliRunner().invoke(
        main,
        ["score", str(src), "-o", f"{tmp_path / 'out'}/", "--shard-rows", "2", "--shard-format", "parquet", "--quiet"],
    )
    assert result.exit_code == 0, result.output
    shards = sorted(p.name for p in (tmp_path / "out").glob("part-*"))
    assert shards == ["part-00000.parquet", "part-00001.parquet"]
    ids = [r["id"] for name in shards for r in read_results(tmp_path / "out" / name)]
    assert ids == ["a", "b", "c"]
