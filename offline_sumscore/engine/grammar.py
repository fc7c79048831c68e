"""Schema -> outlines logits processor, for a given judge's tokenizer.

Backend: outlines' llguidance backend. It computes each token mask lazily from the grammar, so building a
schema's grammar costs microseconds and no memory per state. outlines_core (the default) precompiles an
index over the whole vocabulary per schema: measured here on SmolLM2's 49k vocabulary, 10 coverage verdicts
with 200-character reasons took 17.5 s and 786 MB, and a cap on string lengths is exactly what makes it grow.

Whitespace is fixed, not flexible: by default llguidance admits any whitespace between JSON tokens, and the
embedded judge was seen to emit newlines until the token cap (1,577 tokens in one coverage verdict list). With
the separators fixed, the longest admissible output follows from the schema's caps alone (schemas.max_json_chars).

The grammar spec is built once per schema and kept; each batch gets its own processor (it holds one matcher
per row), so two batches in flight never share decoding state.
"""
from __future__ import annotations

import json
import threading
from typing import Any

BACKEND = "llguidance"
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarCache:
    def __init__(self, hf_model: Any, hf_tokenizer: Any):
        import outlines
        from outlines.backends.llguidance import LLGuidanceBackend

        # outlines' wrapper sets tokenizer.padding_side = "left" (the loader already did, on purpose) and its
        # processors set torch._dynamo.config.suppress_errors = True; we use no torch.compile, so that is inert.
        self._backend = LLGuidanceBackend(outlines.from_transformers(hf_model, hf_tokenizer))
        self._specs: dict[str, Any] = {}
        self._lock = threading.Lock()

    def processor(self, schema_json: str):
        """A fresh processor for one batch, from the grammar built once for this schema."""
        from outlines.backends.llguidance import LLGuidanceLogitsProcessor

        with self._lock:
            spec = self._specs.get(schema_json)
            if spec is None:
                schema = dict(json.loads(schema_json), **{"x-guidance": COMPACT_JSON})
                spec = self._specs[schema_json] = self._backend.llg.grammar_from("json_schema", json.dumps(schema))
        return LLGuidanceLogitsProcessor(spec, self._backend.llg_tokenizer, "torch")

    @property
    def schemas_built(self) -> int:
        return len(self._specs)
