"""What a hostile but realistic user types (issue 12's table): each case loses no data, prints no traceback and
names what is wrong. Cases that end before a model loads run the real command in a subprocess; cases that score
use the scripted judge in this process."""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from offline_sumscore import ModelLoadError, SummarizationScorer
from offline_sumscore.cli import main
from offline_sumscore.core.samples import BadRow
from offline_sumscore.io.inputs import read_rows
from tests.conftest import enqueue_two_axis, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
ROW = {"id": "a", "source": "The council voted to build a library on Mill Street.", "summary": "A library."}


def sumscore(*args, cwd=None, env=None):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "offline_sumscore", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )


def one_line_error(proc, code=2):
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return (proc.stderr + proc.stdout).strip()


# -- 1: OUTPUT is INPUT, however it is reached -------------------------------------------------------------------
@pytest.mark.parametrize("how", ["same path", "another path", "symlink", "hard link", "folder holding it"])
def test_output_that_is_the_input_is_refused_and_the_input_is_unchanged(tmp_path, how):
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    before = src.read_bytes()
    out = {"same path": src, "another path": tmp_path / "x" / ".." / "in.jsonl", "folder holding it": f"{tmp_path}/"}
    if how == "symlink":
        (tmp_path / "link.jsonl").symlink_to(src)
        out[how] = tmp_path / "link.jsonl"
    if how == "hard link":
        os.link(src, tmp_path / "hard.jsonl")
        out[how] = tmp_path / "hard.jsonl"
    (tmp_path / "x").mkdir()
    text = one_line_error(sumscore("score", src, "-o", out[how]))
    assert "would destroy the input" in text and src.read_bytes() == before


def test_output_inside_an_input_folder_of_shards_is_refused(tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    write_jsonl(shards / "part-1.jsonl", [ROW])
    text = one_line_error(sumscore("score", shards, "-o", shards / "out.jsonl"))
    assert "would destroy the input" in text and sorted(p.name for p in shards.iterdir()) == ["part-1.jsonl"]


# -- 2: OUTPUT's folders are made -----------------------------------------------------------------------------------
def test_missing_output_folders_are_created(tmp_path, use_scripted):
    enqueue_two_axis(use_scripted)
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    out = tmp_path / "missing" / "dir" / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["id"] == "a"
    report = tmp_path / "other" / "r.html"
    proc = sumscore("report", out, "-o", report)
    assert proc.returncode == 0, proc.stderr and report.exists()


# -- 3: a cut-off .gguf -----------------------------------------------------------------------------------------------
def test_a_truncated_gguf_is_named_truncated_or_corrupt(tmp_path):
    from offline_sumscore.engine.judge import embedded_gguf_path

    cut = tmp_path / "cut.gguf"
    with open(embedded_gguf_path(), "rb") as fh:
        cut.write_bytes(fh.read(1 << 20))
    text = one_line_error(sumscore("convert", cut, "-o", tmp_path / "converted"))
    assert "is truncated or corrupt" in text and "cut.gguf" in text
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    text = one_line_error(sumscore("score", src, "-o", tmp_path / "out.jsonl", "--model", cut))
    assert "is truncated or corrupt" in text


def test_a_gguf_cut_short_after_its_header_is_refused_from_its_size_in_under_2_s(tmp_path):
    """The header whole, the tensors' bytes not: refused from the header and the file's size, before the engine is
    chosen (torch's import) or transformers' reader fails deep in a tensor (13 s for the embedded judge cut in half)."""
    from offline_sumscore.engine.build import EngineSpec, resolve
    from offline_sumscore.engine.judge import embedded_gguf_path
    from offline_sumscore.engine.model_header import read_gguf_layout

    whole = embedded_gguf_path()
    cut = tmp_path / "cut.gguf"
    with open(whole, "rb") as fh:
        cut.write_bytes(fh.read(read_gguf_layout(whole).data_start + 4096))  # the header and a few bytes of data
    with open(cut, "r+b") as fh:
        fh.truncate(whole.stat().st_size - 1)  # sparse: one byte short of the whole file
    started = time.perf_counter()
    with pytest.raises(ModelLoadError, match="is truncated: its GGUF header lists 272 tensors") as info:
        resolve(EngineSpec(model=str(cut)))
    assert time.perf_counter() - started < 2 and "(1 missing)" in str(info.value)
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    python_alone = timed(sumscore, "--help")[1]  # the interpreter and the package's imports, which any run pays
    proc, took = timed(sumscore, "score", src, "-o", tmp_path / "out.jsonl", "--model", cut)
    text = one_line_error(proc)
    assert "\n" not in text and f"{cut} is truncated" in text and "copy the file again" in text
    assert took - python_alone < 2, (took, python_alone)
    assert not (tmp_path / "out.jsonl").exists()


def timed(run, *args):
    started = time.perf_counter()
    return run(*args), time.perf_counter() - started


# -- an OUTPUT format whose library is missing ------------------------------------------------------------------------
@pytest.mark.parametrize("output", ["x.parquet", "shards/"])
def test_a_parquet_output_without_pyarrow_is_refused_before_the_judge_loads(tmp_path, output):
    """Refused in one line naming pyarrow and how to install it, before the judge loads (it was refused after every
    row was scored); pyarrow is made unimportable in the child by a package of that name that raises ImportError."""
    blocker = tmp_path / "no_pyarrow" / "pyarrow"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('pyarrow is not installed here (the test hides it)')\n")
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    path = [str(blocker.parent), str(ROOT), os.environ.get("PYTHONPATH", "")]
    started = time.perf_counter()
    flags = ["--shard-format", "parquet", "--model", "smollm2-135m"]
    proc = sumscore(
        "score", src, "-o", f"{tmp_path}/{output}", *flags, env={"PYTHONPATH": os.pathsep.join(filter(None, path))}
    )
    took = time.perf_counter() - started
    text = one_line_error(proc)
    assert "\n" not in text and "needs pyarrow: pip install 'offline-sumscore[formats]'" in text
    assert f"OUTPUT {tmp_path}/{output}" in text
    assert "engine:" not in text and "Loading weights" not in text  # said once a judge is loaded: none was
    assert took < 5, took
    assert not (tmp_path / output).exists()


# -- 5, 6, 10: what files are read -----------------------------------------------------------------------------------
def good(path):
    rows = list(read_rows(path))
    assert not [r for r in rows if isinstance(r, BadRow)], [r.error for r in rows if isinstance(r, BadRow)]
    return rows


def test_a_byte_order_mark_is_read_past(tmp_path):
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps(ROW).encode() + b"\n")
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbfid,source,summary\na,The long source.,A sum.\n")
    assert [r.id for r in good(tmp_path / "bom.jsonl")] == ["a"] and [r.id for r in good(tmp_path / "bom.csv")] == ["a"]


def test_tsv_gzip_semicolons_and_json_arrays_are_read(tmp_path):
    (tmp_path / "in.tsv").write_text("id\tsource\tsummary\na\tThe long source, with a comma.\tA sum.\n")
    with gzip.open(tmp_path / "in.jsonl.gz", "wt") as fh:
        fh.write(json.dumps(ROW) + "\n" + json.dumps(dict(ROW, id="b")) + "\n")
    (tmp_path / "semi.csv").write_text("id;source;summary\na;The long source.;A sum.\n")
    (tmp_path / "pretty.json").write_text(json.dumps([ROW, dict(ROW, id="b")], indent=2))
    (tmp_path / "one.json").write_text(json.dumps([ROW]))
    assert good(tmp_path / "in.tsv")[0].source == "The long source, with a comma."
    assert [r.id for r in good(tmp_path / "in.jsonl.gz")] == ["a", "b"]
    assert good(tmp_path / "semi.csv")[0].summary == "A sum."
    assert [r.id for r in good(tmp_path / "pretty.json")] == ["a", "b"] and len(good(tmp_path / "one.json")) == 1


def test_a_json_array_element_that_is_not_an_object_fails_alone(tmp_path):
    (tmp_path / "arr.json").write_text(json.dumps([ROW, 7]))
    rows = list(read_rows(tmp_path / "arr.json"))
    assert rows[0].id == "a" and isinstance(rows[1], BadRow)
    assert "element 2 of the JSON array" in str(rows[1].error)


def test_an_unknown_format_and_a_header_without_the_columns_are_named(tmp_path):
    (tmp_path / "in.xlsx").write_bytes(b"PK\x03\x04 not a text file")
    text = one_line_error(sumscore("score", tmp_path / "in.xlsx", "-o", tmp_path / "o.jsonl"))
    assert "says no format this reads" in text and ".tsv" in text
    (tmp_path / "pipes.csv").write_text("doc|text\nx|y\n")
    text = one_line_error(sumscore("score", tmp_path / "pipes.csv", "-o", tmp_path / "o.jsonl"))
    assert "CSV header lacks column(s) source, summary" in text and "split by pipes: doc, text" in text


# -- 7: ids keep their JSON type --------------------------------------------------------------------------------------
def test_ids_keep_their_json_type_and_made_up_ids_cannot_clash(tmp_path, use_scripted):
    enqueue_two_axis(use_scripted, 5)
    rows = [
        dict(ROW, id=1),
        dict(ROW, id="1"),
        dict(ROW, id=8.5),
        dict(ROW, id=True),
        dict(ROW, id={"a": 1}),
        {k: v for k, v in ROW.items() if k != "id"},
        dict(ROW, id="6"),
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet"])
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert result.exit_code == 1, result.output
    assert [r["id"] for r in got] == [1, "1", 8.5, True, None, None, "6"]  # 1 and "1" are two ids
    assert [r["score"] is not None for r in got] == [True, True, True, True, False, True, True]
    assert got[4]["error"]["cause"] == "input:bad_id" and "got an object" in got[4]["error"]["message"]
    assert got[5]["line"] == 6 and got[5]["row_key"] == "line:6"  # a row without an id is known by its line
    resumed = CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet", "--resume"])
    assert resumed.exit_code == 1 and "7 rows kept from OUTPUT" in resumed.output  # each row matched to its own


# -- 8: nothing to score ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_empty_input_warns_and_exits_3_without_writing(tmp_path, content):
    (tmp_path / "in.jsonl").write_text(content)
    proc = sumscore("score", tmp_path / "in.jsonl", "-o", tmp_path / "out.jsonl")
    assert proc.returncode == 3 and "holds no rows" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.jsonl").exists()


# -- 11: report on what is not a results file ---------------------------------------------------------------------
def test_report_on_an_input_file_or_an_empty_file_is_refused(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    text = one_line_error(sumscore("report", src, "-o", tmp_path / "r.html"))
    assert "is not a `sumscore score` OUTPUT file" in text and not (tmp_path / "r.html").exists()
    (tmp_path / "empty.jsonl").write_text("")
    assert "holds no rows" in one_line_error(sumscore("report", tmp_path / "empty.jsonl", "-o", tmp_path / "r.html"))


# -- 10: options are named as the user typed them, with sane bounds -------------------------------------------------
@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--max-questions", "100000", "--max-questions must be an integer from 1 to 200. Given: 100000"),
        ("--scale", "-1", "--scale must be > 0. Given: -1.0"),
    ],
)
def test_an_option_error_names_the_flag(tmp_path, use_scripted, flag, value, words):
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "o.jsonl"), flag, value])
    assert result.exit_code == 2 and result.output.strip() == f"Error: {words}"


# -- 13: Python words in Python errors ----------------------------------------------------------------------------
def test_python_errors_name_no_made_up_id_and_say_none(scripted):
    scorer = SummarizationScorer(engine=scripted)
    with pytest.raises(ValueError) as empty:
        scorer.score("", "x")
    assert str(empty.value) == 'field "source" is empty or whitespace-only; each row needs text to judge'
    with pytest.raises(ValueError, match="got None") as missing:
        scorer.score(None, "x")
    assert "null" not in str(missing.value)
    with pytest.raises(ValueError, match=r'^item 1: field "summary" must be a string; got None'):
        scorer.score_many([("Source one.", "Sum."), {"source": "Source two.", "summary": None}])
    with pytest.raises(ValueError, match='id "given"'):
        scorer.score("", "x", id="given")


def test_a_resume_with_other_options_names_only_the_setting_that_differs(tmp_path, use_scripted):
    enqueue_two_axis(use_scripted)
    src, out = write_jsonl(tmp_path / "in.jsonl", [ROW]), tmp_path / "out.jsonl"
    assert (
        CliRunner().invoke(main, ["score", str(src), "-o", str(out), "--quiet", "--max-questions", "3"]).exit_code == 0
    )
    result = CliRunner().invoke(
        main, ["score", str(src), "-o", str(out), "--quiet", "--max-questions", "4", "--resume"]
    )
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"Error: {out} was written with other settings (max_questions was 3, now 4); "
        f"resume with the same options, or use a new -o"
    )


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--chunk-size", "0"], "--chunk-size must be an integer >= 1. Given: 0"),
        (["--shard-rows", "0"], "--shard-rows must be an integer >= 1. Given: 0"),
        (
            ["--judge-url", "http://127.0.0.1:9/v1", "--judge-model", "m", "--judge-concurrency", "0"],
            "--judge-concurrency must be an integer >= 1. Given: 0",
        ),
    ],
)
def test_a_count_out_of_range_names_the_flag_typed_and_nothing_is_written(tmp_path, flags, said):
    src = write_jsonl(tmp_path / "in.jsonl", [ROW])
    result = CliRunner().invoke(main, ["score", str(src), "-o", str(tmp_path / "out.jsonl"), *flags])
    assert result.exit_code == 2 and said in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out.jsonl").exists()
