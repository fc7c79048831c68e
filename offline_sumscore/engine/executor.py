"""TransformersEngine: the hot loop. Answers stage requests with a local judge under JSON grammars.

One step of the loop:
1. Admit waiting work while the token budget allows (iteration-level batching: finished rows leave after every
   step and waiting rows take their KV slots, so one long generation never holds a whole batch). Work is admitted
   as units: requests that share a long token prefix, whichever sample they come from (a source checked against
   every claim of every summary of it, or a summary against every coverage item), form one unit whose prefix is
   computed once, in one row, and copied into the others' slots. A prefix found in the prefix store is copied from
   there instead. What is left of each row's prompt rides in the next step, beside the running rows' tokens.
2. One forward pass over every row's pending tokens: a prompt's remainder, or the last sampled token plus any
   forced tokens the grammar fixes (the JSON skeleton, inserted in this pass instead of decoded one per step),
   plus a draft: tokens guessed by n-gram lookup (drafts.py), checked in the same pass. The pass is ragged: the
   rows' tokens go through the model as one flat sequence, each attending its own row (kv_slots.py), so rows of
   different lengths cost their own tokens and no padding; explicit position ids keep RoPE exact.
3. While the device runs that pass, the grammar mask of every position that will be read (after each row's
   pending tokens and after each of its draft tokens) is filled on the CPU, in parallel threads, into one pinned
   bitmask, moved to the device once, unpacked and applied there.
4. Greedy pick under the mask at each read position. Where the allowed tokens form a closed choice (true/false,
   "1"/"0"), P(yes) is read from the same distribution and kept as a soft score; picks and P(yes) come back in one
   transfer. A row keeps its draft up to the first token its own pick disagrees with, and that pick: exactly what
   decoding one token per step would give. Only then does the step change anything (slots, rows), so an error
   anywhere in it leaves the batch as it was.
5. A row whose grammar is complete ends as its last token goes in, without another pass (a verdict-only row costs
   exactly the pass that reads its verdict). Rows that hit their token cap fail with their raw text kept; NaN
   logits fail the row; nothing is ever guessed.
Likelihood requests (StageRequest.continuation) generate nothing, so they skip the loop (_score_likelihoods): the
prefix a group of them shares is computed once and copied to the group's rows, every row's remainder (the end of
its prompt and its continuation) runs in one ragged pass, and the log-probability of each continuation token is
read at the position before it.

Features can be turned off one by one (shared_prefix, forced_tokens, logit_verdicts, prefix_store, drafts) for the
benchmark ladder and for tests that check each against the plain path.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from offline_sumscore.core.errors import Failure, check_count
from offline_sumscore.core.schemas import Likelihood, max_json_chars, parse_output
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import Feed, ListFeed
from offline_sumscore.engine.drafts import DraftHistory, NgramIndex, propose
from offline_sumscore.engine.grammar import BACKEND, GrammarCompiler
from offline_sumscore.engine.judge import Judge
from offline_sumscore.engine.kv_slots import KVSlots, register_attention, to_device
from offline_sumscore.engine.retry import engine_raised
from offline_sumscore.engine.scheduler import (
    MIN_SHARED_PREFIX,
    Batch,
    PrefixStore,
    Row,
    Scheduler,
    Unit,
    common_prefix,
    split_by_prefix,
)

MIN_ROOM = 16  # tokens the context must have left after the prompt for any JSON verdict
OOM_ALONE = "out of memory even alone; use a shorter prompt or a larger device"


@dataclass
class Draft:
    """A row's guessed continuation as fitted to its grammar: tokens, which of them the grammar forces (inserted
    unread, as _take_forced inserts them), and whether the grammar is complete after the last."""

    tokens: list[int]
    forced: list[bool]
    stopped: bool

    def read_points(self) -> list[int]:
        """m >= 1 where the judge's pick is read after m draft tokens: before each guessed (not forced) token, and
        after the last unless the grammar is complete there."""
        n = len(self.tokens)
        return [m for m in range(1, n) if not self.forced[m]] + ([n] if n and not self.stopped else [])


@dataclass
class EngineStats:
    """Token and time counters of one engine, for results and the benchmark."""

    prefill_tokens: int = 0  # prompt tokens run through the model (a shared prefix counted once)
    forced_tokens: int = 0  # tokens the grammar fixed, inserted without being decoded
    decoded_tokens: int = 0  # tokens picked from the model's distribution
    forward_passes: int = 0
    skipped_forwards: int = 0  # rows finished without a forward pass (grammar complete)
    oom_splits: int = 0
    stored_tokens: int = 0  # prompt tokens whose keys and values came from the prefix store, not a forward pass
    draft_tokens: int = 0  # guessed tokens fed after rows' pending tokens (drafts.py)
    accepted_draft_tokens: int = 0  # of those, the ones the judge's own picks agreed with (kept)
    nan_rows: int = 0  # rows failed because the judge's logits came out NaN (a poisoned pass, never a verdict)
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class TransformersEngine:
    """Answers StageRequests on a loaded Judge. run(requests) -> results in the same order."""

    def __init__(
        self,
        judge: Judge,
        *,
        batch_size: int | None = None,
        token_budget: int | None = None,
        shared_prefix: bool = True,
        forced_tokens: bool = True,
        logit_verdicts: bool = True,
        prefix_store: bool = True,
        continuous: bool = True,
        store_tokens: int | None = None,
        device_share: float = 1.0,
        drafts: bool = True,
        draft_tokens: int | None = None,
        draft_budget: int | None = None,
    ):
        import torch

        if batch_size is not None:
            check_count("batch_size", batch_size)
        self.judge = judge
        if judge.grammar_compiler is None:  # one cache per loaded judge, so scorers sharing a judge share grammars
            judge.grammar_compiler = GrammarCompiler(judge.model, judge.tokenizer)
        self.grammars: GrammarCompiler = judge.grammar_compiler
        self.shared_prefix, self.forced_tokens, self.logit_verdicts = shared_prefix, forced_tokens, logit_verdicts
        self.continuous = continuous  # a driver's stream goes straight in (else: one run() call per wave)
        if not 0 < device_share <= 1:
            raise ValueError(
                f"device_share must be in (0, 1]: the share of the device this engine may fill. Given: {device_share}"
            )
        self.device_share = device_share
        # Speculative decoding from n-gram drafts (drafts.py): up to draft_tokens guessed tokens a row, and
        # draft_budget a pass. A guessed token costs a token's compute whether it is kept or not: about 1.5 ms on
        # the 2-core CPU, where a pass costs about 45 ms before its tokens; on a GPU a pass reads every weight
        # once and a few hundred tokens ride along.
        gpu = judge.model.device.type == "cuda"
        self.draft_tokens = (draft_tokens or 8) if drafts else 0
        self.draft_budget = draft_budget or (1024 if gpu else 64)
        self.history = DraftHistory()  # finished outputs per grammar, the drafts' second source
        tok = judge.tokenizer
        gen = judge.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else tok.eos_token_id
        self.eos_ids = sorted(set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id})
        self.vocab_size = self.grammars.vocab_size
        self.device = judge.model.device
        self.max_rows, self.token_budget, self.capacity_reason = self._capacity(batch_size, token_budget)
        # Prefixes kept across steps and calls: a quarter of the batch's token budget, so the store can never
        # crowd out the running batch.
        self.store = PrefixStore(store_tokens or self.token_budget // 4) if prefix_store else None
        import inspect

        # transformers 5.24 renamed the decoder's past_key_values argument to cache (the old name is deprecated).
        params = inspect.signature(judge.model.get_decoder().forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stats = EngineStats()
        self._choice_masks: dict[tuple[str, str], tuple] = {}
        self._lock = threading.Lock()  # one run at a time on one model (ascore runs in threads)
        self._oom = (torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else (RuntimeError,)
        self._admit_below: int | None = None  # after an admission ran out of memory: wait until fewer rows run
        # Ragged passes attend with ours (kv_slots.ragged_attention), whatever the model was loaded with: plain
        # causal attention over grouped-query heads. A model whose attention is more than that is refused here.
        check_plain_attention(judge.model.config)
        self.loaded_attention = getattr(judge.model.config, "_attn_implementation", None)
        judge.model.set_attn_implementation(register_attention())
        self.attention = judge.model.config._attn_implementation
        self._no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=self.device)  # a pass's masks are its own
        import llguidance

        self._executor = llguidance.LLExecutor()  # fills the rows' grammar masks in parallel threads
        # The grammar masks' bitmask ([rows, words] int32, pinned on a GPU host), reused across steps, and a
        # words-long row with every bit set but the end tokens'.
        self._allocate_bitmask(self.max_rows)

    # -- capacity -------------------------------------------------------------------------------------------
    def _capacity(self, batch_size, token_budget) -> tuple[int, int, str]:
        """Rows and cached tokens per batch: from free memory unless given."""
        import torch

        cfg = self.judge.model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        elem = torch.finfo(self.judge.model.dtype).bits // 8
        per_token = 2 * cfg.num_hidden_layers * heads * head_dim * elem
        if self.device.type == "cuda":
            device_free, _ = torch.cuda.mem_get_info(self.device)
            # Memory PyTorch holds in its caching allocator but does not use is free to this process too.
            spare = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            where, default_rows = f"{device_free / 2**30:.1f} GiB free on {self.device}", 512
        else:
            device_free, spare = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), 0
            where, default_rows = f"{device_free / 2**30:.1f} GiB free RAM", 64
        free = usable_memory(device_free, spare, self.device_share)
        if self.device_share < 1:
            where += f", {self.device_share:g} of it for this engine"
        auto_budget = kv_token_budget(free, per_token)
        rows = batch_size or default_rows
        budget = token_budget or auto_budget
        self.free_memory = where  # kept off the rows: it changes from run to run
        why = (
            f"up to {rows} rows and {budget} cached tokens per batch "
            f"({'given' if batch_size else 'default'} rows; budget "
            f"{'given' if token_budget else 'from half the free memory, rounded down to a power of two'}, "
            f"{per_token} bytes of KV per token)"
        )
        return rows, budget, why

    def describe(self) -> dict:
        return {
            "engine": "transformers",
            "max_rows": self.max_rows,
            "token_budget": self.token_budget,
            "capacity": self.capacity_reason,
            "device_share": self.device_share,
            "attention": self.attention,  # ragged passes attend with ours, whatever the model was loaded with
            "loaded_attention": self.loaded_attention,
            "grammar_backend": f"{BACKEND}: lazy token masks, no per-schema index to precompile",
            "shared_prefix": self.shared_prefix,
            "forced_tokens": self.forced_tokens,
            "logit_verdicts": self.logit_verdicts,
            "continuous": self.continuous,
            "prefix_store": self.store.budget if self.store is not None else None,
            "drafts": {"tokens": self.draft_tokens, "budget": self.draft_budget} if self.draft_tokens else None,
            "judge": self.judge.describe(),
        }

    def streams_natively(self) -> bool:
        return self.continuous

    def spare_tokens(self, request: StageRequest) -> int:
        """Context tokens left once the prompt and a realistic output allowance are in; negative: it does not fit.
        The allowance is the schema's longest unescaped output at 3 characters a token (JSON text averages more).
        """
        tok = self.judge.tokenizer
        prompt_ids = tok(self.judge.render(request.messages), add_special_tokens=False)["input_ids"]
        if request.continuation is not None:
            allowance = len(tok(request.continuation, add_special_tokens=False)["input_ids"])
        else:
            allowance = request.max_new_tokens or (
                max_json_chars(json.loads(request.schema_json), escapes=False) // 3 + 8
            )
        return self.judge.context_length - len(prompt_ids) - allowance

    def _decoder(self, ids, mask, positions, cache, **kwargs):
        """The decoder stack without the vocabulary projection (applied later, only where a token is read)."""
        decoder = self.judge.model.get_decoder()
        return decoder(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_kw: cache},
            **kwargs,
        )

    # -- planning -------------------------------------------------------------------------------------------
    def _rows(self, ready: list[tuple[int, StageRequest]]) -> list[Row]:
        tok = self.judge.tokenizer
        prompts = [self.judge.render(r.messages) for _, r in ready]
        # The chat template already wrote any special tokens the model expects.
        ids = tok(prompts, add_special_tokens=False)["input_ids"]
        rows = []
        for (ticket, req), prompt, prompt_ids in zip(ready, prompts, ids):
            if req.continuation is not None:
                # The continuation is tokenized on its own, as the reply it stands for would be generated.
                continuation = tok(req.continuation, add_special_tokens=False)["input_ids"]
                row = Row(
                    ticket=ticket,
                    request=req,
                    prompt=prompt,
                    prompt_ids=prompt_ids + continuation,
                    cap=0,
                    calls=len(ready),
                    score_from=len(prompt_ids),
                )
                if not continuation:
                    row.fail(Failure.SCHEMA, "a likelihood request needs a non-empty continuation")
                elif len(row.prompt_ids) > self.judge.context_length:
                    row.fail(
                        Failure.CONTEXT,
                        f"prompt and statement of {len(row.prompt_ids)} tokens exceed the judge's "
                        f"{self.judge.context_length}-token context; use a shorter text or a "
                        f"longer-context judge",
                    )
                rows.append(row)
                continue
            bound = req.max_new_tokens or (max_json_chars(json.loads(req.schema_json)) + 8)
            room = self.judge.context_length - len(prompt_ids)
            row = Row(
                ticket=ticket, request=req, prompt=prompt, prompt_ids=prompt_ids, cap=min(bound, room), calls=len(ready)
            )
            if room < MIN_ROOM:
                row.fail(
                    Failure.CONTEXT,
                    f"prompt of {len(prompt_ids)} tokens leaves no room in the judge's "
                    f"{self.judge.context_length}-token context; use a shorter text or a "
                    f"longer-context judge",
                )
            rows.append(row)
        return rows

    # -- the loop -------------------------------------------------------------------------------------------
    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        if not requests:
            return []
        feed = ListFeed(requests)
        self.stream(feed)
        return feed.results

    def stream(self, feed: Feed) -> None:
        """Answer a stream: take what is ready, answer what finishes, after every step. A sample's next wave joins
        the moment its own answers are in, so no sample waits for another's slow row."""
        import torch

        with self._lock, torch.inference_mode():
            started = time.perf_counter()
            scheduler = Scheduler(
                max_rows=self.max_rows, token_budget=self.token_budget, shared_prefix=self.shared_prefix
            )
            batch = Batch(self._slots())
            open_rows: dict[int, Row] = {}  # ticket -> row taken and not yet answered
            # ticket -> (its request's identity, the identical requests waiting on it); identity -> that ticket
            twins: dict[int, tuple[tuple, list[tuple[int, StageRequest]]]] = {}
            computing: dict[tuple, int] = {}
            try:
                while True:
                    ready = feed.take()
                    if ready:
                        # An identical request already in flight (a source's questions, asked for each of its
                        # summaries) is computed once: greedy decoding would give every copy the same answer.
                        fresh = []
                        for ticket, request in ready:
                            key = _identity(request)
                            if key in computing:
                                twins[computing[key]][1].append((ticket, request))
                            else:
                                computing[key], twins[ticket] = ticket, (key, [])
                                fresh.append((ticket, request))
                        rows = self._rows(fresh)
                        open_rows.update((r.ticket, r) for r in rows)
                        try:
                            self._score_likelihoods([r for r in rows if not r.done and r.score_from is not None])
                        except Exception as exc:  # noqa: BLE001 - recorded in each row, retried by the layer above
                            _fail_open(open_rows, exc)
                        scheduler.add([r for r in rows if not r.done])
                        self._answer(feed, open_rows, twins, computing)
                        continue
                    if not scheduler.waiting and not batch.live:
                        break
                    try:
                        self._advance(scheduler, batch)
                    except Exception as exc:  # noqa: BLE001 - as above: every open row fails, kind "model"
                        _fail_open(open_rows, exc)
                        scheduler.waiting.clear()
                        batch = Batch(self._slots())
                    self._answer(feed, open_rows, twins, computing)
            finally:
                self.stats.seconds += time.perf_counter() - started

    def _answer(self, feed: Feed, open_rows: dict[int, Row], twins: dict, computing: dict) -> None:
        from dataclasses import replace

        for ticket in [t for t, r in open_rows.items() if r.done]:
            row = open_rows.pop(ticket)
            result = self._result(row)
            if self.draft_tokens and result.ok and row.score_from is None:
                self.history.learn(row.request.grammar, [t for t in row.out if t not in self.eos_ids])
            key, waiting = twins.pop(ticket)
            del computing[key]
            feed.give(ticket, result)
            for other, request in waiting:
                feed.give(other, replace(result, request=request, cached=True))

    def _advance(self, scheduler: Scheduler, batch: Batch) -> None:
        """One step: admit, then one forward pass over the running rows."""
        if self._admit_below is None or len(batch.live) < self._admit_below:
            self._admit(scheduler, batch)
        if not batch.live:
            return
        try:
            self._step(batch)
            return
        except self._oom:
            pass  # recovered below, outside the except block, so the failed pass's tensors are freed first
        # Out of memory anywhere in the step (a layer, the vocabulary projection): the step left the slots and
        # the rows as they were. The newest half go back to wait, from scratch; one row alone fails.
        self.stats.oom_splits += 1
        self._release_memory()
        if not scheduler.preempt(batch):
            for row in batch.live:
                row.fail(Failure.MEMORY, OOM_ALONE)
            batch.release_finished()

    def _release_memory(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _admit(self, scheduler: Scheduler, batch: Batch) -> None:
        """Place the units the scheduler picks in the running batch. Out of memory there: retry with half the
        units; a single unit waits until fewer rows run (not retried every step), and fails loudly only when it
        cannot run even alone. (Out of memory in the step that computes their prompts is the step's: _advance.)"""
        chosen = scheduler.schedule(batch)
        while chosen:
            try:
                self._place(chosen, batch)
                self._admit_below = None
                return
            except self._oom:
                pass  # handled below, outside the except block
            self.stats.oom_splits += 1
            self._release_memory()
            if len(chosen) > 1:
                half = len(chosen) // 2
                scheduler.put_back(chosen[half:])
                chosen = chosen[:half]
            elif len(chosen[0].rows) > 1:  # one unit: its rows in two halves, each computing the prefix
                unit = chosen[0]
                half = len(unit.rows) // 2
                scheduler.put_back([Unit(unit.rows[half:], unit.prefix)])
                chosen = [Unit(unit.rows[:half], unit.prefix)]
            elif batch.live:
                scheduler.put_back(chosen)
                self._admit_below = len(batch.live)
                return
            else:
                for row in chosen[0].rows:
                    row.fail(Failure.MEMORY, OOM_ALONE)
                return

    def _slots(self, rows: int = 0, columns: int = 0) -> KVSlots:
        return KVSlots(
            self.judge.model.config,
            dtype=self.judge.model.dtype,
            device=self.device,
            rows=rows,
            columns=columns,
            row_limit=self.max_rows,
        )

    def _pass(self, slots: KVSlots, feeds: list[list[int]], starts: list[int], commit: bool = True):
        """One forward pass of the decoder: slot r feeds the tokens feeds[r] (none: []), at positions from
        starts[r] on, all of them as one flat [1, tokens] sequence, each attending its own row
        (kv_slots.ragged_attention): no holes anywhere. Returns the hidden states [tokens, hidden] and each slot's
        first token in them. Raises with the slots as they were."""
        import numpy as np
        import torch

        layout = slots.begin([len(f) for f in feeds])
        ids = np.fromiter((t for f in feeds for t in f), dtype=np.int64, count=layout.tokens)[None]
        positions = (np.repeat(np.asarray(starts, dtype=np.int64), layout.counts) + layout.step_of)[None]
        try:
            hidden = self._decoder(
                self._to_device(torch.from_numpy(ids)),
                self._no_mask,
                self._to_device(torch.from_numpy(positions)),
                slots,
                ragged_pass=layout,
            ).last_hidden_state[0]
        except BaseException:
            slots.abort()
            raise
        self.stats.forward_passes += 1
        if commit:
            slots.commit()
        return hidden, layout.offsets

    def _to_device(self, tensor):
        return to_device(tensor, self.device)

    def _stored(self, prefixes: list[list[int]]) -> list[tuple[list | None, int]]:
        """For each prefix, the keys and values of its longest stored part and that part's length (0: none)."""
        found = [self.store.lookup(p) if self.store is not None else (None, 0) for p in prefixes]
        return [(kv, min(n, len(p)) if n >= MIN_SHARED_PREFIX else 0) for (kv, n), p in zip(found, prefixes)]

    def _store(self, prefix: list[int], slots: KVSlots, slot: int) -> None:
        """Copy the slot's first len(prefix) tokens' keys and values into the prefix store (unless it holds them)."""
        if self.store is not None and len(prefix) >= MIN_SHARED_PREFIX and not self.store.holds(prefix):
            self.store.add(prefix, slots.row_kv(slot, len(prefix)))

    def _place(self, units: list[Unit], batch: Batch) -> None:
        """Each unit's rows into free slots of the running batch, with what their prompts can take without a pass:
        the longest stored part of the unit's prefix, copied from the prefix store into its first row. Everything
        else rides in the next steps, beside the running rows' tokens (chunked prefill: no pass of its own). A unit
        of several rows computes the rest of its prefix once, in its first row, which feeds its whole remainder in
        the next step; after that step the prefix is copied into the other rows' slots, and they feed their own
        remainders in the step after."""
        rows = [row for unit in units for row in unit.rows]
        batch.place(rows)
        try:
            found = self._stored([u.prefix for u in units])
            for unit, (kv, n) in zip(units, found):
                if n:
                    batch.cache.write(unit.rows[0].slot, kv, n)
                    self.stats.stored_tokens += n
                if len(unit.rows) > 1 and n == len(unit.prefix):  # found whole: nothing to compute first
                    batch.cache.fork(unit.rows[0].slot, [r.slot for r in unit.rows[1:]], n)
        except BaseException:
            batch.release(rows)
            raise
        now = time.perf_counter()
        for unit, (_, n) in zip(units, found):
            lead, waiting = unit.rows[0], len(unit.rows) > 1 and n < len(unit.prefix)
            for row in unit.rows:
                start = n if row is lead or len(unit.rows) == 1 else len(unit.prefix)
                row.pending, row.position = (row.prompt_ids[start:] if row is lead or not waiting else []), start
                row.store_after = len(unit.prefix) if row is lead and n < len(unit.prefix) else 0
                row.waits_for = lead if waiting and row is not lead else None
                self.stats.prefill_tokens += len(row.prompt_ids) - start  # the tokens its own passes compute
                row.started = now
                row.matcher = self.grammars.matcher(row.request.grammar)
                if self.forced_tokens:
                    self._take_forced(row)
                self._finish_if_complete(row)
            if waiting and not lead.done:
                lead.siblings = unit.rows[1:]
            elif waiting:  # its grammar took nothing (so it feeds nothing): each row computes the prefix itself
                for row in unit.rows[1:]:
                    if n:
                        batch.cache.fork(lead.slot, [row.slot], n)
                    row.pending, row.position, row.waits_for = row.prompt_ids[n:] + row.pending, n, None
                    self.stats.prefill_tokens += len(unit.prefix) - n

    def _release_siblings(self, lead: Row, cache: KVSlots) -> None:
        """The lead's step has computed the unit's prefix: into the waiting rows' slots, and their own remainders
        (before any forced tokens already taken) become their pending input."""
        shared = lead.store_after
        cache.fork(lead.slot, [r.slot for r in lead.siblings], shared)
        for row in lead.siblings:
            row.pending = row.prompt_ids[shared:] + row.pending
            row.position, row.waits_for = shared, None
        lead.siblings = []

    def _finish_if_complete(self, row: Row) -> None:
        """A grammar that allows nothing but the end token has nothing left to read from the model: the row ends
        here, with no forward pass (a verdict-only row costs exactly the one pass that reads its verdict)."""
        if self.logit_verdicts and not row.done and row.matcher.is_stopped():
            row.done = True
            self.stats.skipped_forwards += 1

    def _take_forced(self, row: Row) -> None:
        forced = row.matcher.compute_ff_tokens()
        if forced:
            row.matcher.consume_tokens(forced)
            row.out.extend(forced)
            row.pending.extend(forced)
            row.forced += len(forced)
            self.stats.forced_tokens += len(forced)

    def _drafts(self, active: list[Row | None], reading: list[int]) -> dict[int, Draft]:
        """Guessed continuations for the rows in these slots (drafts.py), each cut where the grammar would refuse
        it, with the forced tokens the grammar inserts after each guessed token, exactly as decoding would.
        At most draft_tokens a row and draft_budget a pass, rows with the longer matches first."""
        if not self.draft_tokens:
            return {}
        guesses = []
        for i in reading:
            row = active[i]
            room = min(self.draft_tokens, row.cap - len(row.out) - 1)
            if room <= 0:
                continue
            if row.context is None:
                row.context = NgramIndex(row.prompt_ids)
            row.context.extend(row.out[len(row.context) - len(row.prompt_ids) :])
            guess, matched = propose(row.context, self.history.index(row.request.grammar), room, len(row.prompt_ids))
            if guess:
                guesses.append((-matched, i, guess))
        # A guessed token costs what any token costs, kept or not; it pays where a pass has few tokens (its cost is
        # then mostly the weights' reading), so the budget is what the pass's own tokens leave of draft_budget.
        drafts, budget = {}, self.draft_budget - sum(len(active[i].pending) for i in reading)
        for _, i, guess in sorted(guesses):
            if budget <= 0:
                break
            draft = self._fit_draft(active[i], guess[:budget])
            if draft.tokens:
                drafts[i] = draft
                budget -= len(draft.tokens)
        return drafts

    def _fit_draft(self, row: Row, guess: list[int]) -> Draft:
        """The longest start of guess the row's grammar admits, with forced tokens inserted after each guessed
        token as _take_forced would insert them; the matcher is rolled back to where it was."""
        matcher, tokens, forced, at = row.matcher, [], [], 0
        while at < len(guess) and len(tokens) < len(guess):
            token = guess[at]
            if token in self.eos_ids or matcher.try_consume_tokens([token]) != 1:
                break
            tokens.append(token)
            forced.append(False)
            at += 1
            if self.forced_tokens:
                fixed = matcher.compute_ff_tokens()
                if fixed:
                    taken = matcher.try_consume_tokens(fixed)
                    tokens += fixed[:taken]
                    forced += [True] * taken
                    if taken < len(fixed) or guess[at : at + len(fixed)] != fixed:
                        break  # the guess parts from the text the grammar fixes
                    at += len(fixed)
            if matcher.is_stopped():
                break
        stopped = matcher.is_stopped()
        matcher.rollback(len(tokens))
        return Draft(tokens, forced, stopped)

    def _masks(self, active: list[Row], reading: list[int], drafts: dict[int, Draft], base: dict[int, int]):
        """The reading rows' grammar masks, filled in parallel into one reused bitmask ([slots, words] int32,
        pinned on a GPU host): slot base[i] for row i's next token, base[i] + 1 + m for the token after draft
        token m. Also which rows' grammars allow nothing but the end token (a numpy check over the words, not over
        the vocabulary)."""
        total = sum(1 + len(drafts[i].tokens) if i in drafts else 1 for i in reading)
        if self._bitmask is None or self._bitmask.shape[0] < total:
            self._allocate_bitmask(total)
        bitmask = self._bitmask[:total]
        self.grammars.fill_bitmasks(
            self._executor,
            [(active[i].matcher, base[i], drafts[i].tokens if i in drafts else []) for i in reading],
            bitmask,
        )
        main = [base[i] for i in reading]
        only_eos = ~(self._bitmask_np[main] & self._eos_words).any(axis=1)
        return bitmask, dict(zip(reading, only_eos.tolist()))

    def _allocate_bitmask(self, rows: int) -> None:
        import numpy as np
        import torch

        words = -(-self.vocab_size // 32)
        self._bitmask = torch.zeros(
            (max(rows, self.max_rows), words), dtype=torch.int32, pin_memory=self.device.type == "cuda"
        )
        self._bitmask_np = self._bitmask.numpy()  # the same memory, for host-side checks
        eos = np.full(words, 0xFFFFFFFF, dtype=np.uint32)
        for t in self.eos_ids:
            if t < self.vocab_size:
                eos[t // 32] &= np.uint32(0xFFFFFFFF ^ (1 << (t % 32)))
        self._eos_words = eos.view(np.int32)

    def _step(self, batch: Batch) -> None:
        """One decoding step. Transactional: until the picks are read, nothing is changed (not the slots, not a
        row), so an out-of-memory error raised anywhere in it leaves the batch as it was.
        One synchronisation with the device per step: the picks and P(yes) come back together."""
        cache, rows = batch.cache, batch.rows
        # A row whose grammar is complete finished when its last token was taken (_finish_if_complete), without
        # a pass. Every other live row has pending tokens (its prompt's rest, or its last pick and what the grammar
        # forces after it): all of them go in this pass, and its next token is read after them.
        feeding = [s for s, r in enumerate(rows) if r is not None and not r.done and r.pending and not r.waits_for]
        if not feeding:
            return
        # Each row may feed a draft after its pending tokens (drafts.py); the judge's pick is then read before
        # every guessed token and after the last, so one pass checks them all.
        drafts = self._drafts(rows, feeding)
        feeds = [[] for _ in rows]
        for s in feeding:
            feeds[s] = rows[s].pending + (drafts[s].tokens if s in drafts else [])
        base, reads, at = {}, [], 0  # reads: (slot, place in its feed, mask slot, draft tokens before it)
        for s in feeding:
            base[s] = at
            draft, fed = drafts.get(s), len(rows[s].pending)
            reads += [(s, fed - 1 + m, at + m, m) for m in [0] + (draft.read_points() if draft else [])]
            at += 1 + (len(draft.tokens) if draft else 0)
        hidden, offsets = self._pass(cache, feeds, [r.position if r is not None else 0 for r in rows], commit=False)
        # The grammar masks, filled on the CPU while the device runs the pass just queued (on a GPU the pass is
        # asynchronous until its picks are read).
        bitmask, only_eos = self._masks(rows, feeding, drafts, base)
        try:
            picks, p_yes = self._read(rows, [(s, offsets[s] + c, k) for s, c, k, _ in reads], hidden, bitmask)
        except BaseException:
            cache.abort()
            raise
        cache.commit()
        picked = {(s, m): (pick, p) for (s, _, _, m), pick, p in zip(reads, picks, p_yes)}
        returned = []  # (slot, how many of its last tokens): draft tokens the judge did not pick
        for s in feeding:
            row, draft = rows[s], drafts.get(s)
            row.position += len(row.pending)
            row.pending = []
            if row.store_after:  # its prompt's prefix is in its slot now
                self._store(row.prompt_ids[: row.store_after], cache, s)
                if row.siblings:
                    self._release_siblings(row, cache)
                row.store_after = 0
            if only_eos[s]:  # complete, though llguidance did not say so when its last token went in: nothing to read
                row.done = True
                continue
            kept = self._accept(row, draft, picked, s)
            if draft:
                self.stats.draft_tokens += len(draft.tokens)
                self.stats.accepted_draft_tokens += kept
                if kept < len(draft.tokens):
                    returned.append((s, len(draft.tokens) - kept))
        cache.give_back(returned)
        batch.release_finished()  # their slots are free for the next admission; nothing is copied

    def _accept(self, row: Row, draft: Draft | None, picked: dict, i: int) -> int:
        """Take the row's picks in order, as decoding token by token would have taken them: each guessed token
        stays while the pick before it equals it (a forced one stays as the grammar fixed it), and the first pick
        that differs, or the one after the last guessed token, is the row's next pending token. Returns how many
        draft tokens stayed (their keys and values are in the cache; the step gives the rest back, and the row's next
        pass writes over them)."""
        tokens = draft.tokens if draft else []
        m = 0
        while True:
            if m < len(tokens) and draft.forced[m]:
                row.matcher.consume_token(tokens[m])
                row.out.append(tokens[m])
                row.forced += 1
                self.stats.forced_tokens += 1
                m += 1
                continue
            if m:  # a read point after a kept guess: as a step would check before reading
                if self._fail_at_cap(row):
                    return m
                self._finish_if_complete(row)
                if row.done:
                    return m
            token, p = picked[(i, m)]
            if token < 0:
                self.stats.nan_rows += 1
                row.fail(
                    Failure.MODEL,
                    "the judge's logits were NaN at this step (a poisoned forward pass); nothing was read from them",
                )
                return m
            if p is not None:
                row.choice_probs.append(p)
            row.out.append(token)
            row.decoded += 1
            self.stats.decoded_tokens += 1
            if token in self.eos_ids:
                row.done = True
                return m
            row.matcher.consume_token(token)
            if m < len(tokens) and token == tokens[m]:
                m += 1
                continue
            row.position += m
            row.pending = [token]
            if self.forced_tokens:
                self._take_forced(row)
            self._fail_at_cap(row)
            self._finish_if_complete(row)
            return m

    @staticmethod
    def _fail_at_cap(row: Row) -> bool:
        """A row whose output reached its token cap fails, its raw output kept; returns whether it did."""
        if len(row.out) < row.cap:
            return False
        row.fail(Failure.CAP, f"hit the {row.cap}-token cap before the JSON closed; raw output kept")
        return True

    def _read(self, active: list[Row], reads: list[tuple[int, int, int]], hidden, bitmask):
        """The vocabulary projection at each read (row, its token's place in the pass's hidden states, mask slot),
        the grammar mask applied on the device, the greedy pick, and P(yes) where the allowed tokens form a closed
        choice (whitespace-only tokens are neutral; P(yes) is kept at the step whose pick decides the verdict, so
        each verdict gets exactly one). Returns picks and P(yes) (None where there is no verdict), brought back in
        one transfer."""
        import torch

        if not reads:
            return [], []
        at = self._to_device(torch.tensor([int(c) for _, c, _ in reads], dtype=torch.long))
        mask_rows = self._to_device(torch.tensor([k for _, _, k in reads], dtype=torch.long))
        logits = self.judge.model.get_output_embeddings()(hidden.index_select(0, at))[:, : self.vocab_size].float()
        poisoned = torch.isnan(logits).any(dim=1)
        allowed = _unpack(self._to_device(bitmask).index_select(0, mask_rows), self.vocab_size)
        logits = logits.masked_fill(~allowed, float("-inf"))
        picks = logits.argmax(dim=-1)
        columns = [picks.to(torch.float32), poisoned.to(torch.float32)]
        by_choice: dict[tuple[str, str], list[int]] = {}
        for k, (i, _, _) in enumerate(reads):
            if active[i].request.verdict_choice is not None:
                by_choice.setdefault(active[i].request.verdict_choice, []).append(k)
        p_yes = torch.full((len(reads),), float("nan"), device=self.device)
        for choice, ks in by_choice.items():
            yes, no, neutral = self._choice_mask(choice)
            k_t = self._to_device(torch.tensor(ks, dtype=torch.long))
            ok, pick = allowed.index_select(0, k_t), picks.index_select(0, k_t)
            decisive = yes[pick] | no[pick]
            closed = ~(ok & ~(yes | no | neutral)).any(1) & (ok & yes).any(1) & (ok & no).any(1)
            probs = torch.softmax(logits.index_select(0, k_t), dim=-1)
            y, n = (probs * yes).sum(1), (probs * no).sum(1)
            value = torch.where(decisive & closed, y / (y + n), torch.full_like(y, float("nan")))
            p_yes = p_yes.index_copy(0, k_t, value)
        columns.append(p_yes)
        back = torch.stack(columns, 1).tolist()  # the step's one synchronisation with the device
        # A NaN in the logits is never read as a verdict: the pick is marked -1 and the row fails.
        return [-1 if bad else int(p) for p, bad, _ in back], [None if q != q else q for _, _, q in back]

    def _score_likelihoods(self, rows: list[Row]) -> None:
        """Every likelihood row, group by group (rows that share a prompt prefix, whichever sample they belong to),
        in batches within the row cap and the token budget."""
        for group in split_by_prefix(rows) if self.shared_prefix else [[r] for r in rows]:
            prefix = common_prefix([r.prompt_ids for r in group], min(r.feed_from for r in group))
            size = min(self.max_rows, max(1, self.token_budget // max(len(r.prompt_ids) for r in group)))
            for at in range(0, len(group), size):
                self._likelihood_batch(group[at : at + size], prefix)

    def _likelihood_batch(self, batch: list[Row], prefix: list[int]) -> None:
        """One pass; out of memory: two halves, down to a row that cannot run alone, which fails loudly."""
        try:
            self._likelihood_pass(batch, prefix)
            return
        except self._oom:
            pass  # handled below, outside the except block
        self.stats.oom_splits += 1
        self._release_memory()
        if len(batch) == 1:
            batch[0].fail(Failure.MEMORY, OOM_ALONE)
            return
        half = len(batch) // 2
        self._likelihood_batch(batch[:half], prefix)
        self._likelihood_batch(batch[half:], prefix)

    def _likelihood_pass(self, batch: list[Row], prefix: list[int]) -> None:
        """The group's prefix once, in the first row's slot (its stored part copied from the prefix store), copied
        into the other rows' slots; then every row's remainder, its continuation included, in one ragged pass."""
        now = time.perf_counter()
        slots = self._slots(len(batch))
        slots.place(len(batch))
        (kv, kept), start = self._stored([prefix])[0], len(prefix)
        if kept:
            slots.write(0, kv, kept)
            self.stats.stored_tokens += kept
        if start > kept:
            self._pass(slots, [prefix[kept:]] + [[]] * (len(batch) - 1), [kept] + [0] * (len(batch) - 1))
            self.stats.prefill_tokens += start - kept
            self._store(prefix, slots, 0)
        slots.fork(0, list(range(1, len(batch))), start)
        rests = [r.prompt_ids[start:] for r in batch]
        hidden, offsets = self._pass(slots, rests, [start] * len(batch))
        self.stats.prefill_tokens += sum(len(rest) for rest in rests)
        for row in batch:
            row.started, row.position, row.logprob_sum, row.logprob_count = now, start, 0.0, 0
        self._read_likelihoods(batch, [len(rest) for rest in rests], hidden, offsets)
        for row in batch:
            row.done = True

    def _read_likelihoods(self, batch: list[Row], fed: list[int], hidden, offsets) -> None:
        """Add the log-probability of every continuation token fed in this pass, read at the position before it.
        The vocabulary projection runs only at those positions, a few hundred at a time."""
        import torch

        picks = []  # (row in batch, position in this pass, target token)
        for i, row in enumerate(batch):
            for j in range(fed[i]):
                target = row.position + j + 1  # index in prompt_ids of the token the logits at j predict
                if row.score_from <= target < len(row.prompt_ids):
                    picks.append((i, j, row.prompt_ids[target]))
        head = self.judge.model.get_output_embeddings()
        for at in range(0, len(picks), 256):
            part = picks[at : at + 256]
            where = self._to_device(torch.tensor([int(offsets[p[0]]) + p[1] for p in part], dtype=torch.long))
            targets = self._to_device(torch.tensor([p[2] for p in part], dtype=torch.long))
            logits = head(hidden.index_select(0, where))[:, : self.vocab_size].float()
            logp = (logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)).tolist()
            for (i, _, _), value in zip(part, logp):
                batch[i].logprob_sum += value
                batch[i].logprob_count += 1
        for row in batch:
            if row.logprob_sum != row.logprob_sum and not row.done:
                self.stats.nan_rows += 1
                row.fail(Failure.MODEL, "the judge's log-probabilities were NaN (a poisoned forward pass)")

    def _choice_mask(self, choice: tuple[str, str]):
        """Tokens whose text (quotes and spaces stripped) starts with the yes / the no character, and the
        whitespace-only tokens a grammar may allow before either."""
        if choice not in self._choice_masks:
            import torch

            stripped = [t.lstrip(' "') for t in self.grammars.token_texts]
            yes = torch.tensor([t.startswith(choice[0]) for t in stripped], device=self.device)
            no = torch.tensor([t.startswith(choice[1]) for t in stripped], device=self.device)
            neutral = torch.tensor([t.strip() == "" and t != "" for t in self.grammars.token_texts], device=self.device)
            self._choice_masks[choice] = (yes, no, neutral)
        return self._choice_masks[choice]

    def _result(self, row: Row) -> StageResult:
        calls = row.calls
        if row.score_from is not None:
            return self._likelihood_result(row, calls)
        tok = self.judge.tokenizer
        body = [t for t in row.out if t not in self.eos_ids]
        text = tok.decode(body, skip_special_tokens=True)
        res = StageResult(
            request=row.request,
            value=None,
            raw_output=text,
            prompt=row.prompt,
            tokens_in=len(row.prompt_ids),
            tokens_out=len(row.out),
            seconds=0.0,
            batch_size=calls,
            error=row.error,
            error_kind=row.error_kind,
            cap=row.cap,
            forced_tokens=row.forced,
            decoded_tokens=row.decoded,
            choice_probs=list(row.choice_probs),
        )
        res.seconds = time.perf_counter() - row.started if row.started else 0.0
        if res.error is None:
            from pydantic import ValidationError

            try:
                res.value = parse_output(row.request.schema, text)
            except (ValidationError, ValueError) as exc:
                res.error_kind = Failure.SCHEMA
                res.error = f"output does not match the schema: {str(exc).splitlines()[0]}"
        return res

    def _likelihood_result(self, row: Row, calls: int) -> StageResult:
        res = StageResult(
            request=row.request,
            value=None,
            raw_output=row.request.continuation or "",
            prompt=row.prompt,
            tokens_in=len(row.prompt_ids),
            tokens_out=0,
            batch_size=calls,
            error=row.error,
            error_kind=row.error_kind,
            cap=0,
        )
        res.seconds = time.perf_counter() - row.started if row.started else 0.0
        if res.error is None:
            n = row.logprob_count
            res.value = Likelihood(mean_logprob=row.logprob_sum / n, tokens=n)
        return res


def check_plain_attention(config) -> None:
    """Ragged passes attend with plain causal softmax attention over grouped-query heads. A model whose attention
    is more than that (a sliding window, softcapped scores) would be judged wrongly by it: refused, loudly."""
    window = getattr(config, "sliding_window", None)
    windowed = window is not None and getattr(config, "use_sliding_window", True) is not False
    layer_types = getattr(config, "layer_types", None) or []
    if windowed and (not layer_types or any("sliding" in str(t) for t in layer_types)):
        raise ValueError(
            f"{getattr(config, 'model_type', 'this model')} attends within a sliding window of {window} tokens, "
            "which this engine's attention does not do; use a judge with full attention (Llama, Qwen2.5, Mistral "
            "v0.2 and later)"
        )
    for name in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(config, name, None):
            raise ValueError(
                f"{getattr(config, 'model_type', 'this model')} softcaps its scores ({name}), which this engine "
                "does not do; use a judge without softcapping (Llama, Qwen2.5, Mistral)"
            )


def usable_memory(free: int, reserved_unused: int, share: float) -> int:
    """Bytes this engine may fill: what the device reports free plus what PyTorch's allocator holds unused, times
    the engine's share of the device (engines sharing one GPU, as Ray actors with a fraction of a GPU each do,
    would each see the whole of it free)."""
    return int((free + max(0, reserved_unused)) * share)


def kv_token_budget(free: int, per_token: int) -> int:
    """Half of usable memory for the KV cache (activations and logits need the rest), rounded down to a power of
    two so that the budget, which shapes the batches and is stored in every row, does not drift from run to run
    with a few MB of free memory (a resumed run must batch as the first run did). 4096 tokens at least."""
    return 1 << max(12, int(free * 0.5 / per_token).bit_length() - 1)


def _identity(request: StageRequest) -> tuple:
    """What a request's answer depends on (not which sample or stage asked)."""
    return (
        json.dumps(request.messages, sort_keys=True),
        request.schema_json,
        request.max_new_tokens,
        request.verdict_choice,
        request.continuation,
    )


def _fail_open(open_rows: dict[int, Row], exc: Exception) -> None:
    """The engine itself raised (not out of memory): every row taken and not answered fails with the error, kind
    "model", so the retry layer reruns it once and the driver never loses a row."""
    message = engine_raised(exc)
    for row in open_rows.values():
        if not row.done:
            row.fail(Failure.MODEL, message)


def _unpack(bitmask, vocab_size: int):
    """[rows, words] int32 bitmask -> [rows, vocab] bool, on the bitmask's device."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
