"""The local engine: stage requests answered by a judge loaded in this process (transformers + torch), under
grammars (llguidance), in one continuous stream of ragged forward passes. May import core/ and engine/.

Where each part lives, in the order a request meets them:
- engine.py      TransformersEngine: the loop (take, admit, step, answer), identical requests merged, results.
- admission.py   requests into rows, rows into the running batch (units sharing a prefix, the prefix store).
- rows.py        a row: its progress, and every change to it (no other module writes a row).
- scheduler.py   what runs next, decided without the model: units, the batch, preemption.
- plan.py        one step as plain values: the plan (feeds, tokens, starts, read points) and the model's output.
- step.py        one decoding step, as numbered steps: plan, pass, masks, picks, one update.
- drafts.py      speculative decoding from n-gram drafts: guesses, fitted to the grammar.
- sampling.py    the grammar's side: forced tokens, masks, greedy picks and P(yes).
- forward.py     the decoder over KV slots: one ragged pass, the vocabulary projection where tokens are read, and
                 the measured peak of a full pass (a bounded device's sizing).
- attention.py   where a pass's tokens go and what each attends; the attention itself, through SDPA's calls (on a
                 CPU with AVX-512, engine/cpu/attention_kernel.py instead).
- attention_cuda.py  how a GPU cuts those calls: by the cost of a launch, queries in blocks.
- kv_slots.py    the keys and values: one slot per row, in buffers allocated ahead (on a bounded device, following
                 the live rows, each shape claimed from the KV budget).
- kv_budget.py   the keys and values one engine holds at once on a bounded device.
- prefix_store.py  computed prefixes kept across steps, samples and calls.
- likelihood.py  likelihood requests: one pass, no decoding.
- capacity.py    rows and cached tokens per batch, from the device's memory.
- device_memory.py  the device's memory: a CPU's, a GPU's, or one emulated (OFFLINE_SUMSCORE_DEVICE_MEMORY).
- memory.py      out of memory, handled one way: halve, or fail loudly alone.
- features.py    the features the ladder switches, the counters, the timing hook's records.
- lab.py         the one developer hook: features, the prefix store's and a pass's token budgets, a timing hook
                 and the attention and pick kernels on or off, for the ladder, the profiler and the engine's tests;
                 no user option.

One step of the loop (step.py):
1. Admit waiting units while the row cap and the token budget allow; finished rows left after the last step.
2. Plan (plan.py): every live row's pending tokens (a prompt's remainder, or its last pick and the tokens its
   grammar forces) within the pass's token budget (a long prompt goes in chunks), plus a draft of guessed tokens,
   and the read points after them; nothing changes yet.
3. Run the plan's tokens as one flat ragged sequence through the decoder and launch the vocabulary projection at
   the read points; while the device runs them, fill the grammar masks of every read point on the CPU.
4. Read the greedy picks and P(yes) under the masks, in one transfer: the step's output.
5. One update from plan and output (Stepper.update, through rows.py): each row keeps its draft up to the first
   token the judge's own pick disagrees with; a row whose grammar is complete ends as its last token goes in,
   without another pass; a row that hits its cap fails with its raw text kept; NaN logits fail the row. Nothing is
   ever guessed.
"""

from offline_sumscore.engine.local.engine import TransformersEngine
from offline_sumscore.engine.local.features import EngineFeatures, EngineStats, Timing

__all__ = ["TransformersEngine", "EngineFeatures", "EngineStats", "Timing"]
