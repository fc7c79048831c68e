"""The batching engine on the real embedded judge: every feature against the plain path it replaces.

Each comparison runs the same two samples through two engine configurations and asserts the same greedy output
(claims, verdicts, reasons, questions: exact) and the same P(yes) (to 1e-3: padding changes float sums slightly).
"""
import pytest
import torch

from offline_sumscore import SummarizationScorer, SummaryScore
from offline_sumscore.engine.runner import TransformersEngine
from tests.conftest import SOURCE, SUMMARY

pytestmark = pytest.mark.model

SAMPLES = [{"id": "a", "source": SOURCE, "summary": SUMMARY,
            "questions": ["Did the council vote to build a library?", "Will construction begin in March?"]},
           {"id": "b", "source": "Heavy rain flooded the river town of Ostby overnight. About 200 homes were "
                                 "evacuated and schools will stay shut until Friday.",
            "summary": "Rain flooded Ostby; 200 homes were evacuated.",
            "questions": ["Were about 200 homes evacuated?", "Will schools stay shut until Friday?"]}]
CAPS = dict(max_claims=2, max_text_chars=50, max_reason_chars=30)


def run(judge, **engine_options):
    engine = TransformersEngine(judge, **engine_options)
    results = SummarizationScorer(engine=engine, **CAPS).score_many(SAMPLES)
    return results, engine.stats


def same(left, right):
    for a, b in zip(left, right):
        strip = lambda rows, key: [{k: v for k, v in r.items() if k != key} for r in rows]
        assert strip(a.claims, "p_supported") == strip(b.claims, "p_supported")
        assert strip(a.coverage_verdicts, "p_answered") == strip(b.coverage_verdicts, "p_answered")
        assert a.score == b.score
        for x, y in zip(a.claims + a.coverage_verdicts, b.claims + b.coverage_verdicts):
            px, py = x.get("p_supported", x.get("p_answered")), y.get("p_supported", y.get("p_answered"))
            assert (px is None) == (py is None) and (px is None or abs(px - py) < 1e-3)


@pytest.fixture(scope="module")
def full(judge):
    return run(judge)


def test_batched_rows_equal_one_at_a_time(judge, full):
    alone, stats = run(judge, batch_size=1, shared_prefix=False)  # every row alone in its batch
    same(full[0], alone)
    assert stats.forward_passes > full[1].forward_passes  # batching really merged passes


def test_shared_prefix_rows_equal_unshared_rows(judge, full):
    unshared, stats = run(judge, shared_prefix=False)
    same(full[0], unshared)
    assert full[1].prefill_tokens < stats.prefill_tokens  # the summary prefix was computed once per sample


def test_forced_tokens_and_logit_verdicts_equal_token_by_token_decoding(judge, full):
    plain, stats = run(judge, shared_prefix=False, forced_tokens=False, logit_verdicts=False)
    same(full[0], plain)
    assert full[1].forced_tokens > 0 and stats.forced_tokens == 0
    assert full[1].decoded_tokens < stats.decoded_tokens and full[1].skipped_forwards > 0


def test_logit_verdict_probability_agrees_with_the_greedy_verdict(full):
    for r in full[0]:
        for claim in r.claims:
            assert (claim["p_supported"] > 0.5) == claim["supported"]
        for verdict in r.coverage_verdicts:
            assert (verdict["p_answered"] > 0.5) == verdict["answered"]
        assert 0 <= r.soft_alignment <= 1 and 0 <= r.soft_coverage <= 1


def test_verdict_only_rows_cost_one_forward_pass_each(judge):
    engine = TransformersEngine(judge)
    scorer = SummarizationScorer(engine=engine, include_reason=False, **CAPS)
    scorer.score_many(SAMPLES[:1])
    before = engine.stats.forward_passes
    # Claims and questions are given again, so only the coverage wave is new: 2 verdicts, batched, no reasons.
    from offline_sumscore.stages import StageRequest
    from offline_sumscore import prompts, schemas
    reqs = [StageRequest("a", "coverage", tuple(prompts.coverage_prompt(SUMMARY, q, with_reason=False)),
                         schemas.coverage_verdict(None), verdict_choice=("t", "f")) for q in SAMPLES[0]["questions"]]
    results = engine.run(reqs)
    assert all(r.ok and r.decoded_tokens == 1 and len(r.choice_probs) == 1 for r in results)
    assert engine.stats.forward_passes - before == 2  # one prefill of the shared summary, one verdict pass


def test_injected_out_of_memory_is_recovered_by_splitting(judge, full):
    raised = []

    def oom_once_per_kind(kind, rows):
        if rows > 1 and kind not in raised:
            raised.append(kind)
            raise torch.OutOfMemoryError(f"injected: {kind} with {rows} rows")

    recovered, stats = run(judge, fault_injector=oom_once_per_kind)
    same(full[0], recovered)
    assert set(raised) == {"prefill", "step"} and stats.oom_splits == 2


def test_summary_score_answers_through_the_engine_with_p_yes(judge):
    r = SummaryScore(judge, max_questions=2, max_keyphrases=2, max_text_chars=40).score(SOURCE, SUMMARY)
    assert len(r.answer_p_yes) == len(r.answers)
    assert all((p > 0.5) == (a == "1") for p, a in zip(r.answer_p_yes, r.answers))


def test_engine_text_equals_plain_transformers_generate_under_the_same_grammar(judge):
    """The hot loop against the reference it replaces: HF generate + outlines' llguidance processor, greedy."""
    from offline_sumscore import prompts, schemas
    from offline_sumscore.stages import StageRequest

    engine = TransformersEngine(judge)
    reqs = [StageRequest("a", "coverage", tuple(prompts.coverage_prompt(SUMMARY, q, with_reason=True)),
                         schemas.coverage_verdict(30), verdict_choice=("t", "f")) for q in SAMPLES[0]["questions"]]
    reqs.append(StageRequest("b", "questions", tuple(prompts.questions_prompt(SOURCE, max_questions=2)),
                             schemas.questions_list(2, 40)))
    ours = engine.run(reqs)
    tok = judge.tokenizer
    for req, res in zip(reqs, ours):
        enc = tok([judge.render(req.messages)], return_tensors="pt", add_special_tokens=False)
        out = judge.model.generate(**enc, logits_processor=[engine.grammars.processor(req.schema_json)],
                                   max_new_tokens=200, do_sample=False, temperature=None, top_p=None, top_k=None,
                                   pad_token_id=tok.pad_token_id)
        reference = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        assert res.ok and res.raw_output == reference
