"""The `sumscore` CLI on small files, with the scorers' engine swapped for a scripted judge."""

import json

import pytest
from click.testing import CliRunner

from offline_sumscore.cli import main
from tests.conftest import CLAIMS, COVERAGE, QUESTIONS, SUPPORT, enqueue_two_axis, write_jsonl

ROWS = [
    {"id": "a", "source": "Source A is long enough.", "summary": "Sum A"},
    {"id": "b", "source": "Source B is long enough.", "summary": "Sum B"},
    {"id": "c", "source": "Source C is long enough.", "summary": "Sum C"},
]


def test_score_writes_one_row_per_input_in_order_and_prints_the_table(tmp_path, use_scripted):
    enqueue_two_axis(use_scripted, len(ROWS))
    src, out = write_jsonl(tmp_path / "in.jsonl", ROWS), tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        main, ["score", str(src), "-o", str(out), "--max-questions", "5", "--quiet"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c"] and [r["line"] for r in rows] == [1, 2, 3]
    assert all(r["score"] == 0.5 and r["reason"].startswith("The score is 0.5") for r in rows)
    assert {"alignment", "coverage", "claims", "questions", "coverage_verdicts", "stages"} <= set(rows[0])
    assert rows[0]["settings"]["max_questions"] == 5
    assert "metric two-axis: 3 rows, 0 failed" in result.output
    assert "0.500 | 0.667 | 0.500" in result.output


def test_summary_score_from_csv_with_mapped_fields(tmp_path, use_scripted):
    use_scripted.enqueue("keyphrases", {"keyphrases": ["comma"]}).enqueue(
        "ragas_questions", {"questions": ["Is it so?"]}
    )
    use_scripted.enqueue("ragas_answers", {"answer": "1"})
    src, out = tmp_path / "in.csv", tmp_path / "out.jsonl"
    src.write_text('doc,abstract,id\n"A long source, with a comma.",Short.,x1\n')
    result = CliRunner().invoke(
        main,
        [
            "score",
            str(src),
            "-o",
            str(out),
            "--metric",
            "summary-score",
            "--source-field",
            "doc",
            "--summary-field",
            "abstract",
            "--coeff",
            "0",
            "--quiet",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["id"] == "x1" and row["score"] == 1.0 and row["qa"] == 1.0


def test_failed_row_is_recorded_and_exit_code_is_one(tmp_path, use_scripted):
    use_scripted.enqueue("claims", "{broken", CLAIMS).enqueue("questions", QUESTIONS, QUESTIONS)
    use_scripted.enqueue("support", *SUPPORT).enqueue("coverage", *COVERAGE)
    src, out = write_jsonl(tmp_path / "in.jsonl", ROWS[:2]), tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["score"] is None and rows[0]["error"]["stage"] == "claims"
    assert rows[0]["error"]["raw_output"] == "{broken" and rows[1]["score"] == 0.5
    assert "2 rows, 1 failed" in result.output


def test_fail_fast_stops_at_a_bad_row_with_one_line_naming_file_line_id_and_field(tmp_path, use_scripted):
    src = write_jsonl(tmp_path / "in.jsonl", [ROWS[0], {"id": "b", "source": "text"}])
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), "--fail-fast"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        f'Error: {src}:2 (id "b"): field "summary" is missing; this row has id, source: name the one that holds it '
        "with --summary-field"
    )
    assert not use_scripted.requests  # stopped before the judge was asked anything


def test_option_of_the_other_metric_is_a_usage_error(tmp_path, use_scripted):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:1])
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), "--coeff", "0.3"])
    assert result.exit_code == 2 and "--coeff does not apply to --metric two-axis" in result.output


def test_out_of_range_option_is_one_line(tmp_path, use_scripted):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:1])
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), "--max-questions", "0"])
    assert result.exit_code == 2
    assert result.output.strip() == "Error: --max-questions must be an integer from 1 to 200. Given: 0"


@pytest.mark.parametrize("args", [["--help"], ["score", "--help"], ["demo", "--help"], ["convert", "--help"]])
def test_help_everywhere(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0 and "Usage:" in result.output


def test_missing_model_path_is_one_line(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:1])
    result = CliRunner().invoke(
        main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), "--model", str(tmp_path / "nope")]
    )
    assert result.exit_code == 2
    assert result.output.strip().startswith(f"Error: {tmp_path / 'nope'} does not exist; pass a Hugging Face")


def test_a_run_says_first_which_engine_runs_and_why(tmp_path, use_scripted):
    enqueue_two_axis(use_scripted, 1)
    src, out = write_jsonl(tmp_path / "in.jsonl", ROWS[:1]), tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == (
        "engine: local (auto: no CUDA device; on a CPU ours is the engine measured, ahead of vLLM's CPU build)"
    )


@pytest.mark.parametrize(
    "cuda,vllm,model,engine",
    [
        (False, True, None, "local (auto: no CUDA device"),
        (True, True, "/m/judge", "vllm (auto: a CUDA device and vLLM installed"),
        (True, False, "/m/judge", "local (auto: a CUDA device and no vLLM installed"),
        (True, True, "/m/judge.Q8_0.gguf", "local (auto: a CUDA device, but vLLM here loads model directories"),
    ],
)
def test_engine_auto_is_ours_on_a_cpu_and_vllm_on_a_gpu_where_it_is_installed(monkeypatch, cuda, vllm, model, engine):
    import importlib.util

    import torch

    from offline_sumscore.engine.build import EngineSpec, resolve

    def choose_engine(kind, model, device="auto"):
        spec, said = resolve(EngineSpec(kind=kind, model=model, device=device))
        return spec.kind, said

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: (object() if vllm else None) if name == "vllm" else found(name)
    )
    kind, said = choose_engine("auto", model)
    assert said.startswith(engine) and kind == engine.split(" ")[0]
    assert choose_engine("local", model) == ("local", "local (asked for with --engine local)")
    assert choose_engine("auto", model, "cpu")[0] == "local"  # --device cpu: no GPU to run vLLM on


def test_every_run_ends_with_where_it_wrote_and_an_existing_folder_without_a_slash_is_refused(tmp_path, use_scripted):
    enqueue_two_axis(use_scripted, 1)
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:1])
    done = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), "--quiet"])
    assert done.exit_code == 0 and done.output.strip().splitlines()[-1] == f"wrote 1 rows to {tmp_path / 'o.jsonl'}"
    (tmp_path / "out").mkdir()
    refused = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "out"), "--quiet"])
    assert refused.exit_code == 2 and not list((tmp_path / "out").iterdir())
    assert refused.output.strip() == (
        f"Error: OUTPUT {tmp_path / 'out'} is an existing folder: end it with a slash ({tmp_path / 'out'}/) to write "
        f"shards of rows into it, or name a file ({tmp_path / 'out' / 'scores.jsonl'})"
    )
    enqueue_two_axis(use_scripted, 1)
    shards = CliRunner().invoke(main, ["score", str(src), "-o", f"{tmp_path / 'out'}/", "--quiet"])
    assert shards.exit_code == 0 and shards.output.strip().endswith(f"wrote 1 rows into the folder {tmp_path / 'out'}/")


def test_a_run_whose_scores_are_all_alike_says_so_in_one_line_naming_the_axis(tmp_path, use_scripted):
    enqueue_two_axis(use_scripted, 3)  # every row: alignment 2/3, coverage 1/2, so 0.5 set by coverage
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    done = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), "--quiet"])
    (note,) = [line for line in done.output.splitlines() if line.startswith("note: ")]
    assert note.startswith("note: 3 of 3 scores are 0.500, set by coverage in 3 of them (coverage here is the share")
    use_scripted.enqueue("claims", {"claims": ["A claim."]}).enqueue("questions", {"questions": ["Is it so?"]})
    use_scripted.enqueue("support", "Yes\nReason: ok").enqueue("coverage", "Yes\nReason: ok")
    enqueue_two_axis(use_scripted, 2)  # 1.0, 0.5, 0.5: two thirds alike, under the three quarters it takes
    varied = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "v.jsonl"), "--quiet", "--no-cache"])
    assert varied.exit_code == 0 and "note: " not in varied.output


def test_version_names_what_decides_the_numbers_and_the_device():
    import torch
    import transformers

    from offline_sumscore.core.version import VERSION

    result = CliRunner().invoke(main, ["--version"], catch_exceptions=False)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == f"sumscore {VERSION}"
    assert f"torch {torch.__version__}" in lines and f"transformers {transformers.__version__}" in lines
    for name in ("outlines", "llguidance", "vllm"):  # vLLM by name even where it is not installed
        assert sum(line.startswith(f"{name} ") for line in lines) == 1, result.output
    device = next(line for line in lines if line.startswith("device: "))
    assert ("cuda:0" in device) == torch.cuda.is_available() and "CPU kernels: " in result.output
