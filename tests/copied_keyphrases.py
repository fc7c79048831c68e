"""CopiedKeyphrases: a real engine whose keyphrases stage is answered with words copied from each text.

The embedded 135M judge, asked for key phrases, writes back the prompt's own kinds ("people", "organisations",
"locations"), which fail the stage (scorers/stages/keyphrases.py). The tests that use Ragas's design on it to reach
its later stages (closed questions as JSON, "1"/"0" answers with P(1)) put this in front of the engine: every other
stage still goes to the real judge. Importable in vLLM's environment too (tests/vllm/designs.py): no pytest here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import EngineLayer

COPIED = 2  # phrases a text: within every test's max_keyphrases


def copied_keyphrases(request: StageRequest) -> StageResult:
    """The request's text's first capitalised words of four letters or more (names, mostly), as a judge that copies
    them would write them, read under the request's schema as any engine's reply is."""
    text = request.messages[-1]["content"].split("</text>")[0]
    names = list(dict.fromkeys(re.findall(r"\b[A-Z][a-z]{3,}\b", text)))[:COPIED]
    result = StageResult(request=request, value=None, raw_output="")
    return result.read_reply(json.dumps({"keyphrases": names}))


class CopiedKeyphrases(EngineLayer):
    def streams_natively(self) -> bool:
        return False  # one run() a wave: the keyphrases answered here, every other stage by the engine inside

    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        asked = [r for r in requests if r.stage != "keyphrases"]
        answered = iter(self.inner.run(asked) if asked else [])
        return [copied_keyphrases(r) if r.stage == "keyphrases" else next(answered) for r in requests]
