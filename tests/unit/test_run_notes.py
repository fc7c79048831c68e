"""What a run's rows say about the run (analysis.run_notes), without a model: a run whose scores are nearly all one
value says so and names the axis that set them, and not otherwise; text the embedded judge was not made for is
named once."""

from offline_sumscore.analysis.run_notes import alike_scores, english_share, looks_english, not_english


def row(score, axis="coverage", source="key_sentences", embedded=True, claims=("The council met on Tuesday.",)):
    return {
        "score": score,
        "limiting_axis": axis,
        "coverage_from": source,
        "judge": {"embedded": embedded},
        "claims": [{"claim": c} for c in claims],
        "questions": ["The council of Lindford voted on Tuesday to build a new library."],
    }


def test_a_run_whose_scores_are_nearly_all_one_value_says_so_and_which_axis_set_them():
    said = alike_scores([row(0.0)] * 11 + [row(0.4)])
    assert said.startswith("11 of 12 scores are 0.000, set by coverage in 11 of them (coverage here is the share of")
    assert "the source's key sentences" in said
    aligned = alike_scores([row(1.0, axis="alignment", source="questions")] * 4)
    assert "set by alignment in 4 of them" in aligned


def test_a_run_of_varied_scores_or_too_few_rows_says_nothing():
    assert alike_scores([row(0.1 * k) for k in range(10)]) is None
    assert alike_scores([row(0.0)] * 7 + [row(0.5)] * 3) is None  # 70%: under the three quarters it takes
    assert alike_scores([row(0.0)] * 2) is None
    assert alike_scores([dict(row(0.0), error={"message": "x"}, score=None)] * 5) is None  # failed rows: no scores


def test_text_that_does_not_look_english_is_named_where_the_embedded_judge_scored_it():
    spanish = "El ayuntamiento de Lindford votó el martes construir una nueva biblioteca pública en la calle Mill."
    assert english_share(spanish) < 0.08 and english_share(row(0)["questions"][0]) > 0.2
    assert looks_english("Short text.")  # too short to tell: no note
    rows = [row(0.5), dict(row(0.5), id="es-1", claims=[{"claim": spanish}], questions=[spanish])]
    said = not_english(rows)
    assert said.startswith("1 row(s) hold text that does not look like English (the first: es-1)")
    assert not_english([dict(rows[1], judge={"embedded": False})]) is None  # a brought judge may read Spanish
