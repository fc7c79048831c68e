"""The stream and the prefix store on the real embedded judge.

Four summaries of two sources, scored in the design that decodes (yes-no verdicts with reasons, questions written
by the judge) and in the embedded design (likelihood verdicts). Rows are compared on what a user reads: score, each
verdict and its text, and P(yes) to 1e-3 (padding and batch shape move float sums slightly); never on timing or on
how many requests shared a call.
"""

import pytest

from benchmarks.lib.row_diff import without_timing
from offline_sumscore import SummarizationScorer
from offline_sumscore.engine.local import EngineFeatures, TransformersEngine
from offline_sumscore.engine.local.lab import LabSettings
from offline_sumscore.scorers.stages.questions import questions_list, questions_prompt
from tests.conftest import SOURCE, SUMMARY

pytestmark = pytest.mark.model

OTHER_SOURCE = (
    "Heavy rain flooded the river town of Ostby overnight. About 200 homes were evacuated and schools "
    "will stay shut until Friday."
)
ITEMS = [
    (SOURCE, SUMMARY),
    (OTHER_SOURCE, "Rain flooded Ostby; 200 homes were evacuated."),
    (SOURCE, "Lindford's council voted for a library. Work starts in March."),
    (OTHER_SOURCE, "Schools in Ostby stay shut until Friday after a flood."),
]
DECODING = dict(
    claims="sentences", coverage="questions", verdicts="yes-no", max_questions=2, max_text_chars=60, max_reason_chars=30
)
EMBEDDED = dict(claims="sentences", coverage="key_sentences", verdicts="likelihood", key_sentences=2)


def readable(result):
    """What a user reads off a row."""
    d = result.to_dict()
    return {
        "score": d["score"],
        "claims": [(c["claim"], c["supported"]) for c in d["claims"]],
        "coverage": list(zip(d["questions"], [v["answered"] for v in d["coverage_verdicts"]])),
        "texts": {k: s["raw_output"] for k, s in d["stages"].items()},
        "p": [c["p_supported"] for c in d["claims"]] + [v["p_answered"] for v in d["coverage_verdicts"]],
    }


def same_rows(left, right):
    for a, b in zip(left, right, strict=True):
        ra, rb = readable(a), readable(b)
        assert ra["score"] == rb["score"] and ra["claims"] == rb["claims"] and ra["coverage"] == rb["coverage"]
        assert ra["texts"] == rb["texts"]
        assert len(ra["p"]) == len(rb["p"]) and all(abs(x - y) < 1e-3 for x, y in zip(ra["p"], rb["p"]))


def score(judge, options, items=ITEMS, without=()):
    engine = TransformersEngine(judge, lab=LabSettings(features=EngineFeatures().without(*without)))
    return SummarizationScorer(engine=engine, **options).score_many(items), engine


@pytest.fixture(scope="module")
def streamed(judge):
    return {name: score(judge, options) for name, options in (("decoding", DECODING), ("embedded", EMBEDDED))}


@pytest.mark.parametrize("design", ["decoding", "embedded"])
def test_rows_through_the_stream_equal_rows_run_alone(judge, streamed, design):
    options = DECODING if design == "decoding" else EMBEDDED
    rows, engine = streamed[design]
    alone = [score(judge, options, [item], without=["continuous", "prefix_store"])[0][0] for item in ITEMS]
    same_rows(rows, alone)
    assert engine.stats.stored_tokens > 0  # the second summary of each source took its source from the store


def test_two_runs_give_identical_rows(judge, streamed):
    rows, _ = streamed["decoding"]
    again, _ = score(judge, DECODING)

    # Wall times aside, and the engine's sizing where it was read from the memory free at its start (another
    # process on the machine moves it between the two runs: seen in a clean-clone CI run beside a soak benchmark)
    assert without_timing([r.to_dict() for r in rows]) == without_timing([r.to_dict() for r in again])


def test_a_prefix_evicted_and_recomputed_gives_the_same_rows(judge):
    # Two calls on one engine: the second scores other summaries of the first call's two sources. A roomy store
    # serves the sources again; a store of 300 tokens (about one prompt prefix) has evicted them, so they are
    # computed again.
    runs = {}
    for budget in (None, 300):
        engine = TransformersEngine(judge, lab=LabSettings(store_tokens=budget))
        scorer = SummarizationScorer(engine=engine, **DECODING)
        first = scorer.score_many(ITEMS[:2])
        before = engine.stats.stored_tokens
        second = scorer.score_many(ITEMS[2:])
        runs[budget] = (first + second, engine, engine.stats.stored_tokens - before)
    same_rows(runs[None][0], runs[300][0])
    assert runs[300][1].store.evictions > 0
    assert runs[None][2] > runs[300][2]  # reused from the roomy store; recomputed after eviction from the tight one


def test_identical_requests_in_flight_are_computed_once(judge):
    from offline_sumscore.core.stages import StageRequest

    # A source's questions, asked for each of three summaries of it.
    reqs = [
        StageRequest(sid, "questions", tuple(questions_prompt(SOURCE, n=2)), questions_list(2, 40)) for sid in "abc"
    ]
    engine = TransformersEngine(judge)
    results = engine.run(reqs)
    alone = TransformersEngine(judge, lab=LabSettings(features=EngineFeatures(prefix_store=False))).run(reqs[:1])[0]
    assert all(r.ok for r in results) and [r.raw_output for r in results] == [alone.raw_output] * 3
    assert [r.cached for r in results] == [False, True, True] and [r.request.sample_id for r in results] == list("abc")
    assert engine.stats.decoded_tokens == alone.decoded_tokens  # decoded once
