"""The questions stages: the source (or a piece of it) -> closed questions it answers yes. Two wordings, one grammar:
the two-axis metric's "questions" and the Ragas-style score's "ragas_questions" (drawn with its keyphrases)."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Annotated

from pydantic import BaseModel, Field, create_model

from offline_sumscore.core.errors import Failure
from offline_sumscore.core.prompts import fence, ragas, two_axis
from offline_sumscore.core.schemas import STRICT
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.scorers.base import require


def questions_prompt(source: str, *, n: int, exact: bool = False, style: str = "full") -> list[dict]:
    """Stage "questions": the judge sees only the source, so the questions are chosen without regard to any summary
    and are the same for every summary of one document. exact: exactly n (DeepEval's n), else at most n."""
    count = f"exactly {n}" if exact else f"at most {n}"
    # Fenced as "article", as the support prompts fence the source: the questions and every verdict on the source
    # then open with the same tokens, which the engine's prefix store computes once per run.
    return two_axis(
        f"{fence('article', source)}\n\n"
        f"Task: write {count} closed questions about the most important facts of this article, most important "
        "first. Each question must be specific (it names the people, things, places, numbers or dates it is "
        'about), make sense on its own without the article, be answered with yes or no, and be answered "yes" by '
        "the article. Do not ask the same thing twice.",
        style,
    )


def ragas_questions_prompt(text: str, keyphrases: list[str] | tuple[str, ...]) -> list[dict]:
    """Stage "ragas_questions" (Ragas-style SummaryScore): closed questions from the text and its keyphrases."""
    phrases = "; ".join(keyphrases) if keyphrases else "(none)"
    return ragas(
        f"{fence('text', text)}\n\nKey phrases: {phrases}\n\n"
        'Task: using the text and the key phrases, write closed questions that the text answers with "1" (yes). '
        'Every question must have the answer "1" according to the text.'
    )


# A closed question, by construction: it opens with an auxiliary verb and ends with its only question mark. Asked
# for "closed questions" in words alone, Qwen2.5-Coder-1.5B-Instruct wrote 5 open questions of 6 on the demo's
# faithful row ("What is the name of the library?"), which a summary can never answer "yes", so a faithful summary
# scored 0.33. The grammar makes an open question impossible to write, for every judge.
# Negated openings ("Didn't ...?") are left out: "yes" to them is ambiguous, and coverage counts the yes-answers.
AUXILIARIES = "Is Are Was Were Do Does Did Has Have Had Will Would Can Could Should Shall May Might Must".split()
CLOSED_QUESTION = r"^(" + "|".join(AUXILIARIES) + r") [^?\n]+\?$"


def is_closed_question(text: str) -> bool:
    """Whether a question is closed as the questions grammar writes them (an auxiliary verb first, one '?' last)."""
    return re.fullmatch(CLOSED_QUESTION[1:-1], text) is not None


@cache
def questions_list(max_questions: int, text_chars: int, min_questions: int = 1) -> type[BaseModel]:
    """Stages "questions" and "ragas_questions": closed questions the source answers yes, each closed by the grammar
    (CLOSED_QUESTION). min_questions == max_questions asks for exactly that many (DeepEval's n)."""
    item = Annotated[str, Field(min_length=1, max_length=text_chars, pattern=CLOSED_QUESTION)]
    items = (list[item], Field(min_length=min_questions, max_length=max_questions))
    return create_model("QuestionList", __config__=STRICT, questions=items)


def questions_request(
    sample_id: str, text: str, n: int, *, style: str, max_text_chars: int, exact: bool = False
) -> StageRequest:
    """n closed questions drawn from text; exact (DeepEval): exactly n, else up to n."""
    return StageRequest(
        sample_id,
        "questions",
        tuple(questions_prompt(text, n=n, exact=exact, style=style)),
        questions_list(n, max_text_chars, n if exact else 1),
    )


def ragas_questions_request(
    sample_id: str, text: str, keyphrases: list[str], n: int, *, max_text_chars: int
) -> StageRequest:
    """Up to n closed questions drawn from text and its keyphrases (Ragas-style SummaryScore)."""
    return StageRequest(
        sample_id, "ragas_questions", tuple(ragas_questions_prompt(text, keyphrases)), questions_list(n, max_text_chars)
    )


def not_closed(question: str) -> str:
    """Why a question is not closed as the grammar writes them (for a question is_closed_question refuses)."""
    if re.match(r"\s*\(?\d+[.):]", question):
        return "it opens with a list number: a numbered statement, not a question"
    if not question.rstrip().endswith("?") or question.count("?") != 1:
        return "it does not end with its only question mark"
    return f"it does not open with an auxiliary verb ({', '.join(AUXILIARIES[:6])}, ...)"


def unclosed_item(raw_output: str) -> str | None:
    """The first drawn item that is no closed question, with why, where a reply parses as JSON with a list of
    questions; else None (the schema's own message says what is wrong). A served judge that ignores the grammar can
    write one: an instruct judge wrote numbered statements ("1. The council voted ...")."""
    try:
        items = json.loads(raw_output).get("questions")
    except (ValueError, AttributeError):
        return None
    for k, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, str) and not is_closed_question(item):
            return f"question {k + 1} ({item[:80]!r}) is not a closed question: {not_closed(item)}"
    return None


def questions_read(result: StageResult, stages: dict, key: str) -> list[str]:
    """The drawn questions, or a failed stage (raw output kept) whose error names the first item that is no closed
    question, where that is why the reply did not parse."""
    why = unclosed_item(result.raw_output) if result.error_kind == Failure.SCHEMA else None
    if why:
        result.error = f"output does not match the schema: {why}; raw output kept"
    return list(require(result, stages, key).questions)
