"""`sumscore compare` on OUTPUT files of every format the project writes (rows made here, no model)."""

import json

import pytest
from click.testing import CliRunner

from offline_sumscore.cli import main
from offline_sumscore.io.outputs import write_rows
from offline_sumscore.runs.files import compare_files


def system_rows(offset: float, *, docs=20, failed=(), prompt_version="v1"):
    out = []
    for i in range(docs):
        doc = f"doc{i}"
        if doc in failed:
            out.append(
                {
                    "id": f"{doc}:s",
                    "doc_id": doc,
                    "source_hash": f"h{i}",
                    "metric": "two-axis",
                    "score": None,
                    "stages": {},
                    "error": {"stage": "support", "cause": "schema", "message": "bad JSON"},
                }
            )
            continue
        s = round(min(1.0, 0.4 + 0.05 * (i % 3) + offset), 3)
        out.append(
            {
                "id": f"{doc}:s",
                "doc_id": doc,
                "source_hash": f"h{i}",
                "metric": "two-axis",
                "score": s,
                "alignment": s,
                "coverage": 1.0,
                "soft_alignment": s,
                "soft_coverage": 0.9,
                "claims": [{"claim": f"claim {i}", "supported": offset > 0}],
                "questions": [f"question {i}?"],
                "coverage_verdicts": [{"answered": True}],
                "settings": {"prompt_version": prompt_version},
                "stages": {},
                "judge": {"name": "SmolLM2-135M-Instruct", "identity": "98748f7a", "dtype": "float32"},
            }
        )
    return out


def test_compare_reads_jsonl_csv_and_a_folder_of_parquet_shards_and_writes_table_html_json(tmp_path):
    a, b = tmp_path / "sysA.jsonl", tmp_path / "sysB.csv"
    write_rows(system_rows(0.2), a)
    write_rows(system_rows(0.0, failed=("doc3",)), b)
    shards = tmp_path / "sysC"
    shards.mkdir()
    rows_c = system_rows(0.1, docs=19)  # doc19 not scored by C
    write_rows(rows_c[:4], shards / "part-00000.parquet")
    write_rows(rows_c[4:], shards / "part-00001.parquet")
    html, js = tmp_path / "compare.html", tmp_path / "compare.json"
    result = CliRunner().invoke(
        main,
        ["compare", str(a), str(b), str(shards), "-o", str(html), "--json", str(js), "--resamples", "2000"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "18 documents scored by every system" in result.output  # doc3 failed in B, doc19 missing from C
    assert "sysB: 2 row(s) left out: 1 failed" in result.output
    assert "sysA better" in result.output and "ranking by mean score" in result.output
    report = json.loads(js.read_text())
    ab = next(p for p in report["pairs"] if (p["a"], p["b"]) == ("sysA", "sysB"))["fields"]["score"]
    assert abs(ab["mean_diff"] - 0.2) < 1e-9 and ab["wins"] == 18 and ab["p"] == 1 / 2001  # no flip reaches it
    page = html.read_text()
    assert page.count('class="ci"') == 3 * len(report["fields"]) and "Where they differ most" in page
    again, _ = compare_files([a, b, shards], resamples=2000)
    assert again["pairs"] == report["pairs"]  # same seed, same figures


def test_compare_pairs_by_source_hash_when_no_field_is_named(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    ra, rb = system_rows(0.1), system_rows(0.0)
    for r in ra + rb:
        r.pop("doc_id")
    for r in rb:  # B scored the documents in another order, under other ids
        r["id"] = "other-" + r["id"]
    write_rows(ra, a)
    write_rows(rb[::-1], b)
    report, _ = compare_files([a, b], resamples=500)
    assert report["documents"] == 20 and abs(report["pairs"][0]["fields"]["score"]["mean_diff"] - 0.1) < 1e-9


def test_compare_refuses_mixed_prompt_versions_and_names_them(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_rows(system_rows(0.1), a)
    write_rows(system_rows(0.0, prompt_version="v2"), b)
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--by", "doc_id"])
    assert result.exit_code != 0 and "settings.prompt_version: a='v1', b='v2'" in result.output
    assert "--allow-mixed" in result.output
    ok = CliRunner().invoke(main, ["compare", str(a), str(b), "--by", "doc_id", "--allow-mixed"])
    assert ok.exit_code == 0 and "settings differ on settings.prompt_version" in ok.output


def test_compare_table_heads_each_column_with_the_system_its_rows_hold(tmp_path):
    # Systems named "B" and "A", B given first: the table's old header read "A B ... mean A mean B" over rows of
    # "B A score 0.835 0.775", B's mean under "mean A". Every figure must sit under its own system's name.
    b, a = tmp_path / "b.jsonl", tmp_path / "a.jsonl"
    write_rows(system_rows(0.3), b)
    write_rows(system_rows(0.0), a)
    js = tmp_path / "c.json"
    result = CliRunner().invoke(
        main, ["compare", str(b), str(a), "--name", "B", "--name", "A", "--json", str(js), "--resamples", "500"]
    )
    assert result.exit_code == 0, result.output
    means = {name: m["score"]["mean"] for name, m in json.loads(js.read_text())["means"].items()}
    assert means["B"] > means["A"]
    lines = result.output.splitlines()
    header = next(line for line in lines if "mean" in line and "field" in line)
    row = lines[lines.index(header) + 2]  # under the header and its rule: the first field, score
    for name in ("A", "B"):
        end = header.index(f"mean {name}") + len(f"mean {name}")  # columns are right-aligned under their heads
        assert float(row[:end].split()[-1]) == pytest.approx(means[name], abs=5e-4), (header, row)
    end = header.index("B - A") + len("B - A")
    assert float(row[:end].split()[-1]) == pytest.approx(means["B"] - means["A"], abs=5e-4)
    assert row.endswith("B better")
