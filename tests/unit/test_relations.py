"""Roles and quantity words read from the texts (core/relations.py): a swap of who did what, or "every" for a share,
is found; a paraphrase, a list in another order or a clause that closes on a name is not."""

from __future__ import annotations

from offline_sumscore.core.relations import names_in, quantity_check, role_check
from offline_sumscore.scorers.reasons import conflict_note
from offline_sumscore.scorers.two_axis_stages import relations_checked

VOTE = "The board met on Monday. Chair Ana Silva proposed the merger, and treasurer Omar Haddad opposed it."
MATCH = "Riverside beat Eastfield 2-0 on Sunday. Tom Lee scored both goals for Riverside."


def test_a_name_bound_to_another_names_action_is_a_role_swap_naming_the_source_words():
    found = role_check(
        "Treasurer Omar Haddad proposed the merger.", VOTE, "Omar Haddad proposed the merger; Ana Silva opposed it."
    )
    assert [(f["word"], f["kind"]) for f in found] == [("Haddad", "role")]
    assert found[0]["source_says"] == "Silva proposed the merger"
    assert (
        role_check("Eastfield beat Riverside 2-0 on Sunday.", MATCH, "Eastfield beat Riverside 2-0.")[0]["word"]
        == "Eastfield"
    )


def test_what_the_source_says_of_each_name_is_no_swap_whatever_the_wording():
    summary = "Ana Silva proposed the merger and Omar Haddad opposed it."
    assert role_check("Ana Silva proposed the merger.", VOTE, summary) == []
    assert role_check("Omar Haddad opposed it.", VOTE, summary) == []
    assert role_check("Riverside beat Eastfield 2-0.", MATCH, "Riverside beat Eastfield 2-0.") == []
    # a list in another order, and a name that closes a clause before the verb, bind nothing
    listed = "Kim and Ito signed the letter."
    assert role_check("Ito and Kim signed the letter.", listed, "Ito and Kim signed the letter.") == []
    clause = "Ray Parlour, who won three titles with Arsenal, has backed Jack Wilshere."
    assert role_check("Ray Parlour has backed Jack Wilshere.", clause, "Ray Parlour has backed Jack Wilshere.") == []


def test_a_swap_needs_the_other_name_in_the_summary_and_only_names_are_read():
    # the source's other name is not in the summary: the claim may simply leave it out
    assert role_check("Omar Haddad proposed the merger.", VOTE, "Omar Haddad proposed the merger.") == []
    # lower-case text (as some systems write) names no one: nothing is read rather than a guess
    assert role_check("omar haddad proposed the merger.", VOTE.lower(), "omar haddad proposed the merger.") == []
    assert names_in(VOTE) == {"ana", "silva", "omar", "haddad", "monday"}


def test_every_or_most_for_a_share_is_a_quantity_finding():
    source = "By March, 61 percent of nurses had the booster. Side effects hit 14% of patients on the drug."
    found = quantity_check("Every nurse had the booster by March.", source)
    assert [(f["word"], f["source_says"]) for f in found] == [("Every", "61 percent of nurses")]
    assert quantity_check("Side effects hit most patients on the drug.", source)[0]["source_says"] == "14 % of patients"
    assert quantity_check("The storm flooded all of Velden.", "The storm flooded parts of Velden.")[0]["word"] == "all"


def test_a_share_stated_as_the_source_states_it_or_a_count_is_no_quantity_finding():
    source = "All 480 adults finished the trial. Most patients improved, 71 percent of them within a week."
    assert quantity_check("All 480 adults finished the trial.", source) == []
    assert quantity_check("Most patients improved.", source) == []  # 71 percent is most
    assert quantity_check("Every adult finished the trial.", "All adults finished the trial.") == []


def test_a_finding_overrules_a_supported_verdict_keeps_the_judges_and_names_it_in_the_reason():
    """A scripted verdict (the judge said Yes, P 0.9): the check's word is final, the judge's is kept beside it."""
    entry = {"claim": "Omar Haddad proposed the merger.", "supported": True, "p_supported": 0.9}
    checked = relations_checked(entry, VOTE, "Omar Haddad proposed the merger; Ana Silva opposed it.")
    assert (checked["supported"], checked["p_supported"], checked["overruled_by"]) == (False, 0.0, "roles")
    assert (checked["judge_supported"], checked["judge_p_supported"]) == (True, 0.9)
    assert conflict_note(checked) == " (Haddad: the source says 'Silva proposed the merger')"
    faithful = relations_checked(
        {"claim": "Ana Silva proposed the merger.", "supported": True, "p_supported": 0.9},
        VOTE,
        "Ana Silva proposed the merger.",
    )
    assert faithful["supported"] and faithful["relations"] == [] and "overruled_by" not in faithful
