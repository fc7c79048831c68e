"""The ladder's baseline engine (rungs 0 and 1): outlines' own generators behind the engine door."""

from __future__ import annotations

import json

from offline_sumscore.core.stages import StageResult
from offline_sumscore.engine import Engine


class OutlinesEngine(Engine):
    """Rungs 0 and 1: outlines.Generator with a prebuilt llguidance processor per schema (the same grammar our
    engine uses), called once per prompt (batch=False) or once per schema per wave (batch=True)."""

    def __init__(self, judge, *, batch: bool):
        import outlines

        self.judge, self.batch = judge, batch
        # Batched generate appends on the right, so its prompts are padded on the left, with a pad token.
        judge.tokenizer.padding_side = "left"
        if judge.tokenizer.pad_token_id is None:
            judge.tokenizer.pad_token = judge.tokenizer.eos_token
        self.model = outlines.from_transformers(judge.model, judge.tokenizer)
        self.grammars = judge.grammars()  # the same compiled grammars our engine uses
        self.generators: dict[str, object] = {}
        self.prefill_tokens = self.decoded_tokens = self.forward_passes = 0

    def describe(self) -> dict:
        return {"engine": "outlines-batch" if self.batch else "outlines-loop", "judge": self.judge.describe()}

    def _generator(self, grammar: tuple[str, str]):
        import outlines

        if grammar not in self.generators:
            self.generators[grammar] = outlines.Generator(self.model, processor=self.grammars.processor(grammar))
        return self.generators[grammar]

    def run(self, requests):
        from outlines.inputs import Chat

        from offline_sumscore.core.schemas import max_json_chars

        results: list[StageResult | None] = [None] * len(requests)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            if r.continuation is not None:
                raise SystemExit("the outlines reference rungs generate; they cannot run likelihood requests")
            groups.setdefault(r.grammar, []).append(i)
        tok = self.judge.tokenizer
        for grammar, members in groups.items():
            gen = self._generator(grammar)
            cap = max_json_chars(json.loads(requests[members[0]].schema_json)) + 8
            calls = [members] if self.batch else [[i] for i in members]
            for call in calls:
                chats = [Chat(list(requests[i].messages)) for i in call]
                texts = (
                    gen.batch(chats, max_new_tokens=cap, do_sample=False)
                    if self.batch
                    else [gen(chats[0], max_new_tokens=cap, do_sample=False)]
                )
                longest = 0
                for i, text in zip(call, texts):
                    prompt = self.judge.render(requests[i].messages)
                    n_in = len(tok(prompt, add_special_tokens=False)["input_ids"])
                    n_out = len(tok(text, add_special_tokens=False)["input_ids"]) + 1  # + end of sequence
                    self.prefill_tokens += n_in
                    self.decoded_tokens += n_out
                    longest = max(longest, n_out)
                    results[i] = StageResult(
                        request=requests[i],
                        value=None,
                        raw_output=text,
                        prompt=prompt,
                        tokens_in=n_in,
                        tokens_out=n_out,
                        decoded_tokens=n_out,
                    ).read_reply(text)  # the one reading of a reply, as every engine of ours reads it
                self.forward_passes += longest  # one prefill pass plus one pass per further token
        return results
