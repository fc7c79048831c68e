"""The figure check (core.figures), without a model: every number, amount, percentage and date of a summary sentence
that its source does not state is named, with the source's figure of its kind where the sentence sits in the
source; a figure the source states in another form ("12 per cent" for "12%", "two" for "2", "1.2bn" for "1.2
billion") is no finding, and neither is any word the source holds."""

import pytest

from offline_sumscore.core.figures import (
    aligned_sentence,
    figure_check,
    figure_note,
    figures,
    holds_in_place,
    holds_word,
)

SOURCE = (
    "The council of Elmstead said on Tuesday that it had 1,870 vacant posts. It received 3,214 complaints last year, "
    "up 6.4 percent, and its budget of 1.2 billion pounds is due for review in September. The mayor, Ana Costa, "
    "will retire in 2027."
)


@pytest.mark.parametrize(
    "summary",
    [
        "Elmstead has 1,870 vacant posts and received 3,214 complaints, up 6.4%.",
        "Its budget of £1.2bn will be reviewed in September; Ana Costa retires in 2027.",
        "On Tuesday the council said complaints were up 6.4 per cent.",
    ],
)
def test_a_faithful_summary_whose_figures_the_source_states_in_any_form_has_no_finding(summary):
    assert figure_check(summary, SOURCE) == []


def test_a_changed_figure_is_named_with_the_sources_figure_where_the_sentence_sits():
    (found,) = figure_check("The council has 3,870 vacant posts.", SOURCE)
    assert found["figure"] == "3,870" and found["source_figure"] == "1,870"  # not 3,214: the posts, not complaints
    assert figure_note(found) == "3,870: the source says 1,870 vacant posts"
    (month,) = figure_check("Its budget will be reviewed in October.", SOURCE)
    assert figure_note(month) == "October: the source says September"
    (year,) = figure_check("The mayor will retire in 2028.", SOURCE)
    assert year["source_figure"] == "2027" and year["kind"] == "year"


def test_a_changed_amount_is_named_with_the_amount_for_the_same_thing_not_the_nearest_value():
    """The third day's report: "$58M" for the bridge was named against the "$48 million" bond issue beside it."""
    source = "The budget includes $38 million for the Elm Street bridge and a $48 million bond issue for schools."
    (found,) = figure_check("The budget sets aside $58M for the Elm Street bridge.", source)
    assert found["source_figure"] == "$38 million", found


def test_a_figure_with_a_unit_is_named_against_a_figure_of_the_same_measure_never_another():
    """The third day's report: "220 °C" was named against "40" (the minutes) of the sentence it sits in."""
    source = "Heat the oven to 180 °C. Bake the cake for 40 minutes, until a skewer comes out clean."
    (found,) = figure_check("Bake the cake at 220 °C for 40 minutes.", source)
    assert figure_note(found) == "220: the source says 180 °C", found
    (same_sentence,) = figure_check("Bake at 220 °C.", "Bake it at 180 degrees Celsius for 40 minutes.")
    assert same_sentence["source_figure"] == "180"
    # a unit of another measure, with no figure of its own measure anywhere: named, never a conflict
    (alone,) = figure_check("Rest the dough for 30 grams.", "Rest the dough for 20 minutes.")
    assert alone["source_figure"] is None


@pytest.mark.parametrize(
    "summary",
    ["No one was hurt.", "She was the one who scored.", "It was one of the wettest days.", "They helped one another."],
)
def test_one_that_counts_nobody_is_no_figure(summary):
    assert figure_check(summary, "Heavy rain fell on Thursday, and nobody was injured.") == []


def test_one_that_counts_is_a_figure():
    (found,) = figure_check("One bridge was closed.", "Two bridges were closed.")
    assert found["source_figure"] == "Two"


def test_a_figure_the_source_states_nowhere_with_none_of_its_kind_beside_it_is_named_without_a_rival():
    (found,) = figure_check("The mayor, Ana Costa, has 12 grandchildren.", "The mayor, Ana Costa, will retire.")
    assert found["source_figure"] is None and figure_note(found) == "12: the source states no such figure"


def test_figures_read_numbers_amounts_percentages_and_dates_by_value():
    found = {(f.kind, f.value) for f in figures("£4.2 million, 12% of 2,000 in March, two of them on Friday in 1999")}
    assert found == {
        ("amount", 4.2e6),
        ("percent", 12.0),
        ("number", 2000.0),
        ("month", "march"),
        ("number", 2),
        ("weekday", "friday"),
        ("year", 1999.0),
    }


def test_the_aligned_sentence_is_where_the_statement_sits_and_a_word_is_held_only_whole():
    assert aligned_sentence("Ana Costa retires in 2027", SOURCE).startswith("The mayor, Ana Costa")
    assert holds_word("up 6.4 percent", "6.4") and not holds_word("up 16.4 percent", "6.4")
    assert holds_word("said Saturday's match", "Saturday") and not holds_word("Saturdays", "Saturday")


def test_a_word_is_copied_in_place_beside_the_same_neighbour_and_a_swapped_name_is_not():
    assert holds_in_place("prices were up 6.4 percent in May", "6.4", "up", "percent")
    assert holds_in_place("They met on Saturday, 5 September.", "Saturday", "on", "")
    assert not holds_in_place("Chelsea beat Arsenal 2-1.", "Arsenal", "", "beat")  # "Arsenal beat Chelsea": a swap
