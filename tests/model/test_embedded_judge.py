"""The real embedded judge (SmolLM2-135M-Instruct), end to end. Few and short: caps keep each verdict list small.

These prove the pipeline, not quality: the embedded judge's verdicts are poor, so only validity is asserted.
"""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from offline_sumscore import ModelLoadError, SummarizationScorer, SummaryScore, summary_score, two_axis_score
from offline_sumscore.engine.runner import TransformersEngine
from offline_sumscore import prompts, schemas
from offline_sumscore.stages import StageRequest
from tests.conftest import SOURCE, SUMMARY

pytestmark = pytest.mark.model

OTHER_SOURCE = "Heavy rain flooded the river town of Ostby overnight. About 200 homes were evacuated."
OTHER_SUMMARY = "Rain flooded Ostby and 200 homes were evacuated."


def test_judge_loads_on_cpu_in_float32_with_its_decisions_recorded(judge):
    d = judge.describe()
    assert d["device"] == "cpu" and d["dtype"] == "float32" and d["context_length"] == 8192
    assert "auto" in d["decisions"]["device"] and len(d["identity"]) == 16


def test_two_axis_valid_verdict_lists_for_a_batch_of_two(judge):
    scorer = SummarizationScorer(judge, max_questions=2, max_claims=3, max_text_chars=60, max_reason_chars=40)
    results = scorer.score_many([(SOURCE, SUMMARY), (OTHER_SOURCE, OTHER_SUMMARY)])
    for r in results:
        assert 1 <= len(r.claims) <= 3 and all(isinstance(c["supported"], bool) for c in r.claims)
        assert all(len(c["claim"]) <= 60 and len(c["reason"]) <= 40 for c in r.claims)
        assert 1 <= len(r.questions) <= 2
        assert len(r.coverage_verdicts) == len(r.questions)
        assert all(isinstance(v["answered"], bool) for v in r.coverage_verdicts)
        again = two_axis_score(r.claims, r.questions, r.coverage_verdicts, max_questions=2)
        assert (r.score, r.alignment, r.coverage) == (again.score, again.alignment, again.coverage)
        assert r.reason.startswith("The score is ")
        assert r.stages["claims"]["tokens_out"] > 0 and r.stages["coverage.0"]["batch_size"] == 2 * len(r.questions)
        assert all("<source>" not in r.stages[f"coverage.{i}"]["prompt"] for i in range(len(r.questions)))


def test_summary_score_valid_lists(judge):
    r = SummaryScore(judge, max_questions=2, max_keyphrases=3, max_text_chars=60).score(
        reference_contexts=[SOURCE], response=SUMMARY)
    assert len(r.keyphrases) <= 3 and 1 <= len(r.questions) <= 2
    assert len(r.answers) == len(r.questions) and set(r.answers) <= {"1", "0"}
    assert r.score == pytest.approx(summary_score(r.answers, SOURCE, SUMMARY).score)


def test_token_cap_fails_loudly_with_the_raw_text_kept(judge):
    engine = TransformersEngine(judge)
    req = StageRequest("capped", "questions", tuple(prompts.questions_prompt(SOURCE, max_questions=2)),
                       schemas.questions_list(2, 60), max_new_tokens=4)
    (res,) = engine.run([req])
    assert not res.ok and res.value is None
    assert res.error == "hit the 4-token cap before the JSON closed; raw output kept"
    assert res.raw_output.startswith('{"') and res.tokens_out >= 4


def test_cli_scores_a_small_file_with_the_real_model(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"id": "x", "source": SOURCE, "summary": SUMMARY}) + "\n")
    proc = subprocess.run([sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(out),
                           "--max-questions", "1", "--max-claims", "2", "--max-text-chars", "40", "--no-reason",
                           "--quiet"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["id"] == "x" and 0 <= row["score"] <= 1 and row["reason"] is None
    assert len(row["coverage_verdicts"]) == len(row["questions"]) == 1
    assert row["judge"]["name"] == "SmolLM2-135M-Instruct"
    assert row["judge"]["engine"]["engine"] == "transformers" and "free memory" in row["judge"]["engine"]["capacity"]
    assert "metric two-axis: 1 rows, 0 failed" in proc.stdout


def test_model_without_chat_template_is_refused(judge, tmp_path):
    copy = tmp_path / "base-model"
    shutil.copytree(judge.path, copy)
    (copy / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    from offline_sumscore.judge import load_judge
    with pytest.raises(ModelLoadError, match=r"has no chat template \(tokenizer_config.json: chat_template\)"):
        load_judge(copy)


def test_conversion_is_safe_when_two_processes_run_it_at_once(tmp_path):
    env = dict(os.environ, OFFLINE_SUMSCORE_MODELS=str(tmp_path))
    cmd = [sys.executable, "-m", "offline_sumscore", "convert"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-1000:] for o in outs]
    target = tmp_path / "SmolLM2-135M-Instruct"
    assert (target / "CONVERTED_FROM").exists() and (target / "model.safetensors").exists()
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []  # no half-written directory left
    started = time.perf_counter()
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "ready" in again.stdout
    assert time.perf_counter() - started < 30  # idempotent: no second conversion (which takes ~40 s)


def test_each_schema_grammar_is_built_once_and_each_row_gets_its_own_matcher(judge):
    engine = TransformersEngine(judge)
    schema_json = StageRequest("s", "questions", (), schemas.questions_list(7, 61)).schema_json  # not used elsewhere
    before = engine.grammars.schemas_built
    first, second = engine.grammars.matcher(schema_json), engine.grammars.matcher(schema_json)
    assert engine.grammars.schemas_built == before + 1 and first is not second
    assert TransformersEngine(judge).grammars is engine.grammars  # a second scorer on this judge shares them
