"""What the two-axis metric alone does with its stages' replies (the stages themselves, which both metrics ask
for, are in scorers/stages/): the figure check on judged claims and on the summary's figures no claim kept, what
coverage is checked against, and how a summary is cut into parts for the claims stage."""

from __future__ import annotations

from dataclasses import dataclass, field

from offline_sumscore.core.coverage_items import summary_sentences
from offline_sumscore.core.figures import figure_check, figures, same_figure
from offline_sumscore.core.relations import quantity_check, role_check


def figure_checked(entry: dict, source: str) -> dict:
    """The figure check's word on a judged claim (core.figures.figure_check), for every judge: each number, amount,
    percentage or date of the claim that the source does not state is named in `figures`. Where the source's
    sentence the claim sits in states another figure of that kind (the summary's "3,870" where it says "1,870"), the
    claim is unsupported whatever the judge said, since the source states otherwise; the judge's own verdict and P
    are kept beside it (judge_supported, judge_p_supported). A figure the source states nowhere, with none of its
    kind in that sentence, is named only: the judge's verdict stands (a summary may sum or round)."""
    found = figure_check(entry["claim"], source)
    entry["figures"] = found  # every claim's, empty where the check found nothing: one shape for every row
    conflict = entry.get("conflict")
    for finding in found:  # a conflict on a figure the check placed: the expected word is the source's figure there
        if conflict and finding["source_figure"] and conflict["word"] == finding["figure"]:
            conflict["expected_word"] = finding["source_figure"]
    if entry["supported"] and any(f["source_says"] for f in found):
        overrule(entry, "figures")
    return entry


def overrule(entry: dict, by: str) -> None:
    """A supported claim made unsupported by a check that reads the texts (`by`), the judge's verdict and P kept."""
    entry.update(
        judge_supported=True, judge_p_supported=entry["p_supported"], supported=False, p_supported=0.0, overruled_by=by
    )


def relations_checked(entry: dict, source: str, summary: str) -> dict:
    """Roles and quantity words (core.relations), for every judge: a claim that binds a name to what the source's
    sentence binds to another name the summary names ("Reed proposed the plan" where "Ortiz proposed the plan"), or
    says "every" or "most" of what the source gives as a share ("61 percent of residents"), is unsupported whatever
    the judge said; the judge's own verdict and P are kept beside it. Each finding is in `relations`, empty where
    there is none (one shape for every row). Measured on faithful text: 0 of 596 SummEval and FRANK summaries that
    their annotators found consistent had a finding (docs/metrics.md, research/results/relations_precision.md)."""
    found = role_check(entry["claim"], source, summary) + quantity_check(entry["claim"], source)
    entry["relations"] = found
    if entry["supported"] and found:
        overrule(entry, "roles" if found[0]["kind"] == "role" else "quantity words")
    return entry


def figures_beyond_claims(summary: str, source: str, judged: list[dict]) -> tuple[list[dict], list[dict]]:
    """Every number, amount, percentage and date the summary states is checked against the source, whatever the
    claims stage kept: a judge that writes claims may drop a figure ("Marta Ruiz, 27, lost ..." became "Marta Ruiz
    lost ..." with Qwen2.5-Coder-1.5B), and the figure check reads claims. For each summary sentence's figure that no
    claim states (by value and kind) and the source does not state anywhere: where the source states another figure
    of its kind in its place (core.figures.figure_place), the sentence is added as a claim the source does not
    support (`from`: "figure check"); else the figure is named only, in the second list, as figure_checked names a
    claim's figure the source states nowhere. Returns (claims to add, figures named only)."""
    in_claims = [f for entry in judged for f in figures(entry["claim"])]
    added: list[dict] = []
    named: list[dict] = []
    for sentence in summary_sentences(summary):
        lost = [f for f in figures(sentence) if not any(same_figure(f, g) for g in in_claims)]
        if not lost:
            continue
        texts = {f.text for f in lost}
        found = [finding for finding in figure_check(sentence, source) if finding["figure"] in texts]
        conflicts = [finding for finding in found if finding["source_says"]]
        if conflicts:
            added.append(
                {
                    "claim": sentence,
                    "supported": False,
                    "p_supported": 0.0,
                    "figures": conflicts,
                    "overruled_by": "figures",
                    "from": "figure check: the claims stage left this figure out",
                }
            )
        named += [dict(finding, summary_sentence=sentence) for finding in found if not finding["source_says"]]
    return added, named


@dataclass
class Coverage:
    """What coverage is checked against: where the items come from (coverage_from), the items (None until the judge
    draws them), how each is asked of the summary, and drawn questions that were not counted."""

    source: str
    items: list[str] | None
    ask: str
    dropped: list[dict] = field(default_factory=list)


ITEM_NOUNS = {
    "questions": "questions",
    "user_questions": "questions",
    "key_facts": "key facts",
    "key_sentences": "key sentences of the source",
}


def halves(part: str) -> list[str]:
    """A part of the summary in two halves of whole sentences (one sentence stays whole: it cannot be halved)."""
    found = summary_sentences(part)
    middle = (len(found) + 1) // 2
    return [" ".join(found[:middle]), " ".join(found[middle:])] if len(found) > 1 else [part]


def groups(items: list[str], size: int) -> list[list[str]]:
    return [items[k : k + size] for k in range(0, len(items), size)] or [[]]
