"""Metric arithmetic: every edge case of both scorers, on plain values (no model, no engine)."""

import math

import pytest

from offline_sumscore import summary_score, two_axis_score
from offline_sumscore.core.arithmetic import alignment, conciseness, coverage, ratio, round_half_up, verdict_is_yes


@pytest.mark.parametrize(
    "value, expected",
    [
        (2 / 3, 0.67),
        (0.125, 0.13),
        (0.005, 0.01),
        (0.994, 0.99),
        (0.995, 1.0),
        (1 / 3, 0.33),
        (0.0, 0.0),
        (1.0, 1.0),
        (6.665, 6.67),
        (0.375, 0.38),
    ],
)
def test_round_half_up_rounds_halves_up_like_math_round(value, expected):
    assert round_half_up(value) == expected


def test_round_half_up_differs_from_python_round_on_a_half():
    assert round(0.125, 2) == 0.12 and round_half_up(0.125) == 0.13


def test_ratio_with_zero_denominator_is_zero_not_nan():
    assert ratio(0, 0) == 0.0 and ratio(3, 0) == 0.0 and ratio(1, 4) == 0.25


def test_alignment_is_share_of_supported_claims():
    assert alignment([True, False, True]) == pytest.approx(2 / 3)
    assert alignment([]) == 0.0


def test_coverage_matches_verdicts_by_position_missing_count_unanswered_extra_ignored():
    assert coverage([True, True], 4) == 0.5  # two missing verdicts count as unanswered
    assert coverage([True, False, True, True, True], 3) == pytest.approx(2 / 3)  # extras ignored
    assert coverage([False, True], 2) == 0.5  # position, not content


def test_coverage_denominator_is_capped_by_max_questions():
    verdicts = [True, True, False, False, False]
    assert coverage(verdicts, n_questions=5, max_questions=2) == 1.0  # only the first two count
    assert coverage(verdicts, n_questions=5, max_questions=10) == 0.4


def test_two_axis_score_is_min_of_axes_rounded_half_up_after_scaling():
    r = two_axis_score([True, True, False], ["q1", "q2"], [True, True])
    assert (r.score, r.alignment, r.coverage, r.limiting_axis) == (0.67, pytest.approx(2 / 3), 1.0, "alignment")
    assert two_axis_score([True] * 8 + [False], ["q"] * 8, [True] * 8, scale=10).score == 8.89
    # 0.125 x 1 rounds to 0.13: seven of eight questions unanswered
    assert two_axis_score([True], ["q"] * 8, [True] + [False] * 7).score == 0.13


def test_two_axis_no_claims_or_no_questions_scores_zero_not_nan():
    assert two_axis_score([], ["q"], [True]).score == 0.0
    r = two_axis_score([True], [], [])
    assert r.score == 0.0 and r.coverage == 0.0 and not math.isnan(r.score)


def test_two_axis_question_cap_and_positional_matching():
    questions = [f"q{i}" for i in range(12)]
    r = two_axis_score([True], questions, [True] * 10 + [False, False], max_questions=10)
    assert r.coverage == 1.0  # the 11th and 12th are beyond the cap
    assert two_axis_score([True], questions, [True] * 5, max_questions=10).coverage == 0.5


def test_two_axis_strict_mode_zeroes_any_axis_below_one():
    r = two_axis_score([True, True, False], ["q"], [True], strict_mode=True)
    assert (r.alignment, r.coverage, r.score, r.passed) == (0.0, 1.0, 0.0, False)
    assert two_axis_score([True], ["q"], [True], strict_mode=True).passed


def test_two_axis_threshold_decides_passed_on_the_unscaled_score():
    assert two_axis_score([True, False], ["q"], [True], threshold=0.5, scale=10).passed
    assert not two_axis_score([True, False], ["q"], [True], threshold=0.6, scale=10).passed


def test_two_axis_rejects_bad_settings():
    with pytest.raises(ValueError, match="max_questions must be an integer >= 1. Given: 0"):
        two_axis_score([True], ["q"], [True], max_questions=0)
    with pytest.raises(ValueError, match="scale must be > 0"):
        two_axis_score([True], ["q"], [True], scale=0)


def test_verdicts_accepted_as_dicts_strings_and_objects_as_in_output_files():
    class V:
        supported = True

    claims = [{"claim": "a", "supported": True, "reason": "x"}, {"claim": "b", "supported": False}, "yes", V()]
    verdicts = [{"answered": True}, {"answered": "no"}]
    r = two_axis_score(claims, ["q1", "q2"], verdicts)
    assert (r.alignment, r.coverage) == (0.75, 0.5)


def test_unreadable_verdict_names_its_position():
    with pytest.raises(ValueError, match="verdict 1: 'maybe'"):
        alignment([True, "maybe"])
    with pytest.raises(ValueError, match="verdict 0: dict has none of the keys"):
        verdict_is_yes({"foo": 1})


def test_summary_score_formula_with_length_penalty():
    text, summary = "a" * 100, "b" * 25
    r = summary_score(["1", "0", "1", "1"], text, summary, coeff=0.5)
    assert r.qa == 0.75
    assert r.conciseness == pytest.approx(1 - 25 / (100 + 1e-10))
    assert r.score == pytest.approx(0.75 * 0.5 + r.conciseness * 0.5)


def test_summary_score_coeff_weights_and_no_rounding():
    r = summary_score(["1", "0", "0"], "x" * 90, "y" * 30, coeff=0.2)
    assert r.score == pytest.approx((1 / 3) * 0.8 + (1 - 30 / 90) * 0.2)
    assert r.score != round(r.score, 2)


def test_summary_score_without_length_penalty_is_qa():
    r = summary_score(["1", "0"], "text here", "sum", length_penalty=False)
    assert (r.score, r.qa, r.conciseness) == (0.5, 0.5, None)


def test_summary_score_joins_contexts_with_newline_for_length():
    r = summary_score(["1"], ["abcd", "efgh"], "ab")
    assert r.conciseness == pytest.approx(1 - 2 / (9 + 1e-10))  # "abcd\nefgh" has 9 characters


def test_summary_longer_than_text_has_zero_conciseness():
    assert conciseness("x" * 50, "y" * 10) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("coeff", [-0.1, 1.5])
def test_summary_score_rejects_coeff_outside_unit_interval(coeff):
    with pytest.raises(ValueError, match=f"coeff must be between 0 and 1. Given: {coeff}"):
        summary_score(["1"], "text", "sum", coeff=coeff)


@pytest.mark.parametrize(
    "text, summary, what",
    [("", "s", "reference contexts"), ("  \n", "s", "reference contexts"), ([" ", ""], "s", "reference contexts")],
)
def test_summary_score_empty_or_whitespace_contexts_raise_value_error(text, summary, what):
    with pytest.raises(ValueError, match=what):
        summary_score(["1"], text, summary)


@pytest.mark.parametrize("summary", ["", " \n"])
def test_summary_score_of_an_empty_summary_is_0_whatever_its_answers_and_conciseness(summary):
    assert summary_score([], "text", summary) == summary_score(["1"], "text", summary)
    value = summary_score([], "text", summary, coeff=1.0)
    assert (value.score, value.qa) == (0.0, 0.0) and value.conciseness > 0.5  # the formula's, which does not count
    assert summary_score([], "text", summary, length_penalty=False).conciseness is None


def test_summary_score_zero_answers_is_an_error_not_nan():
    with pytest.raises(ValueError, match="no answers to score"):
        summary_score([], "text", "summary")


def test_two_axis_score_takes_the_documented_keyword_names():
    r = two_axis_score(
        alignment=[True, False], questions=["q1", "q2"], coverage=[{"answered": True}], max_questions=10, scale=1.0
    )
    assert (r.score, r.alignment, r.coverage) == (0.5, 0.5, 0.5)
