"""TransformersEngine: the hot loop. Answers stage requests with a local judge under JSON grammars.

One step of the loop:
1. Admit waiting work while the token budget allows (iteration-level batching: finished rows leave after every
   step and waiting rows join, so one long generation never holds a whole batch). Work is admitted as units:
   requests that share a long token prefix, whichever sample they come from (a source checked against every
   claim of every summary of it, or a summary against every coverage item), form one unit whose prefix is
   prefilled once and whose KV cache is forked into one row per request. Units are sorted longest first, so an
   out-of-memory error comes early.
2. One forward pass over each row's pending tokens: the last sampled token plus any forced tokens the grammar
   fixes (the JSON skeleton), all inserted in this one pass instead of decoded one per step. Rows feed different
   numbers of tokens; shorter rows get masked holes after their tokens (never before: no query may attend to
   nothing), and explicit position ids keep RoPE exact. Keys and values are written in place (kv_slots.py). Where
   holes are an eighth of the pass or more, its projections and MLPs run on the real tokens only
   (token_packing.py), so a hole costs its share of attention, not a token's compute.
3. While the device runs that pass, every row's grammar mask is filled on the CPU (in parallel threads) into one
   pinned bitmask, moved to the device once, unpacked and applied there.
4. Greedy pick under the mask. Where the allowed tokens form a closed choice (true/false, "1"/"0"), P(yes) is
   read from the same distribution and kept as a soft score; picks and P(yes) come back in one transfer. Only
   then does the step change anything (slots, rows), so an error anywhere in it leaves the batch as it was.
5. A row whose grammar is complete ends as its last token goes in, without another pass (a verdict-only row costs
   exactly the pass that reads its verdict). Rows that hit their token cap fail with their raw text kept; NaN
   logits fail the row; nothing is ever guessed.
Likelihood requests (StageRequest.continuation) generate nothing, so they skip the loop (_score_likelihoods): the
prefix a group of them shares is prefilled once, its cache is expanded to the group's rows, every row's remainder
(the end of its prompt and its continuation) runs in one right-padded pass, and the log-probability of each
continuation token is read at the position before it. Right padding needs no holes: the pads come after every
real token, and attention is causal.

Features can be turned off one by one (shared_prefix, forced_tokens, logit_verdicts) for the benchmark ladder
and for tests that check each against the plain path.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from offline_sumscore.core.errors import Failure, check_count
from offline_sumscore.core.schemas import Likelihood, max_json_chars, parse_output
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import Feed, ListFeed
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
from offline_sumscore.engine.token_packing import TokenPacking

PACK_ABOVE = 8  # a pass whose holes are at least 1/PACK_ABOVE of its slots runs its dense layers packed
MIN_ROOM = 16  # tokens the context must have left after the prompt for any JSON verdict
OOM_ALONE = "out of memory even alone; use a shorter prompt or a larger device"


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
    packed_passes: int = 0  # passes whose dense layers ran on the real tokens only (token_packing.py)
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
        token_packing: bool = True,
        continuous: bool = True,
        store_tokens: int | None = None,
        step_tokens: int | None = None,
        device_share: float = 1.0,
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
        # Padding slots a forward pass may carry: a pass reads every weight once, so up to about this many extra
        # token slots ride along nearly free. Estimated, not measured: on the 2-core CPU with the 135M judge a pass
        # reads 425 MB (~60 ms at 7 GB/s) and one token costs ~3 ms of compute, so about 16; an 8B model on an
        # H200 reads 16 GB (~3 ms) against ~0.02 ms per token, so a few hundred.
        self.step_tokens = step_tokens or (256 if judge.model.device.type == "cuda" else 16)
        tok = judge.tokenizer
        gen = judge.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else tok.eos_token_id
        self.eos_ids = sorted(set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id})
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else self.eos_ids[0]
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
        packing = TokenPacking(judge.model) if token_packing else None
        self.packing = packing if packing is not None and packing.available else None
        self._choice_masks: dict[tuple[str, str], tuple] = {}
        self._lock = threading.Lock()  # one run at a time on one model (ascore runs in threads)
        self._oom = (torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else (RuntimeError,)
        self._admit_below: int | None = None  # after an admission ran out of memory: wait until fewer rows run
        # Grouped-query models: attention that stacks a group's query heads instead of copying the keys and values
        # once per head (transformers' SDPA path copies them whenever a mask is given and a step feeds 2+ tokens).
        config = judge.model.config
        if getattr(config, "_attn_implementation", None) == "sdpa":
            judge.model.set_attn_implementation(register_attention())
        self.attention = getattr(config, "_attn_implementation", None)
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

        # Attention that takes SDPA's boolean masks gets a 4D mask built here (see _attention_mask); any other
        # (flash attention, eager) gets the 2D mask and builds its own.
        self._bool_masks = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(self.attention) is sdpa_mask
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
            "step_tokens": self.step_tokens,
            "device_share": self.device_share,
            "attention": self.attention,
            "grammar_backend": f"{BACKEND}: lazy token masks, no per-schema index to precompile",
            "shared_prefix": self.shared_prefix,
            "forced_tokens": self.forced_tokens,
            "logit_verdicts": self.logit_verdicts,
            "continuous": self.continuous,
            "prefix_store": self.store.budget if self.store is not None else None,
            "token_packing": len(self.packing.sites) if self.packing is not None else None,
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

    def _decoder(self, ids, mask, positions, cache):
        """The decoder stack without the vocabulary projection (applied later, only where a token is read)."""
        decoder = self.judge.model.get_decoder()
        return decoder(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **{self._cache_kw: cache}
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
            batch = Batch()
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
                        batch.clear()
                    self._answer(feed, open_rows, twins, computing)
            finally:
                self.stats.seconds += time.perf_counter() - started

    def _answer(self, feed: Feed, open_rows: dict[int, Row], twins: dict, computing: dict) -> None:
        from dataclasses import replace

        for ticket in [t for t, r in open_rows.items() if r.done]:
            row = open_rows.pop(ticket)
            result = self._result(row)
            key, waiting = twins.pop(ticket)
            del computing[key]
            feed.give(ticket, result)
            for other, request in waiting:
                feed.give(other, replace(result, request=request, cached=True))

    def _advance(self, scheduler: Scheduler, batch: Batch) -> None:
        """One step: admit, then one forward pass over the running rows."""
        if scheduler.waiting and any(r.done for r in batch.rows):
            batch.compact()  # admission merges caches and counts the budget: the finished rows leave first
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
            batch.clear()

    def _release_memory(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _admit(self, scheduler: Scheduler, batch: Batch) -> None:
        """Prefill the units the scheduler picks and join them to the running batch. Out of memory in a
        prefill: retry with half the units; a single unit waits until fewer rows run (not retried every step),
        and fails loudly only when it cannot run even alone."""
        chosen = scheduler.schedule(batch)
        while chosen:
            try:
                slots, rows = self._prefill(chosen, joining=bool(batch.rows))
                batch.join(slots, rows)
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
            elif len(chosen[0].rows) > 1:  # one unit: its rows in two halves, each prefilling the prefix
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

    def _slots(self, rows: int, columns: int = 0) -> KVSlots:
        return KVSlots(
            self.judge.model.config,
            dtype=self.judge.model.dtype,
            device=self.device,
            rows=rows,
            columns=columns,
            row_limit=self.max_rows,
        )

    def _pass(self, slots: KVSlots, ids, new_mask, positions, commit: bool = True):
        """One forward pass of the decoder over new columns of the slots (ids, mask and positions: numpy arrays
        on the host). Raises with the slots as they were."""
        import torch

        device = [self._to_device(torch.from_numpy(a)) for a in (ids, new_mask, positions)]
        mask = slots.begin(new_mask, device[1])
        if self._bool_masks:
            mask = _attention_mask(mask, new_mask.shape[1])
        # Holes cost a whole token's compute in the dense layers unless they are packed out; packing costs a
        # gather and a scatter per layer, so a pass with few holes runs dense.
        packed = None
        if self.packing is not None:
            real = new_mask.reshape(-1).nonzero()[0]
            if (new_mask.size - len(real)) * PACK_ABOVE >= new_mask.size:
                packed = self.packing.packed(self._to_device(torch.from_numpy(real)), new_mask.size)
        try:
            with packed or nullcontext():
                hidden = self._decoder(device[0], mask, device[2], slots).last_hidden_state
        except BaseException:
            slots.abort()
            raise
        self.stats.forward_passes += 1
        self.stats.packed_passes += packed is not None
        if commit:
            slots.commit()
        return hidden

    def _to_device(self, tensor):
        return to_device(tensor, self.device)

    def _stored(self, prefixes: list[list[int]]) -> list[tuple[list | None, int]]:
        """For each prefix, the keys and values of its longest stored part and that part's length (0: none)."""
        found = [self.store.lookup(p) if self.store is not None else (None, 0) for p in prefixes]
        return [(kv, min(n, len(p)) if n >= MIN_SHARED_PREFIX else 0) for (kv, n), p in zip(found, prefixes)]

    def _stored_cache(self, found: list[tuple[list | None, int]], rows: int, new_columns: int) -> KVSlots:
        """Slots with one row per prefix holding its stored part (see _stored), right-aligned to a common width
        (nothing stored: width 0). Allocated once, with room for `rows` rows and `new_columns` columns after the
        stored ones: fresh memory is slow to touch on a CPU, and every growth copies what is there."""
        width = max((n for _, n in found), default=0)
        slots = self._slots(max(rows, len(found)), width + new_columns)
        slots.add_rows(len(found))
        if width:
            slots.open_columns(width)
            for i, (kv, n) in enumerate(found):
                if n:
                    slots.write_row(i, kv, n)
            self.stats.stored_tokens += sum(n for _, n in found)
        return slots

    def _store(self, prefix: list[int], slots: KVSlots, row: int, columns: list[int]) -> None:
        """Copy one row's keys and values at the given window columns into the prefix store."""
        if self.store is None or len(prefix) < MIN_SHARED_PREFIX:
            return
        import torch

        self.store.add(prefix, slots.row_kv(row, self._to_device(torch.tensor(columns, dtype=torch.long))))

    def _prefill(self, units: list[Unit], joining: bool = True) -> tuple[KVSlots, list[Row]]:
        """Each unit's shared prefix once (its stored part from the prefix store, the rest in one batched pass with
        masked holes), then the slots forked into one row per request.
        joining: rows are running already, so the new rows' own prompt remainders get a pass of their own."""
        prefixes = [u.prefix for u in units]
        found = self._stored(prefixes)
        kept = [n for _, n in found]
        rests = [p[n:] for p, n in zip(prefixes, kept)]
        rows = [row for unit in units for row in unit.rows]
        starts = [len(unit.prefix) for unit in units for _ in unit.rows]
        # Each row's own rest of the prompt (all but its last token), run in a second pass over the new rows only,
        # so the running batch's steps feed one token (plus forced ones) per row instead of padding every row out
        # to the longest prompt remainder.
        own = [row.prompt_ids[start : row.feed_from] if joining else [] for row, start in zip(rows, starts)]
        # Sized for this admission's passes before they run: the prefix pass, then the rows' own remainders.
        slots = self._stored_cache(found, len(rows), max(map(len, rests)) + max(map(len, own)))
        width = slots.width
        if max(len(r) for r in rests):
            # Holes come after each row's tokens, never before: every query row attends to at least its own token
            # (CUDA kernels can return NaN for a query row that may attend to nothing).
            self._pass(slots, *_holed(rests, kept, self.pad_id))
            self.stats.prefill_tokens += sum(len(r) for r in rests)
            for i, (unit, rest, n) in enumerate(zip(units, rests, kept)):
                if rest:  # a prefix found whole in the store is there already
                    self._store(unit.prefix, slots, i, list(range(width - n, width + len(rest))))
        # Fork: row j of unit i reads unit i's cache.
        slots.select([i for i, u in enumerate(units) for _ in u.rows])
        if max(map(len, own)):
            self._pass(slots, *_holed(own, starts, self.pad_id))
        now = time.perf_counter()
        for row, start, rest in zip(rows, starts, own):
            row.pending = row.prompt_ids[start + len(rest) :]
            row.position = start + len(rest)
            self.stats.prefill_tokens += len(row.prompt_ids) - start  # the prompt's own part
            row.started = now
            row.matcher = self.grammars.matcher(row.request.grammar)
            if self.forced_tokens:
                self._take_forced(row)
            self._finish_if_complete(row)
        return slots, rows

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

    def _masks(self, rows: list[Row], live: list[int]):
        """The live rows' grammar masks, filled in parallel into one reused bitmask ([rows, words] int32, pinned
        on a GPU host), and which rows' grammars allow nothing but the end token (a numpy check over the words,
        not over the vocabulary)."""
        if self._bitmask is None or self._bitmask.shape[0] < len(rows):
            self._allocate_bitmask(len(rows))
        bitmask = self._bitmask[: len(rows)]
        self.grammars.fill_bitmasks(self._executor, [(rows[i].matcher, i) for i in live], bitmask)
        only_eos = ~(self._bitmask_np[: len(rows)] & self._eos_words).any(axis=1)
        return bitmask, only_eos

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

        active = batch.rows
        # Finished rows may still hold a slot (see the end of the step): they feed nothing and read nothing. A row
        # whose grammar is complete finished when its last token was taken (_finish_if_complete), without a pass.
        live = [i for i, row in enumerate(active) if not row.done]
        if not live:
            return
        # 3. One forward pass over the rows' pending tokens; shorter rows get masked holes. The width is the
        # widest whose padding stays within step_tokens slots: that much padding rides along nearly free (the pass
        # reads every weight once anyway), more costs real compute. A row with a longer run of forced tokens feeds
        # the rest of it in the next step and reads no token in this one.
        lengths = [0 if r.done else len(r.pending) for r in active]
        width = max(lengths)
        while width > 1 and sum(width - min(n, width) for n in lengths) > self.step_tokens:
            width -= 1
        fed = [min(n, width) for n in lengths]
        ids, new_mask, positions = _holed(
            [r.pending[:n] for r, n in zip(active, fed)], [r.position for r in active], self.pad_id
        )
        reading = [i for i in live if fed[i] == len(active[i].pending)]
        slots = batch.cache
        hidden = self._pass(slots, ids, new_mask, positions, commit=False)
        # 2. The grammar masks, filled on the CPU while the device runs the pass just queued (on a GPU the pass is
        # asynchronous until its picks are read).
        bitmask, only_eos = self._masks(active, live)
        try:
            picks, p_yes = self._read(active, reading, fed, hidden, bitmask)
        except BaseException:
            slots.abort()
            raise
        slots.commit()
        for i in live:
            active[i].position += fed[i]
            active[i].pending = active[i].pending[fed[i] :]
        for k, i in enumerate(reading):
            row, token = active[i], picks[k]
            if only_eos[i]:  # complete, though llguidance did not say so when its last token went in: nothing to read
                row.done = True
                continue
            if token < 0:
                self.stats.nan_rows += 1
                row.fail(
                    Failure.MODEL,
                    "the judge's logits were NaN at this step (a poisoned forward pass); nothing was read from them",
                )
                continue
            if p_yes[k] is not None:
                row.choice_probs.append(p_yes[k])
            row.out.append(token)
            row.decoded += 1
            self.stats.decoded_tokens += 1
            row.pending = [token]
            if token in self.eos_ids:
                row.done = True
                continue
            row.matcher.consume_token(token)
            if self.forced_tokens:
                self._take_forced(row)
            if len(row.out) >= row.cap:
                row.fail(Failure.CAP, f"hit the {row.cap}-token cap before the JSON closed; raw output kept")
            self._finish_if_complete(row)
        # 5. Compacting the batch copies the whole KV cache, so finished rows keep their slot (fed nothing) until a
        # quarter of the slots are finished, or new rows are admitted.
        dead = sum(r.done for r in active)
        if dead and dead * 4 >= len(active):
            batch.compact()

    def _read(self, active: list[Row], reading: list[int], fed: list[int], hidden, bitmask):
        """The vocabulary projection at each reading row's last fed position, the grammar mask applied on the
        device, the greedy pick, and P(yes) where the allowed tokens form a closed choice (whitespace-only tokens
        are neutral; P(yes) is kept at the step whose pick decides the verdict, so each verdict gets exactly one).
        Returns picks and P(yes) (None where there is no verdict), brought back in one transfer."""
        import torch

        if not reading:
            return [], []
        at = self._to_device(torch.tensor(reading, dtype=torch.long))
        last = self._to_device(torch.tensor([fed[i] - 1 for i in reading], dtype=torch.long))
        logits = self.judge.model.get_output_embeddings()(hidden[at, last])[:, : self.vocab_size].float()
        poisoned = torch.isnan(logits).any(dim=1)
        allowed = _unpack(self._to_device(bitmask).index_select(0, at), self.vocab_size)
        logits = logits.masked_fill(~allowed, float("-inf"))
        picks = logits.argmax(dim=-1)
        columns = [picks.to(torch.float32), poisoned.to(torch.float32)]
        by_choice: dict[tuple[str, str], list[int]] = {}
        for k, i in enumerate(reading):
            if active[i].request.verdict_choice is not None:
                by_choice.setdefault(active[i].request.verdict_choice, []).append(k)
        p_yes = torch.full((len(reading),), float("nan"), device=self.device)
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
        import numpy as np

        now = time.perf_counter()
        found = self._stored([prefix])
        kept, start = found[0][1], len(prefix)
        rests = [r.prompt_ids[start:] for r in batch]
        slots = self._stored_cache(found, len(batch), start - kept + max(map(len, rests)))
        if start > kept:
            self._pass(slots, *_holed([prefix[kept:]], [kept], self.pad_id))
            self.stats.prefill_tokens += start - kept
            self._store(prefix, slots, 0, list(range(start)))
        slots.select([0] * len(batch))
        # Right padding: the pads come after every real token, and attention is causal, so no real token sees one.
        ids, mask, positions = _holed(rests, [start] * len(batch), self.pad_id)
        hidden = self._pass(slots, ids, np.ones_like(mask), positions)
        self.stats.prefill_tokens += sum(len(rest) for rest in rests)
        for row in batch:
            row.started, row.position, row.logprob_sum, row.logprob_count = now, start, 0.0, 0
        self._read_likelihoods(batch, [len(rest) for rest in rests], hidden)
        for row in batch:
            row.done = True

    def _read_likelihoods(self, batch: list[Row], fed: list[int], hidden) -> None:
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
            rows_t = torch.tensor([p[0] for p in part], device=self.device)
            cols_t = torch.tensor([p[1] for p in part], device=self.device)
            targets = torch.tensor([p[2] for p in part], device=self.device)
            logits = head(hidden[rows_t, cols_t])[:, : self.vocab_size].float()
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


def _holed(seqs: list[list[int]], starts: list[int], pad_id: int):
    """Token lists as one batch: each left-aligned, masked holes after it, position ids going on from its start
    (holes repeat the last position; they are never attended). Returns ids, mask, positions as numpy arrays: host
    data stays out of torch until it is copied to the device, so nothing here can wait on the device."""
    import numpy as np

    width = max(len(seq) for seq in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(seqs), width), dtype=np.int64)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = seq
        mask[i, : len(seq)] = 1
    lasts = np.array([start + max(len(seq), 1) - 1 for seq, start in zip(seqs, starts)], dtype=np.int64)
    positions = np.minimum(
        np.asarray(starts, dtype=np.int64)[:, None] + np.arange(width, dtype=np.int64), lasts[:, None]
    )
    return ids, mask, positions


def _attention_mask(mask, new: int):
    """[rows, columns] 0/1 mask whose last `new` columns are this pass's tokens -> [rows, 1, new, columns] boolean
    mask: causal over the new tokens, and every query attends at least its own key. A query row that may attend to
    nothing is where CUDA's kernels can return NaN (and 0 x NaN spreads it through every masked sum); the only
    queries without another key to attend are holes, whose output is never read, so attending their own key
    changes no real token. Built on the device with no data-dependent step, so it never waits for the device
    (transformers' own mask builder checks whether a mask is all ones, which does)."""
    import torch

    columns = mask.shape[1]
    at = torch.arange(columns - new, columns, device=mask.device)[:, None]  # each query's own column
    keys = torch.arange(columns, device=mask.device)[None, :]
    allowed = mask.bool()[:, None, None, :] & (keys <= at)[None, None]
    return allowed | (keys == at)[None, None]


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
