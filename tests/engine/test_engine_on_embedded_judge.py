"""The batching engine on the real embedded judge: every feature against the plain path it replaces.

The engine never knows a metric, so these tests send it a fixed mix of stage requests, the kinds the scorers send:
JSON lists (claims, questions), yes-no verdicts with and without a reason, and likelihood requests with their
baselines. Each comparison runs the mix through two engine configurations and asserts the same greedy text
(exact), the same P(yes) (to 1e-3: a pass's shape changes float sums slightly) and the same likelihoods (to 1e-4).
"""

import pytest
import torch

from offline_sumscore import SummaryScore
from offline_sumscore.core import schemas
from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.local import EngineFeatures, TransformersEngine
from offline_sumscore.engine.local.lab import LabSettings
from offline_sumscore.engine.local.shared_pages import SlotPrefixes
from offline_sumscore.scorers.stages.claims import claims_list, claims_prompt
from offline_sumscore.scorers.stages.questions import questions_list, questions_prompt
from offline_sumscore.scorers.stages.verdict import likelihood_prompt, question_prompt, statement_prompt, yes_no_verdict
from tests.conftest import SOURCE, SUMMARY
from tests.copied_keyphrases import CopiedKeyphrases

pytestmark = pytest.mark.model

OTHER_SOURCE = (
    "Heavy rain flooded the river town of Ostby overnight. About 200 homes were evacuated and schools "
    "will stay shut until Friday."
)
OTHER_SUMMARY = "Rain flooded Ostby; 200 homes were evacuated."
YES_NO = ("Y", "N")


def mix() -> list[StageRequest]:
    reqs = []
    for sid, source, summary, questions in (
        ("a", SOURCE, SUMMARY, ["Did the council vote to build a library?", "Will construction begin in March?"]),
        ("b", OTHER_SOURCE, OTHER_SUMMARY, ["Were about 200 homes evacuated?", "Will schools stay shut?"]),
    ):
        reqs.append(StageRequest(sid, "claims", tuple(claims_prompt(summary)), claims_list(3, 50)))
        reqs.append(StageRequest(sid, "questions", tuple(questions_prompt(source, n=2)), questions_list(2, 50)))
        for claim in (summary, "The town has a new mayor."):
            reqs.append(
                StageRequest(
                    sid,
                    "support",
                    tuple(statement_prompt(source, claim, with_reason=True)),
                    yes_no_verdict(30),
                    verdict_choice=YES_NO,
                )
            )
            reqs.append(
                StageRequest(
                    sid,
                    "support",
                    tuple(likelihood_prompt(source, style="bare")),
                    schemas.Likelihood,
                    continuation=claim,
                )
            )
            reqs.append(
                StageRequest(
                    sid, "baseline", tuple(likelihood_prompt("", style="bare")), schemas.Likelihood, continuation=claim
                )
            )
        for question in questions:
            reqs.append(
                StageRequest(
                    sid,
                    "coverage",
                    tuple(question_prompt(summary, question)),
                    yes_no_verdict(None),
                    verdict_choice=YES_NO,
                )
            )
    return reqs


def run(judge, without=(), pass_tokens=None, attention_kernel=True, pick_kernel=True, **engine_options):
    settings = dict(
        features=EngineFeatures().without(*without),
        pass_tokens=pass_tokens,
        attention_kernel=attention_kernel,
        pick_kernel=pick_kernel,
    )
    engine = TransformersEngine(judge, lab=LabSettings(**settings), **engine_options)  # the developer hook
    return engine.run(mix()), engine.stats


def same(left, right):
    for a, b in zip(left, right):
        assert a.ok and b.ok, (a.error, b.error)
        assert a.raw_output == b.raw_output
        assert len(a.choice_probs) == len(b.choice_probs)
        assert all(abs(x - y) < 1e-3 for x, y in zip(a.choice_probs, b.choice_probs))
        if a.request.continuation is not None:
            assert abs(a.value.mean_logprob - b.value.mean_logprob) < 1e-4 and a.value.tokens == b.value.tokens


@pytest.fixture(scope="module")
def full(judge):
    return run(judge)


def test_batched_rows_equal_one_at_a_time(judge, full):
    alone, stats = run(judge, ["shared_prefix"], batch_size=1)  # every row alone in its batch
    same(full[0], alone)
    assert stats.forward_passes > full[1].forward_passes  # batching really merged passes


def test_prompts_fed_in_chunks_equal_prompts_fed_whole(judge, full):
    chunked, stats = run(judge, pass_tokens=40)  # every prompt here is longer: each goes in over several passes
    same(full[0], chunked)
    assert stats.forward_passes > full[1].forward_passes
    # the same decoding; prefill may differ (likelihood groups are packed by the same budget, and a group packed
    # after another reuses its stored prefix where one packed beside it computes its own)
    assert stats.decoded_tokens == full[1].decoded_tokens and stats.forced_tokens == full[1].forced_tokens


def run_without_kernel(judge, kernel: str, off: str):
    """The engine's description names the kernel switched off as `off`, and where it applies (AVX-512) the kernel
    runs rather than falling back; then the mix run with the kernel off."""
    assert TransformersEngine(judge, lab=LabSettings(**{kernel: False})).describe()[kernel] == off
    on = TransformersEngine(judge).describe()[kernel]
    if "AVX512" in torch.backends.cpu.get_cpu_capability():  # where it applies it must run, not fall back
        assert on.startswith("kernel"), on
    return run(judge, **{kernel: False})


def test_passes_attended_by_the_kernel_equal_passes_attended_through_sdpa(judge, full):
    sdpa, stats = run_without_kernel(judge, "attention_kernel", "sdpa (the kernel switched off)")
    same(full[0], sdpa)
    assert stats.as_dict() | {"seconds": 0} == full[1].as_dict() | {"seconds": 0}  # the same passes, tokens, drafts


def test_picks_by_the_kernel_equal_picks_on_torch_operators(judge, full):
    plain, stats = run_without_kernel(judge, "pick_kernel", "torch (the kernel switched off)")
    same(full[0], plain)
    # the same logits read the same way: every pick, and every P(yes) to the bit
    assert [r.choice_probs for r in full[0]] == [r.choice_probs for r in plain]
    assert any(r.choice_probs for r in plain)
    assert stats.as_dict() | {"seconds": 0} == full[1].as_dict() | {"seconds": 0}


def test_shared_prefix_rows_equal_unshared_rows(judge, full):
    unshared, stats = run(judge, ["shared_prefix"])
    same(full[0], unshared)
    assert full[1].prefill_tokens < stats.prefill_tokens  # each source and summary prefix was computed once


def test_a_prefix_mapped_from_one_copy_into_its_rows_gives_every_number_copies_give(judge, monkeypatch):
    """On a CPU a forked prefix's whole pages are mapped into each row's slot from one copy (shared_pages.py), not
    copied: the rows attend the same keys and values, so every output is the same to the bit."""
    mapped = []
    share = SlotPrefixes.share

    def recorded(self, *args):
        mapped.append(share(self, *args))
        return mapped[-1]

    monkeypatch.setattr(SlotPrefixes, "share", recorded)
    shared, _ = run(judge)
    assert max(mapped) >= 64  # columns mapped from one copy (16 a page for this judge)
    monkeypatch.setattr(SlotPrefixes, "share", lambda self, *args: 0)  # copies, as before
    copied, _ = run(judge)
    assert [(r.raw_output, r.choice_probs) for r in shared] == [(r.raw_output, r.choice_probs) for r in copied]
    assert [r.value for r in shared if r.request.continuation] == [r.value for r in copied if r.request.continuation]


def test_drafted_rows_equal_rows_decoded_one_token_a_step(judge, full):
    plain, stats = run(judge, ["drafts"])
    same(full[0], plain)
    assert full[1].accepted_draft_tokens > 0 and stats.draft_tokens == 0  # drafts were fed, and some were kept
    assert full[1].forward_passes < stats.forward_passes and full[1].decoded_tokens == stats.decoded_tokens


def test_forced_tokens_and_logit_verdicts_equal_token_by_token_decoding(judge, full):
    plain, stats = run(judge, ["shared_prefix", "forced_tokens", "logit_verdicts"])
    same(full[0], plain)
    assert full[1].forced_tokens > 0 and stats.forced_tokens == 0
    assert full[1].decoded_tokens < stats.decoded_tokens and full[1].skipped_forwards > 0


def test_p_yes_is_on_the_same_side_as_the_decoded_verdict_and_the_reason_comes_after_it(full):
    verdicts = [r for r in full[0] if r.request.verdict_choice == YES_NO]
    assert len(verdicts) == 8
    for r in verdicts:
        assert len(r.choice_probs) == 1 and 0 < r.choice_probs[0] < 1
        assert (r.choice_probs[0] > 0.5) == r.value.verdict == r.raw_output.startswith("Yes")
        if r.request.schema.reason_chars:
            assert r.raw_output.split("\n")[1].startswith("Reason: ") and r.value.reason


def test_likelihoods_equal_a_plain_forward_pass(judge, full):
    for r in full[0]:
        if r.request.continuation is None:
            continue
        tok = judge.tokenizer
        ids = tok(judge.render(r.request.messages), add_special_tokens=False)["input_ids"]
        cont = tok(r.request.continuation, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            logp = judge.model(input_ids=torch.tensor([ids + cont])).logits[0].float().log_softmax(-1)
        reference = sum(logp[len(ids) - 1 + k, cont[k]].item() for k in range(len(cont))) / len(cont)
        assert r.value.tokens == len(cont) and abs(r.value.mean_logprob - reference) < 1e-4


def test_verdict_only_rows_cost_one_forward_pass_each(judge):
    engine = TransformersEngine(judge)
    reqs = [r for r in mix() if r.stage == "coverage" and r.sample_id == "a"]
    results = engine.run(reqs)
    assert all(r.ok and r.decoded_tokens == 1 and len(r.choice_probs) == 1 for r in results)
    assert engine.stats.forward_passes == 2  # one prefill of the shared summary, one verdict pass for both rows


def test_summary_score_answers_through_the_engine_with_p_yes(judge):
    # Its keyphrases copied from the text: the 135M echoes the prompt's own kinds, which fail that stage.
    engine = CopiedKeyphrases(TransformersEngine(judge))
    r = SummaryScore(engine=engine, max_questions=2, max_keyphrases=2, max_text_chars=40, answers="questions").score(
        SOURCE, SUMMARY
    )
    assert r.keyphrases == ["Lindford", "Tuesday"] and r.stages["ragas_questions"]["tokens_out"] > 0
    assert len(r.answer_p_yes) == len(r.answers)
    assert all((p > 0.5) == (a == "1") for p, a in zip(r.answer_p_yes, r.answers))


def test_engine_text_equals_plain_transformers_generate_under_the_same_grammar(judge):
    """The hot loop against the reference it replaces: HF generate + outlines' llguidance processor, greedy."""
    engine = TransformersEngine(judge)
    reqs = [r for r in mix() if r.sample_id == "a" and r.continuation is None and r.stage != "claims"]
    ours = engine.run(reqs)
    tok = judge.tokenizer
    for req, res in zip(reqs, ours):
        enc = tok([judge.render(req.messages)], return_tensors="pt", add_special_tokens=False)
        out = judge.model.generate(
            **enc,
            logits_processor=[engine.grammars.processor(req.grammar)],
            max_new_tokens=200,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=tok.pad_token_id,
        )
        reference = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        assert res.ok and res.raw_output == reference
