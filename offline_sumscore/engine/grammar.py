"""Schema (or a TextOutput's Lark grammar) -> grammar, for a given judge's tokenizer: one matcher per row, masks for
a whole batch.

Backend: outlines' llguidance backend (its tokenizer adapter and grammar compiler). It computes each token mask
lazily from the grammar, so building a schema's grammar costs microseconds and no memory per state. outlines_core
(outlines' default) precompiles an index over the whole vocabulary per schema: measured here on SmolLM2's 49k
vocabulary, 10 coverage verdicts with 200-character reasons took 17.5 s and 786 MB, and a cap on string lengths
is exactly what makes it grow.

Whitespace is fixed, not flexible: by default llguidance admits any whitespace between JSON tokens, and the
embedded judge was seen to emit newlines until the token cap (1,577 tokens in one coverage verdict list). With
the separators fixed, the longest admissible output follows from the schema's caps alone (schemas.max_json_chars),
and the JSON skeleton becomes forced tokens the engine inserts without decoding.

The grammar is built once per schema and kept; each row gets its own matcher, so rows never share state.
"""

from __future__ import annotations

import json
import threading
from typing import Any

BACKEND = "llguidance"
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarCompiler:
    """Compiles each schema once per judge (through outlines' llguidance backend) and hands out fresh matchers."""

    def __init__(self, hf_model: Any, hf_tokenizer: Any):
        import outlines
        from outlines.backends.llguidance import LLGuidanceBackend

        # outlines' wrapper sets tokenizer.padding_side = "left"; the engine never pads, so nothing depends on it.
        self._backend = LLGuidanceBackend(outlines.from_transformers(hf_model, hf_tokenizer))
        self.llg_tokenizer = self._backend.llg_tokenizer
        self.vocab_size = self.llg_tokenizer.vocab_size
        self._hf_tokenizer = hf_tokenizer
        self._specs: dict[str, Any] = {}
        self._texts: list[str] | None = None
        # The samplers' closed choices (sampling.ChoiceTokens), each built once per judge: a scan of the vocabulary's
        # texts, 75 ms for the embedded judge's, which every new engine on this judge would otherwise pay again.
        self.choices: dict = {}
        self._lock = threading.Lock()

    def spec(self, grammar: tuple[str, str]):
        """grammar: (format, text) as StageRequest.grammar gives it: a JSON schema or a Lark grammar."""
        with self._lock:
            spec = self._specs.get(grammar)
            if spec is None:
                kind, text = grammar
                if kind == "json_schema":
                    text = json.dumps(dict(json.loads(text), **{"x-guidance": COMPACT_JSON}))
                spec = self._specs[grammar] = self._backend.llg.grammar_from(kind, text)
        return spec

    def matcher(self, grammar: tuple[str, str]):
        """A fresh matcher (one row's decoding state) from the grammar built once for this schema."""
        import llguidance

        m = llguidance.LLMatcher(self.llg_tokenizer, self.spec(grammar))
        if m.is_error():
            raise ValueError(f"grammar error: {m.get_error()}")
        return m

    def processor(self, grammar: tuple[str, str]):
        """An outlines logits processor for one batch (for plain transformers `generate`, as the benchmark's
        reference rungs use)."""
        from outlines.backends.llguidance import LLGuidanceLogitsProcessor

        return LLGuidanceLogitsProcessor(self.spec(grammar), self.llg_tokenizer, "torch")

    @staticmethod
    def fill_bitmasks(executor, matchers: list, bitmask) -> None:
        """Many rows' masks at once, in llguidance's threads: matchers is [(matcher, slot, draft tokens), ...];
        a row's mask goes to bitmask[slot], and the mask after each of its draft tokens to the slots after it
        (the matcher is rolled back to where it was)."""
        import llguidance.torch

        plain = [(m, slot) for m, slot, draft in matchers if not draft]
        drafted = [(m, slot, draft) for m, slot, draft in matchers if draft]  # llguidance refuses empty drafts
        if plain:
            llguidance.torch.fill_next_token_bitmask_par(executor, plain, bitmask)
        if drafted:
            llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(executor, drafted, bitmask)

    @property
    def token_texts(self) -> list[str]:
        """Each token id's text, for reading closed choices (true/false, "1"/"0") off a distribution."""
        if self._texts is None:
            tok = self._hf_tokenizer
            pieces = tok.convert_ids_to_tokens(list(range(self.vocab_size)))
            self._texts = [tok.convert_tokens_to_string([p]) if p is not None else "" for p in pieces]
        return self._texts

    @property
    def schemas_built(self) -> int:
        return len(self._specs)
