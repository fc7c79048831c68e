"""TransformersEngine: answers stage requests with a local judge, one generate call per batch.

1. Group requests by schema (one grammar per batch) and sort each group longest prompt first, so padding
   is small and an out-of-memory error would come in the first batch.
2. Render each prompt with the judge's chat template and left-pad the batch.
3. Greedy decoding under the schema's grammar; the token cap is sized from the schema's longest admissible
   JSON, so only a broken grammar or a too-small context can reach it.
4. Cut each row at its first end-of-sequence token. A row without one hit the cap: a failed result with its
   raw text kept, never a guess.
"""
from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from typing import Sequence

from pydantic import ValidationError

from ..judge import Judge
from ..schemas import max_json_chars
from ..stages import StageRequest, StageResult
from .grammar import BACKEND, GrammarCache


class TransformersEngine:
    def __init__(self, judge: Judge, *, batch_size: int = 8):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1. Given: {batch_size}")
        self.judge = judge
        self.batch_size = batch_size
        if judge.grammar_cache is None:  # one cache per loaded judge, so scorers sharing a judge share grammars
            judge.grammar_cache = GrammarCache(judge.model, judge.tokenizer)
        self.grammars = judge.grammar_cache
        gen = judge.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else judge.tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {judge.tokenizer.eos_token_id}
        self._lock = threading.Lock()  # one generate at a time on one model (ascore runs in threads)
        judge.decisions["grammar_backend"] = f"{BACKEND}: lazy token masks, no per-schema index to precompile"

    def describe(self) -> dict:
        return {"engine": "transformers", "batch_size": self.batch_size, "judge": self.judge.describe()}

    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        results: list[StageResult | None] = [None] * len(requests)
        prompts = [self.judge.render(r.messages) for r in requests]
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[(req.schema_json, req.max_new_tokens)].append(i)
        for (schema_json, cap), members in groups.items():
            members.sort(key=lambda i: len(prompts[i]), reverse=True)
            for start in range(0, len(members), self.batch_size):
                batch = members[start:start + self.batch_size]
                for i, res in zip(batch, self._generate([requests[i] for i in batch], [prompts[i] for i in batch],
                                                        schema_json, cap)):
                    results[i] = res
        return results  # type: ignore[return-value]

    def _generate(self, requests, prompts, schema_json, cap) -> list[StageResult]:
        import torch

        tok, model = self.judge.tokenizer, self.judge.model
        # The chat template already wrote any special tokens the model expects.
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        prompt_len = enc["input_ids"].shape[1]
        lengths = enc["attention_mask"].sum(dim=1).tolist()
        bound = cap or (max_json_chars(json.loads(schema_json)) + 8)
        room = self.judge.context_length - prompt_len
        if room < 16:
            msg = (f"prompt of {prompt_len} tokens leaves no room in the judge's {self.judge.context_length}-token "
                   f"context; use a shorter source or a judge with a longer context")
            return [StageResult(request=r, value=None, raw_output="", prompt=p, tokens_in=n, error=msg)
                    for r, p, n in zip(requests, prompts, lengths)]
        max_new = min(bound, room)
        processor = self.grammars.processor(schema_json)
        started = time.perf_counter()
        with self._lock, torch.inference_mode():
            out = model.generate(**enc, logits_processor=[processor], max_new_tokens=max_new, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, pad_token_id=tok.pad_token_id,
                                 eos_token_id=sorted(self.eos_ids))
        seconds = (time.perf_counter() - started) / len(requests)
        results = []
        for req, prompt, n_in, row in zip(requests, prompts, lengths, out[:, prompt_len:].tolist()):
            end = next((k for k, t in enumerate(row) if t in self.eos_ids), None)
            text = tok.decode(row[:end] if end is not None else row, skip_special_tokens=True)
            res = StageResult(request=req, value=None, raw_output=text, prompt=prompt, tokens_in=n_in,
                              tokens_out=(end + 1) if end is not None else len(row), seconds=seconds,
                              batch_size=len(requests))
            if end is None:
                res.error = f"hit the {max_new}-token cap before the JSON closed; raw output kept"
            else:
                try:
                    res.value = req.schema.model_validate_json(text)
                except ValidationError as exc:
                    res.error = f"output does not match the schema: {str(exc).splitlines()[0]}"
            results.append(res)
        return results
