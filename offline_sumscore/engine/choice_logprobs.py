"""P(yes) from the log-probabilities an engine outside this process returns: vLLM in this process, or a server's
chat-completion `top_logprobs`. Read as our engine reads it off the full distribution (local/sampling.py): at the
step whose picked token is a yes or a no token, where every allowed token is a yes, a no or whitespace, and both a
yes and a no are allowed, P(yes) is the yes tokens' mass over the yes and no tokens' mass.

Only allowed tokens carry a finite log-probability there (the grammar's mask is applied before they are read; a
server writes the masked ones as a large negative number), and only the top `read` are returned: a step with `read`
or more allowed tokens cannot be shown to be a closed choice, and is skipped.

llama.cpp's server reads its log-probabilities before its grammar (masked=False): every token keeps its
probability, so no step is shown closed. The grammar allows only yes, no and whitespace there, and masking leaves the
ratio of the yes mass to the no mass as it is, so P(yes) is read from the yes and no tokens among the top `read`
alone, at the first step only (where the grammar puts the verdict; a "No" inside a reason is no verdict); a yes or
no token ranked below them (a variant far less likely than `read` others) is the one thing missed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

CHOICE_LOGPROBS = 20  # top log-probabilities asked for where a verdict is decided (vLLM's cap by default)
MASKED = -1e3  # at or below: a token the grammar did not allow (vLLM's server writes -inf as -9999.0)


def kind_of(text: str, choice: tuple[str, str]) -> str | None:
    """'yes', 'no', 'neutral' (whitespace only) or None, for a token's text (quotes and spaces stripped)."""
    stripped = text.lstrip(' "')
    if stripped.startswith(choice[0]):
        return "yes"
    if stripped.startswith(choice[1]):
        return "no"
    return "neutral" if text.strip() == "" and text != "" else None


def choice_probs(
    steps: Iterable[tuple[str, list[tuple[str, float]]]], choice: tuple[str, str], read: int, *, masked: bool = True
) -> list[float]:
    """steps: per decoded token, its text and the top `read` (text, log-probability) pairs at that step. masked:
    whether the server applied the grammar's mask before it read them (vLLM does, llama.cpp does not)."""
    probs = []
    for step, (picked, top) in enumerate(steps):
        if not masked and step > 0:
            break
        if kind_of(picked, choice) not in ("yes", "no"):
            continue
        allowed = [(text, lp) for text, lp in top if lp > MASKED]
        kinds = [kind_of(text, choice) for text, _ in allowed]
        if masked and (len(allowed) >= read or None in kinds):
            continue
        yes = sum(math.exp(lp) for (_, lp), k in zip(allowed, kinds) if k == "yes")
        no = sum(math.exp(lp) for (_, lp), k in zip(allowed, kinds) if k == "no")
        if yes > 0 and no > 0:
            probs.append(yes / (yes + no))
    return probs
