"""Each peer's two-axis arithmetic on worked vectors.

Mastra: the cases of its summarization scorer's own test file (claims x questions -> score), its
roundToTwoDecimals = Math.round((x + Number.EPSILON) * 100) / 100 on values where the EPSILON matters (checked
against node: 0.575 -> 0.58, 0.285 -> 0.29, 1.005 -> 1.01). DeepEval: SummarizationMetric._calculate_score (only
"yes" claim verdicts count, "idk" counts against; coverage over the questions the source answers yes; no rounding;
strict mode zeroes an axis below 1).
"""

import pytest

from offline_sumscore import two_axis_score
from offline_sumscore.core.arithmetic import round_half_up, round_mastra

T, F = True, False


@pytest.mark.parametrize(
    "claims, answered, scale, expected",
    [
        ([T, T], [T, T], 1, 1.0),  # every claim supported, every question answered
        ([T, F], [T, T], 1, 0.5),  # alignment is the weaker axis
        ([T], [F, T, F, F], 1, 0.25),  # coverage is the weaker axis
        ([F], [T], 1, 0.0),  # no claim supported
        ([T, T, F], [T, T], 1, 0.67),  # rounded to two decimals
        ([T, F], [T, T], 10, 5.0),  # custom scale
    ],
)
def test_mastra_worked_vectors(claims, answered, scale, expected):
    assert two_axis_score(claims, [f"q{i}" for i in range(len(answered))], answered, scale=scale).score == expected


def test_mastra_edge_cases_from_its_tests():
    assert two_axis_score([], ["q"], [T]).score == 0  # no claims
    assert two_axis_score([T], [], []).score == 0  # no questions
    assert two_axis_score([T], ["a", "b", "c", "d"], [T]).score == 0.25  # too few verdicts: the rest are missed
    assert two_axis_score([T], ["a"], [T, F, F]).score == 1  # verdicts beyond the questions are ignored
    fourteen = [f"q{i}" for i in range(14)]
    assert two_axis_score([T], fourteen, [i < 10 for i in range(14)]).score == 1  # the default cap of ten
    assert two_axis_score([T], fourteen, [i < 3 for i in range(14)], max_questions=3).score == 1


def test_mastra_no_claims_scores_zero_even_when_coverage_is_full_and_says_it_cannot_be_scored():
    r = two_axis_score([], ["q1", "q2"], [T, T])
    assert (r.score, r.alignment, r.coverage, r.scorable) == (0.0, 0.0, 1.0, False)


@pytest.mark.parametrize(
    "value, mastra, plain",
    [(0.575, 0.58, 0.57), (0.285, 0.29, 0.28), (1.005, 1.01, 1.0), (2 / 3, 0.67, 0.67), (0.125, 0.13, 0.13)],
)
def test_mastra_rounding_includes_number_epsilon(value, mastra, plain):
    assert round_mastra(value) == mastra and round_half_up(value) == plain


def test_mastra_epsilon_changes_a_whole_score():
    # 23 of 40 claims supported: 0.575, which plain half-up on 57.49999999999999 would give as 0.57
    assert two_axis_score([T] * 23 + [F] * 17, ["q"], [T]).score == 0.58


def test_deepeval_alignment_counts_only_yes_and_idk_counts_against():
    r = two_axis_score(["yes", "idk", "no"], ["q"], [{"answered": T}], flavor="deepeval")
    assert r.alignment == pytest.approx(1 / 3)


def test_deepeval_coverage_counts_only_questions_the_source_answers_yes():
    verdicts = [
        {"answered": T, "source_answered": T},
        {"answered": F, "source_answered": T},
        {"answered": T, "source_answered": F},
        {"answered": F, "source_answered": F},
    ]
    r = two_axis_score([T], ["q1", "q2", "q3", "q4"], verdicts, flavor="deepeval")
    assert r.coverage == 0.5 and r.score == 0.5
    none_yes = [{"answered": T, "source_answered": F}]
    assert two_axis_score([T], ["q"], none_yes, flavor="deepeval").coverage == 0


def test_deepeval_is_not_rounded_and_strict_mode_zeroes_an_axis_below_one():
    r = two_axis_score([T, T, F], ["q"], [{"answered": T}], flavor="deepeval")
    assert r.score == 2 / 3 and r.score != 0.67
    strict = two_axis_score([T], ["q1", "q2"], [{"answered": T}, {"answered": F}], flavor="deepeval", strict_mode=True)
    assert (strict.alignment, strict.coverage, strict.score, strict.passed) == (1.0, 0.0, 0.0, False)
    assert two_axis_score([T], ["q"], [{"answered": T}], flavor="deepeval", strict_mode=True).passed


def test_deepeval_no_claims_gives_alignment_zero():
    r = two_axis_score([], ["q"], [{"answered": T}], flavor="deepeval")
    assert r.alignment == 0 and r.score == 0


def test_unknown_flavor_is_refused():
    with pytest.raises(ValueError, match="flavor must be one of mastra, deepeval"):
        two_axis_score([T], ["q"], [T], flavor="ragas")
