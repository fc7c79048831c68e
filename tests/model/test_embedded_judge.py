"""The real embedded judge (SmolLM2-135M-Instruct), end to end. Few and short: caps keep each verdict list small.

These prove the pipeline, not quality: the embedded judge's verdicts are weak, so validity is asserted, plus the
one thing its likelihood verdicts must get right (a copied sentence is supported, an unrelated one is not).
"""

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest

from offline_sumscore import FailedRow, SummarizationScorer, SummaryScore, summary_score, two_axis_score
from offline_sumscore.core.coverage_items import key_sentences, summary_sentences
from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.local import TransformersEngine
from offline_sumscore.scorers.base import PlanFeed
from offline_sumscore.scorers.design import SOFT_COVERAGE, stage_defaults
from offline_sumscore.scorers.stages.questions import questions_list, questions_prompt
from offline_sumscore.scorers.stages.verdict import ONE_SENTENCE_SUMMARY_INSTRUCTION
from tests.conftest import SOURCE, SUMMARY

pytestmark = pytest.mark.model

OTHER_SOURCE = "Heavy rain flooded the river town of Ostby overnight. About 200 homes were evacuated."
OTHER_SUMMARY = "Rain flooded Ostby and 200 homes were evacuated."


def test_judge_loads_on_cpu_in_float32_with_its_decisions_recorded(judge):
    d = judge.describe()
    assert d["device"] == "cpu" and d["dtype"] == "float32" and d["context_length"] == 8192
    assert "auto" in d["decisions"]["device"] and len(d["identity"]) == 16


def test_the_embedded_judge_runs_its_norms_mlps_and_rotary_on_one_pass_kernels_with_the_same_logits(judge):
    """layer_ops.py on the real judge: every norm and MLP replaced, and its logits as torch's operators give them."""
    import torch

    from offline_sumscore.engine.cpu import layer_ops

    said = judge.decisions["layer_ops"]
    if "AVX512" not in torch.backends.cpu.get_cpu_capability():
        assert said.startswith("torch's operators (the layer kernels need AVX-512"), said
        return
    assert said.endswith("61 RMSNorms, 30 SiLU MLPs, rotary embedding (llama)"), said
    ids = judge.tokenizer(judge.render(questions_prompt(SOURCE, n=2)), return_tensors="pt")["input_ids"]
    home = sys.modules[type(judge.model.model.layers[0]).__module__]
    with torch.inference_mode():
        with layer_ops.torch_operators(judge.model) as patched:
            assert not getattr(home.apply_rotary_pos_emb, layer_ops.PATCHED, False)  # transformers' own rotary
            theirs = judge.model(input_ids=ids).logits[0, -1]
        assert getattr(home.apply_rotary_pos_emb, layer_ops.PATCHED, False)  # the kernels back after the block
        ours = judge.model(input_ids=ids).logits[0, -1]
    assert len(patched) == 91 and (ours - theirs).abs().max() < 1e-3, (ours - theirs).abs().max()
    assert ours.argmax() == theirs.argmax()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_the_embedded_judge_holds_its_linears_once_and_no_mapping_of_its_weights_file(judge):
    """cpu_gemm.pack_linears: each packed linear's dense weight released; the file transformers mapped (the whole
    file stays resident, 513 MiB, while any weight views it) unmapped once nothing views it."""
    said = judge.decisions["cpu_gemm"]
    if not said.startswith("oneDNN"):
        pytest.skip(f"this torch packs no linears: {said}")
    assert "(211 linear layers; 2-3x torch's linear at 8-256 rows here; their dense copies released, 405 MiB)" in said
    assert judge.model.model.layers[0].mlp.down_proj.weight is None
    assert judge.model.lm_head.weight is judge.model.model.embed_tokens.weight  # tied: kept, it looks up the tokens
    with open("/proc/self/maps") as maps:
        mapped = [line for line in maps if line.rstrip().endswith(".safetensors") and judge.path in line]
    assert not mapped, mapped


def test_the_embedded_judges_projections_are_its_gguf_block_codes_and_give_onednns_numbers(judge):
    """block_codes.py on the real judge: all 210 projections are exactly Q4_1 codes, kept as such (63 MiB), and a
    small pass through them gives what oneDNN's packed weight gives for the same rows within a larger pass."""
    import torch

    from offline_sumscore.engine.cpu import block_codes

    said = judge.decisions["cpu_gemm"]
    if not said.startswith("oneDNN") or "AVX512" not in torch.backends.cpu.get_cpu_capability():
        pytest.skip(f"no packed linears or no AVX-512 here: {said}")
    assert said.endswith(
        f"; passes of up to {block_codes.SMALL_ROWS} rows on 4-bit block codes for 210 of them, the same weights "
        "to the bit (63 MiB)"
    ), said
    torch.manual_seed(0)
    for layer in (judge.model.model.layers[0].self_attn.k_proj, judge.model.model.layers[29].mlp.down_proj):
        wide = torch.randn(block_codes.SMALL_ROWS + 1, layer.in_features)  # oneDNN's pass
        with torch.inference_mode():
            torch.testing.assert_close(layer(wide[:7]), layer(wide)[:7], atol=2e-4, rtol=1e-4)


def test_two_axis_at_the_embedded_defaults_judges_each_sentence_by_likelihood(judge):
    assert judge.embedded and stage_defaults(judge.describe()) == {
        "claims": "sentences",
        "coverage": "key_sentences",
        "verdicts": "likelihood",
        "prompt_style": "bare",
    }
    scorer = SummarizationScorer(judge)
    results = scorer.score_many([(SOURCE, SUMMARY), (OTHER_SOURCE, OTHER_SUMMARY)])
    for r, summary, source in zip(results, (SUMMARY, OTHER_SUMMARY), (SOURCE, OTHER_SOURCE)):
        assert [c["claim"] for c in r.claims] == summary_sentences(summary)  # real claims, never a verdict word
        assert r.questions == key_sentences(source, 5) and r.coverage_from == "key_sentences"
        for item in r.claims + r.coverage_verdicts:
            p, yes = item.get("p_supported", item.get("p_answered")), item.get("supported", item.get("answered"))
            assert 0 < p < 1 and yes == (item["pmi"] >= 2.0) == (p >= 0.5)
        # rescored from the row alone: its settings say the embedded design's coverage is soft
        soft = r.settings["design.coverage_rule"] == SOFT_COVERAGE
        again = two_axis_score(r.claims, r.questions, r.coverage_verdicts, soft=soft)
        assert (r.score, r.alignment, r.coverage) == (again.score, again.alignment, again.coverage)
        assert r.reason.startswith("The score is ") and r.settings["design.verdicts"] == "likelihood"
        assert r.stages["support.0"]["tokens_out"] == 0 and r.stages["support.0.baseline"]["prompt"]
        assert source in r.stages["support.0"]["prompt"] and source not in r.stages["support.0.baseline"]["prompt"]
        assert all(source not in r.stages[f"coverage.{i}"]["prompt"] for i in range(len(r.questions)))
    # A summary copied from the source is supported; one about something else is not.
    copied, unrelated = scorer.score_many(
        [(SOURCE, SOURCE.split(". ")[0] + "."), (SOURCE, "A volcano erupted in Iceland, closing three airports.")]
    )
    assert copied.claims[0]["pmi"] > unrelated.claims[0]["pmi"]
    assert copied.alignment == 1 and unrelated.alignment == 0


def test_yes_no_verdicts_on_the_real_judge_read_p_yes_on_the_decoded_side(judge):
    scorer = SummarizationScorer(judge, claims="sentences", verdicts="yes-no", max_reason_chars=40)
    r = scorer.score(SOURCE, SUMMARY, questions=["Did the council vote to build a library?"])
    for item in r.claims + r.coverage_verdicts:
        p, yes = item.get("p_supported", item.get("p_answered")), item.get("supported", item.get("answered"))
        assert 0 < p < 1 and (p > 0.5) == yes and item["reason"]  # the reason is decoded after the verdict
    assert r.stages["support.0"]["raw_output"].startswith(("Yes\nReason: ", "No\nReason: "))


def test_atomic_claims_on_the_real_judge_are_valid_or_fail_loudly_at_the_bound(judge):
    """The 135M judge cannot write atomic claims (measured: it repeats a phrase until the list is full), which is
    why they are not its default. Either outcome keeps the contract: claims drawn from the summary alone, each judged
    alone, or a loud failure with the raw output kept; never a cut list."""
    scorer = SummarizationScorer(judge, claims="atomic", max_claims=3, max_text_chars=60)
    (r,) = scorer.score_many([(SOURCE, SUMMARY)], on_error="return")
    if isinstance(r, FailedRow):
        assert r.error["cause"] == "claims:bound" and r.error["raw_output"].startswith('{"claims": [')
    else:
        assert 0 <= len(r.claims) < 3 and all(len(c["claim"]) <= 60 for c in r.claims)
        assert SOURCE not in r.stages["claims"]["prompt"] and SUMMARY in r.stages["claims"]["prompt"]


def test_a_long_source_whose_claim_only_its_second_piece_supports(judge):
    # A judge with a 170-token context, sharing the embedded model: the source below (126 tokens) needs two pieces.
    small = dataclasses.replace(judge, context_length=170)
    filler = (
        "The weather in the valley was mild for most of the spring, with light rain in the mornings. "
        "Farmers planted barley and oats in the lower fields before the first week of April. "
    ) * 3
    source = filler + "The Lindford library will open its doors to readers in June 2027."
    r = SummarizationScorer(small).score(source, "The Lindford library will open its doors to readers in June 2027.")
    assert r.source_pieces == 2
    (claim,) = r.claims
    assert claim["supported"] and claim["piece"] == 1
    assert claim["p_by_piece"][0] < 0.5 < claim["p_by_piece"][1] == claim["p_supported"]


def test_summary_score_valid_lists_or_a_loud_failure_on_echoed_kinds(judge):
    """Ragas's design on the 135M judge (not its default): asked for key phrases, it writes back the prompt's own
    kinds ("people", "organisations", ...), so the row fails at that stage with its raw output kept, never scoring on
    questions about nothing in the text. Either outcome keeps the contract: valid lists, or a loud failure."""
    scorer = SummaryScore(judge, max_questions=2, max_keyphrases=3, max_text_chars=60, answers="questions")
    (r,) = scorer.score_many([{"source": SOURCE, "summary": SUMMARY}], on_error="return")
    if isinstance(r, FailedRow):
        assert r.error["cause"] == "keyphrases:degenerate", r.error
        assert r.error["raw_output"].startswith('{"keyphrases": [') and r.stages["keyphrases"]["error_kind"]
        return
    assert len(r.keyphrases) <= 3 and 1 <= len(r.questions) <= 2
    assert len(r.answers) == len(r.questions) and set(r.answers) <= {"1", "0"}
    assert r.score == pytest.approx(summary_score(r.answers, SOURCE, SUMMARY).score)


def test_summary_score_on_the_embedded_judge_checks_key_sentences_by_likelihood(judge):
    """The tiny-judge mode, which "auto" picks for the embedded judge: the text's key sentences, each checked against
    the summary by likelihood; the sentence the summary restates is answered "1", the one it leaves out "0"."""
    source = (
        "The council of Lindford voted on Tuesday to build a new public library on Mill Street. "
        "Heavy rain flooded the river town of Ostby overnight, and two hundred homes were evacuated."
    )
    summary = "The council of Lindford voted to build a new public library on Mill Street."
    r = SummaryScore(judge).score(source, summary)
    assert r.settings["design.answers"] == "likelihood" and r.keyphrases == [] and len(r.questions) == 2
    assert r.answers == ["1", "0"] and r.answer_p_yes[0] > 0.5 > r.answer_p_yes[1]
    assert r.qa == 0.5 and r.score == pytest.approx(summary_score(r.answers, source, summary).score)
    assert "evidence" in r.stages["ragas_answers.0"]


def test_an_empty_summary_scores_0_on_the_real_judge_without_a_request(judge, monkeypatch):
    """Both metrics at the embedded judge's defaults: no request reaches the engine, so nothing is generated or
    scored by likelihood; the two-axis row keeps the source's key sentences, each unanswered."""
    asked, take = [], PlanFeed.take

    def recorded(feed):
        requests = take(feed)
        asked.extend(requests)
        return requests

    monkeypatch.setattr(PlanFeed, "take", recorded)
    began = time.perf_counter()
    two_axis = SummarizationScorer(judge).score(SOURCE, " \n")
    ragas = SummaryScore(judge).score(SOURCE, "")
    assert asked == [] and time.perf_counter() - began < 5
    assert (two_axis.score, two_axis.alignment, two_axis.coverage, two_axis.claims) == (0, 0, 0, [])
    assert two_axis.coverage_from == "key_sentences" and two_axis.questions == key_sentences(SOURCE, 5)
    assert not any(v["answered"] for v in two_axis.coverage_verdicts) and two_axis.stages == {}
    assert (ragas.score, ragas.qa, ragas.stages) == (0, 0, {}) and ragas.empty_summary and two_axis.empty_summary
    assert two_axis.reason == ragas.reason and ragas.reason.startswith("The score is 0 because the summary is empty")
    assert two_axis.judge["embedded"] and ragas.settings["design.answers"] == "likelihood"


def test_token_cap_fails_loudly_with_the_raw_text_kept(judge):
    engine = TransformersEngine(judge)
    req = StageRequest(
        "capped", "questions", tuple(questions_prompt(SOURCE, n=2)), questions_list(2, 60), max_new_tokens=4
    )
    (res,) = engine.run([req])
    assert not res.ok and res.value is None
    assert res.error == "hit the 4-token cap before the output closed; raw output kept"
    assert res.raw_output.startswith('{"') and res.tokens_out >= 4


def test_cli_scores_a_small_file_with_the_real_model(tmp_path):
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text(json.dumps({"id": "x", "source": SOURCE, "summary": SUMMARY}) + "\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "offline_sumscore",
            "score",
            str(src),
            "-o",
            str(out),
            "--key-sentences",
            "1",
            "--no-reason",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Loading weights" not in proc.stderr and "%|" not in proc.stderr  # --quiet: no progress bars at all
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["id"] == "x" and 0 <= row["score"] <= 1 and row["reason"] is None
    assert len(row["coverage_verdicts"]) == len(row["questions"]) == 1 and row["claims"][0]["claim"] == SUMMARY
    assert row["settings"]["design.claims"] == "sentences" and row["settings"]["key_sentences"] == 1
    assert row["judge"]["name"] == "SmolLM2-135M-Instruct"
    assert row["judge"]["engine"]["engine"] == "transformers" and "free memory" in row["judge"]["engine"]["capacity"]
    assert "metric two-axis: 1 rows, 0 failed" in proc.stdout


def test_conversion_is_safe_when_two_processes_run_it_at_once(tmp_path):
    env = dict(os.environ, OFFLINE_SUMSCORE_MODELS=str(tmp_path))
    cmd = [sys.executable, "-m", "offline_sumscore", "convert"]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
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
    grammar = StageRequest("s", "questions", (), questions_list(7, 61)).grammar  # not used elsewhere
    before = engine.grammars.schemas_built
    first, second = engine.grammars.matcher(grammar), engine.grammars.matcher(grammar)
    assert engine.grammars.schemas_built == before + 1 and first is not second
    assert TransformersEngine(judge).grammars is engine.grammars  # a second scorer on this judge shares them


def test_likelihood_verdicts_keep_their_evidence_token_by_token(judge):
    """The pass that gives a likelihood verdict also gives its evidence: each statement token's log-probability with
    the source and without it, and the token the judge expected most there. On the demo's wrong fact ("Marta Ruiz,
    27, lost ..." where the source says she is 17 and won), the claim's weakest token is one of the changed ones."""
    import json
    import math
    from importlib import resources

    rows = [json.loads(line) for line in (resources.files("offline_sumscore") / "examples" / "demo.jsonl").open()]
    wrong = next(r for r in rows if r["id"] == "wrong-fact")
    result = SummarizationScorer(judge).score(wrong["source"], wrong["summary"])
    claim, text, base = result.claims[0], result.stages["support.0"]["evidence"], result.stages["support.0.baseline"]
    n = len(text["tokens"])
    assert n == len(text["logprobs"]) == len(text["expected"]) == len(base["evidence"]["logprobs"]) > 3
    assert "".join(text["tokens"]).strip() == wrong["summary"]
    pmis = [a - b for a, b in zip(text["logprobs"], base["evidence"]["logprobs"])]
    assert abs(sum(pmis) / n - claim["pmi"]) < 1e-2  # the mean of the same per-token numbers (kept to 1e-3)
    e = claim["evidence"]
    assert text["tokens"][e["at"]] == e["token"] and abs(e["pmi"] - min(pmis)) < 1e-2
    assert e["token"].strip() in {"2", "7", "27", "lost"}, e
    assert 0 < e["p"] < 1 and 0 < e["p_expected"] <= 1 and math.isfinite(e["pmi"])


def test_the_demos_changed_fact_is_unsupported_by_its_conflict_and_the_faithful_claim_stays_supported(judge):
    """The verdict reads the token profile: "27" where the source makes the judge expect "17" turns the wrong fact's
    claim unsupported (its mean PMI alone would pass it), and the reason names the figure; the faithful summary's
    claim, a paraphrase with words left out, has no fact conflict and stays supported. Both summaries are one
    sentence, so each is asked as the judge's one-sentence summary of the source."""
    import json
    from importlib import resources

    rows = {
        r["id"]: r for r in map(json.loads, (resources.files("offline_sumscore") / "examples" / "demo.jsonl").open())
    }
    scorer = SummarizationScorer(judge)
    wrong = scorer.score(rows["wrong-fact"]["source"], rows["wrong-fact"]["summary"])
    claim = wrong.claims[0]
    assert claim["supported"] is False and claim["pmi"] >= 2.0  # the mean would have passed it
    assert claim["conflict"]["word"] in {"27", "lost"} and claim["verdict_score"] < 2.0
    # The reason names the strongest evidence: the figure check's, where the source states the figure otherwise (its
    # 17 is in the sentence after the one the claim aligns with); the token conflict stays on the claim.
    assert [(f["figure"], f["source_says"][:2]) for f in claim["figures"]] == [("27", "17")]
    assert "(27: the source says 17 years old)" in wrong.reason
    assert wrong.settings["design.likelihood_rule"].startswith("mean PMI + 0.5 x")
    assert ONE_SENTENCE_SUMMARY_INSTRUCTION in wrong.stages["support.0"]["prompt"]
    faithful = scorer.score(rows["faithful"]["source"], rows["faithful"]["summary"])
    assert all(c["supported"] for c in faithful.claims) and not any(c.get("conflict") for c in faithful.claims)


def test_calibrate_on_the_real_judge_picks_a_threshold_between_its_rows(judge, tmp_path):
    """The demo's rows labelled by hand: the faithful and the thin summary are consistent, the wrong fact is not."""
    import json
    from importlib import resources

    from offline_sumscore.runs.calibrate import calibrate_file

    rows = [json.loads(line) for line in (resources.files("offline_sumscore") / "examples" / "demo.jsonl").open()]
    labelled = tmp_path / "labelled.jsonl"
    labels = {"faithful": "consistent", "wrong-fact": "inconsistent", "thin": "consistent"}
    labelled.write_text("".join(json.dumps(dict(r, label=labels[r["id"]])) + "\n" for r in rows if r["id"] in labels))
    run = calibrate_file(labelled, model=judge, resamples=200)
    c = run.calibration
    assert c.rows == 3 and c.consistent == 2 and run.judge["identity"] == judge.identity and run.failed == 0
    assert -20 < c.threshold < 20 and 0.5 <= c.balanced_accuracy <= 1.0


def test_a_transcripts_coverage_items_are_its_turns_without_labels_and_the_stated_one_is_covered(judge):
    """A call transcript without sentence punctuation: each turn of 4+ words is a key sentence, without its speaker's
    label; the turn the summary states is covered, the greeting it leaves out is not."""
    transcript = (
        "Alice: thanks everyone for joining today\nBob: hi all\n"
        "Alice: the budget for the new warehouse is four million dollars\n"
        "Carol: I will send the permit request to the council by friday"
    )
    summary = "The budget for the new warehouse is four million dollars. Carol will send the permit request by Friday."
    r = SummarizationScorer(judge).score(transcript, summary)
    assert r.questions == [
        "thanks everyone for joining today",
        "the budget for the new warehouse is four million dollars",
        "I will send the permit request to the council by friday",
    ]
    greeting, budget, permit = r.coverage_verdicts
    assert budget["answered"] and permit["answered"] and not greeting["answered"]
    assert min(budget["pmi"], permit["pmi"]) > greeting["pmi"] + 2  # measured: 3.3 and 2.5 against -0.5 nats
