"""What a user reads on a second day, on the real embedded judge and ordinary summaries (tests/data: 1-3 sentence
faithful summaries of 150-400-word news articles, written for these tests): the evidence never accuses a word the
summary copied from its source, a figure the source does not state is named with the source's own, no token's piece
is ever shown as a word, and the default score of a faithful summary is not 0 by construction."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from offline_sumscore import SummarizationScorer
from offline_sumscore.core.figures import figures

pytestmark = pytest.mark.model
DATA = Path(__file__).resolve().parents[1] / "data" / "ordinary_summaries.jsonl"
ITEMS = [json.loads(line) for line in DATA.read_text().splitlines()]


@pytest.fixture(scope="module")
def rows(judge):
    scorer = SummarizationScorer(judge)
    return [r.to_dict() for r in scorer.score_many([(i["source"], i["summary"]) for i in ITEMS])]


def copied(claim: str, source: str) -> bool:
    """Every number, date and name of the claim appears in the source as written."""
    names = re.findall(r"(?<!^)(?<![.!?] )\b[A-Z][a-z]+(?:'s)?", claim)
    words = [f.text for f in figures(claim)] + [n.removesuffix("'s") for n in names]
    return all(re.search(r"(?<!\w)" + re.escape(w) + r"(?!\w)", source) for w in words)


def test_faithful_summaries_whose_figures_and_names_the_source_holds_get_no_conflict(rows):
    checked = 0
    for item, row in zip(ITEMS, rows):
        for claim in row["claims"]:
            if copied(claim["claim"], item["source"]):
                checked += 1
                assert not claim.get("conflict") and claim["figures"] == [], (item["id"], claim)
    assert checked >= 6


def test_a_summary_figure_the_source_does_not_state_is_named_with_the_sources_figure(judge):
    item = ITEMS[0]  # the bridge's repairs cost 4.2 million pounds
    wrong = item["summary"].replace("4.2 million", "4.8 million")
    row = SummarizationScorer(judge).score(item["source"], wrong).to_dict()
    (claim,) = [c for c in row["claims"] if "4.8" in c["claim"]]
    assert not claim["supported"]
    (found,) = claim["figures"]
    assert found["figure"] == "4.8 million" and found["source_says"].startswith("4.2 million pounds")
    assert "(4.8 million: the source says 4.2 million pounds" in row["reason"]


def test_no_token_piece_is_ever_shown_as_a_word(rows):
    """Every word a row names as expected (a conflict's or the weakest word's) is a whole word of the text it was
    checked against: the source for a claim, the summary for a key sentence."""
    named = 0
    for item, row in zip(ITEMS, rows):
        entries = [(c, item["source"]) for c in row["claims"]] + [
            (v, item["summary"]) for v in row["coverage_verdicts"]
        ]
        for entry, text in entries:
            for evidence in (entry.get("conflict"), entry.get("evidence")):
                word = (evidence or {}).get("expected_word")
                if word and any(ch.isalnum() for ch in word):
                    named += 1
                    assert re.search(r"(?<!\w)" + re.escape(word) + r"(?!\w)", text), (item["id"], evidence)
    assert named > 10


def test_fewer_than_half_of_the_faithful_ordinary_summaries_score_0(rows):
    zeros = [item["id"] for item, row in zip(ITEMS, rows) if row["score"] == 0]
    assert len(zeros) < len(ITEMS) / 2, zeros
    assert all(row["settings"]["design.coverage_rule"] == "mean P(covered) over the key sentences" for row in rows)


def test_no_faithful_ordinary_summary_gets_a_role_or_quantity_finding(rows):
    assert sum(len(row["claims"]) for row in rows) >= len(ITEMS)
    assert [c["relations"] for row in rows for c in row["claims"] if c["relations"]] == []


def test_a_role_swap_and_every_for_a_share_are_unsupported_naming_the_sources_words(judge):
    source = (
        "The council of Brayford met on Monday. Mayor Ana Silva proposed the tram plan, and councillor Omar Haddad "
        "opposed it. By June, 61 percent of residents had signed the petition for it."
    )
    summary = "Omar Haddad proposed the tram plan and Ana Silva opposed it. Every resident signed the petition."
    row = SummarizationScorer(judge).score(source, summary).to_dict()
    overruled = {c["overruled_by"]: c for c in row["claims"] if c.get("overruled_by") in ("roles", "quantity words")}
    assert sorted(overruled) == ["quantity words", "roles"], row["claims"]
    assert overruled["roles"]["relations"][0]["source_says"] == "Silva proposed the tram"
    assert overruled["quantity words"]["relations"][0]["source_says"] == "61 percent of residents"
    assert "the source says '61 percent of residents'" in row["reason"] and row["alignment"] == 0.0
