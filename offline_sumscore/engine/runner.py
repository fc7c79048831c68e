"""TransformersEngine: the hot loop. Answers stage requests with a local judge under JSON grammars.

One step of the loop:
1. Admit waiting work while the token budget allows (iteration-level batching: finished rows leave after every
   step and waiting rows join, so one long generation never holds a whole batch). Work is admitted as units:
   requests that share a long token prefix, whichever sample they come from (a source checked against every
   claim of every summary of it, or a summary against every coverage item), form one unit whose prefix is
   prefilled once and whose KV cache is forked into one row per request. Units are sorted longest first, so an
   out-of-memory error comes early.
2. Compute every row's grammar mask on the CPU, as one bitmask for the batch, moved to the device once.
   A row whose grammar is complete is finished here, without a forward pass (logit verdicts: a verdict-only row
   costs exactly one forward pass, the one that reads the verdict).
3. One forward pass over each row's pending tokens: the last sampled token plus any forced tokens the grammar
   fixes (the JSON skeleton), all inserted in this one pass instead of decoded one per step. Rows feed different
   numbers of tokens; shorter rows are padded with masked holes, and explicit position ids keep RoPE exact.
4. Greedy pick under the mask. Where the allowed tokens form a closed choice (true/false, "1"/"0"), P(yes) is
   read from the same distribution and kept as a soft score.
5. Rows that hit their token cap fail with their raw text kept; nothing is ever guessed.
Likelihood requests (StageRequest.continuation) generate nothing, so they skip the loop (_score_likelihoods): the
prefix a group of them shares is prefilled once, its cache is expanded to the group's rows, every row's remainder
(the end of its prompt and its continuation) runs in one right-padded pass, and the log-probability of each
continuation token is read at the position before it. Right padding needs no mask: the pads come after every real
token, and attention is causal.

Features can be turned off one by one (shared_prefix, forced_tokens, logit_verdicts) for the benchmark ladder
and for tests that check each against the plain path.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..judge import Judge
from ..schemas import Likelihood, max_json_chars, parse_output
from ..stages import StageRequest, StageResult
from . import Feed, ListFeed
from .batch_cache import select_rows
from .grammar import BACKEND, GrammarCache
from .retry import engine_raised
from .scheduler import MIN_SHARED_PREFIX, Batch, PrefixStore, Row, Scheduler, Unit, common_prefix, split_by_prefix

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
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class TransformersEngine:
    """Answers StageRequests on a loaded Judge. run(requests) -> results in the same order."""

    def __init__(self, judge: Judge, *, batch_size: int | None = None, token_budget: int | None = None,
                 shared_prefix: bool = True, forced_tokens: bool = True, logit_verdicts: bool = True,
                 prefix_store: bool = True, continuous: bool = True, store_tokens: int | None = None,
                 step_tokens: int | None = None, fault_injector: Callable[[str, int], None] | None = None):
        import torch

        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1. Given: {batch_size}")
        self.judge = judge
        if judge.grammar_cache is None:  # one cache per loaded judge, so scorers sharing a judge share grammars
            judge.grammar_cache = GrammarCache(judge.model, judge.tokenizer)
        self.grammars: GrammarCache = judge.grammar_cache
        self.shared_prefix, self.forced_tokens, self.logit_verdicts = shared_prefix, forced_tokens, logit_verdicts
        self.continuous = continuous  # a driver's stream goes straight in (else: one run() call per wave)
        self.fault_injector = fault_injector  # tests: raise an out-of-memory error on chosen passes
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
        self._choice_masks: dict[tuple[str, str], tuple] = {}
        self._lock = threading.Lock()  # one run at a time on one model (ascore runs in threads)
        self._oom = (torch.OutOfMemoryError,) if hasattr(torch, "OutOfMemoryError") else (RuntimeError,)

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
            free, _ = torch.cuda.mem_get_info(self.device)
            where, default_rows = f"{free / 2**30:.1f} GiB free on {self.device}", 512
        else:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            where, default_rows = f"{free / 2**30:.1f} GiB free RAM", 64
        # Half of free memory for the KV cache; activations and logits need the rest. Rounded down to a power of two
        # so that the budget, which shapes the batches and is stored in every row, does not drift from run to run
        # with a few MB of free memory (a resumed run must batch as the first run did).
        auto_budget = 1 << max(12, int(free * 0.5 / per_token).bit_length() - 1)
        rows = batch_size or default_rows
        budget = token_budget or auto_budget
        self.free_memory = where  # kept off the rows: it changes from run to run
        why = (f"up to {rows} rows and {budget} cached tokens per batch "
               f"({'given' if batch_size else 'default'} rows; budget "
               f"{'given' if token_budget else 'from half the free memory, rounded down to a power of two'}, "
               f"{per_token} bytes of KV per token)")
        return rows, budget, why

    def describe(self) -> dict:
        return {"engine": "transformers", "max_rows": self.max_rows, "token_budget": self.token_budget,
                "capacity": self.capacity_reason, "step_tokens": self.step_tokens,
                "grammar_backend": f"{BACKEND}: lazy token masks, no per-schema index to precompile",
                "shared_prefix": self.shared_prefix, "forced_tokens": self.forced_tokens,
                "logit_verdicts": self.logit_verdicts, "continuous": self.continuous,
                "prefix_store": self.store.budget if self.store is not None else None, "judge": self.judge.describe()}

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
            allowance = request.max_new_tokens or (max_json_chars(json.loads(request.schema_json), escapes=False) // 3 + 8)
        return self.judge.context_length - len(prompt_ids) - allowance

    def _decoder(self, ids, mask, positions, cache):
        """The decoder stack without the vocabulary projection (applied later, only where a token is read)."""
        decoder = self.judge.model.get_decoder()
        return decoder(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                       **{self._cache_kw: cache})

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
                row = Row(ticket=ticket, request=req, prompt=prompt, prompt_ids=prompt_ids + continuation, cap=0,
                          calls=len(ready), score_from=len(prompt_ids))
                if not continuation:
                    row.fail("schema", "a likelihood request needs a non-empty continuation")
                elif len(row.prompt_ids) > self.judge.context_length:
                    row.fail("context", f"prompt and statement of {len(row.prompt_ids)} tokens exceed the judge's "
                                        f"{self.judge.context_length}-token context; use a shorter text or a "
                                        f"longer-context judge")
                rows.append(row)
                continue
            bound = req.max_new_tokens or (max_json_chars(json.loads(req.schema_json)) + 8)
            room = self.judge.context_length - len(prompt_ids)
            row = Row(ticket=ticket, request=req, prompt=prompt, prompt_ids=prompt_ids, cap=min(bound, room),
                      calls=len(ready))
            if room < MIN_ROOM:
                row.fail("context", f"prompt of {len(prompt_ids)} tokens leaves no room in the judge's "
                                    f"{self.judge.context_length}-token context; use a shorter text or a "
                                    f"longer-context judge")
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
            scheduler = Scheduler(max_rows=self.max_rows, token_budget=self.token_budget,
                                  shared_prefix=self.shared_prefix)
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
                        batch.cache, batch.mask, batch.rows = None, None, []
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
        self._admit(scheduler, batch)
        if not batch.live:
            return
        try:
            self._step(batch)
        except self._oom:
            # Out of memory in a step: the newest half go back to wait, from scratch; one row alone fails.
            self.stats.oom_splits += 1
            if self.device.type == "cuda":
                import torch

                torch.cuda.empty_cache()
            if not scheduler.preempt(batch):
                for row in batch.live:
                    row.fail("memory", OOM_ALONE)
                batch.cache, batch.mask, batch.rows = None, None, []

    def _admit(self, scheduler: Scheduler, batch: Batch) -> None:
        """Prefill the units the scheduler picks and join them to the running batch. Out of memory in a
        prefill: retry with half the units; a single unit waits for the running rows to leave, and fails loudly
        only when it cannot run even alone."""
        chosen = scheduler.schedule(batch)
        while chosen:
            try:
                cache, mask, rows = self._prefill(chosen, joining=bool(batch.rows))
            except self._oom:
                self.stats.oom_splits += 1
                if len(chosen) > 1:
                    half = len(chosen) // 2
                    scheduler.put_back(chosen[half:])
                    chosen = chosen[:half]
                elif len(chosen[0].rows) > 1:  # one unit: its rows in two halves, each prefilling the prefix
                    unit = chosen[0]
                    half = len(unit.rows) // 2
                    scheduler.put_back([Unit(unit.rows[half:], unit.prefix)])
                    chosen = [Unit(unit.rows[:half], unit.prefix)]
                elif batch.rows:
                    scheduler.put_back(chosen)
                    return
                else:
                    for row in chosen[0].rows:
                        row.fail("memory", OOM_ALONE)
                    return
            else:
                batch.join(cache, mask, rows)
                return

    def _stored_cache(self, prefixes: list[list[int]]):
        """A cache holding, for each prefix, the keys and values of its longest stored part, left-padded to a
        common width; its mask; and each stored length. Nothing stored: an empty cache."""
        import torch
        from transformers import DynamicCache

        cache = DynamicCache(config=self.judge.model.config)
        found = [self.store.lookup(p) if self.store is not None else (None, 0) for p in prefixes]
        kept = [n if n >= MIN_SHARED_PREFIX else 0 for _, n in found]
        kept = [min(n, len(p)) for n, p in zip(kept, prefixes)]
        width = max(kept, default=0)
        mask = torch.zeros((len(prefixes), width), dtype=torch.long)
        if width:
            layers = next(kv for kv, n in zip((f[0] for f in found), kept) if n)
            for layer, (k0, v0) in enumerate(layers):
                keys = k0.new_zeros((len(prefixes), k0.shape[1], width, k0.shape[3]))
                values = v0.new_zeros((len(prefixes), v0.shape[1], width, v0.shape[3]))
                for i, ((kv, _), n) in enumerate(zip(found, kept)):
                    if n:
                        keys[i, :, width - n:] = kv[layer][0][0, :, :n]
                        values[i, :, width - n:] = kv[layer][1][0, :, :n]
                cache.update(keys, values, layer)
            for i, n in enumerate(kept):
                mask[i, width - n:] = 1 if n else 0
            self.stats.stored_tokens += sum(kept)
        return cache, mask, kept

    def _store(self, prefix: list[int], cache, row: int, columns) -> None:
        """Copy one row's keys and values at the given columns into the prefix store."""
        if self.store is None or len(prefix) < MIN_SHARED_PREFIX:
            return
        kv = [(layer.keys[row:row + 1, :, columns].clone(), layer.values[row:row + 1, :, columns].clone())
              for layer in cache.layers]
        self.store.add(prefix, kv)

    def _prefill(self, units: list[Unit], joining: bool = True):
        """Each unit's shared prefix once (its stored part from the prefix store, the rest in one batched pass with
        masked holes), then the cache forked into one row per request.
        joining: rows are running already, so the new rows' own prompt remainders get a pass of their own."""
        import torch

        prefixes = [u.prefix for u in units]
        if self.fault_injector:
            self.fault_injector("prefill", sum(len(u.rows) for u in units))
        cache, mask, kept = self._stored_cache(prefixes)
        rests = [p[n:] for p, n in zip(prefixes, kept)]
        if max(len(r) for r in rests):
            ids, new_mask, positions = _holed(rests, kept, self.pad_id)
            mask = torch.cat([mask, new_mask], dim=1)
            self._decoder(ids.to(self.device), mask.to(self.device), positions.to(self.device), cache)
            self.stats.forward_passes += 1
            self.stats.prefill_tokens += sum(len(r) for r in rests)
            for i, (unit, rest) in enumerate(zip(units, rests)):
                if rest:  # a prefix found whole in the store is there already
                    self._store(unit.prefix, cache, i, mask[i].nonzero()[:, 0].to(self.device))
        mask = mask.to(self.device)
        # Fork: row j of unit i reads unit i's cache.
        fork = [i for i, u in enumerate(units) for _ in u.rows]
        if mask.shape[1]:
            select_rows(cache, torch.tensor(fork, device=self.device))
        mask = mask[torch.tensor(fork, device=self.device)]
        rows = [row for unit in units for row in unit.rows]
        starts = [len(unit.prefix) for unit in units for _ in unit.rows]
        # Each row's own rest of the prompt (all but its last token) in a second pass over the new rows only, so
        # the running batch's steps feed one token (plus forced ones) per row instead of padding every row out to
        # the longest prompt remainder.
        rests = [row.prompt_ids[start:row.feed_from] if joining else [] for row, start in zip(rows, starts)]
        if max(len(r) for r in rests):
            ids, rest_mask, positions = _holed(rests, starts, self.pad_id)
            mask = torch.cat([mask, rest_mask.to(self.device)], dim=1)
            self._decoder(ids.to(self.device), mask, positions.to(self.device), cache)
            self.stats.forward_passes += 1
        now = time.perf_counter()
        for row, start, rest in zip(rows, starts, rests):
            row.pending = row.prompt_ids[start + len(rest):]
            row.position = start + len(rest)
            self.stats.prefill_tokens += len(row.prompt_ids) - start  # the prompt's own part
            row.started = now
            row.matcher = self.grammars.matcher(row.request.grammar)
            if self.forced_tokens:
                self._take_forced(row)
        return cache, mask, rows

    def _take_forced(self, row: Row) -> None:
        forced = row.matcher.compute_ff_tokens()
        if forced:
            row.matcher.consume_tokens(forced)
            row.out.extend(forced)
            row.pending.extend(forced)
            row.forced += len(forced)
            self.stats.forced_tokens += len(forced)

    def _step(self, batch: Batch) -> None:
        import torch

        active, cache, mask = batch.rows, batch.cache, batch.mask

        # 2. Masks for the whole batch on the CPU, then one transfer. Finished rows may still hold a slot (see
        # the end of the step): they feed nothing and read nothing.
        live = [i for i, row in enumerate(active) if not row.done]
        bitmask = self.grammars.allocate_bitmask(len(active))
        for i in live:
            self.grammars.fill_bitmask(active[i].matcher, bitmask, i)
        allowed = _unpack(bitmask, self.vocab_size)
        if self.logit_verdicts:
            # A complete grammar allows only the end token: nothing is left to read from the model.
            only_eos = allowed.sum(1) == allowed[:, self.eos_ids].sum(1)
            for i in live:
                if only_eos[i]:
                    active[i].done = True
                    self.stats.skipped_forwards += 1
            live = [i for i in live if not active[i].done]
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
        ids = torch.full((len(active), width), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((len(active), width), dtype=torch.long)
        positions = torch.zeros((len(active), width), dtype=torch.long)
        for i, (row, n) in enumerate(zip(active, fed)):
            ids[i, :n] = torch.tensor(row.pending[:n], dtype=torch.long)
            new_mask[i, :n] = 1
            positions[i, :] = torch.arange(row.position, row.position + width).clamp(max=row.position + n - 1)
        if self.fault_injector:
            self.fault_injector("step", len(active))
        full_mask = torch.cat([mask, new_mask.to(self.device)], dim=1)
        hidden = self._decoder(ids.to(self.device), full_mask, positions.to(self.device), cache).last_hidden_state
        self.stats.forward_passes += 1
        reading = [i for i in live if fed[i] == len(active[i].pending)]
        for i in live:
            active[i].position += fed[i]
            active[i].pending = active[i].pending[fed[i]:]
        picks: list[int] = []
        if reading:
            rows_t = torch.tensor(reading, device=self.device)
            last = torch.tensor([fed[i] - 1 for i in reading], device=self.device)
            # The vocabulary projection only where a token is read: one position per reading row.
            logits = self.judge.model.get_output_embeddings()(hidden[rows_t, last])
            logits = logits[:, :self.vocab_size].float()
            read_allowed = allowed[reading]
            logits = logits.masked_fill(~read_allowed.to(self.device), float("-inf"))
            picks = logits.argmax(dim=-1).tolist()
        # 4. Soft verdicts where the allowed tokens form a closed choice (whitespace-only tokens are neutral).
        # P(yes) is kept at the step whose pick decides the verdict, so each verdict gets exactly one.
        probs = None
        for k, i in enumerate(reading):
            row = active[i]
            choice = row.request.verdict_choice
            if choice is None:
                continue
            yes, no, neutral = self._choice_mask(choice)
            ok = read_allowed[k]
            decisive = bool(yes[picks[k]] or no[picks[k]])
            if decisive and not (ok & ~(yes | no | neutral)).any() and (ok & yes).any() and (ok & no).any():
                if probs is None:
                    probs = torch.softmax(logits, dim=-1).cpu()
                p_yes, p_no = float(probs[k][yes].sum()), float(probs[k][no].sum())
                row.choice_probs.append(p_yes / (p_yes + p_no))
        for k, i in enumerate(reading):
            row, token = active[i], picks[k]
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
                row.fail("cap", f"hit the {row.cap}-token cap before the JSON closed; raw output kept")
        # 5. Compacting the batch copies the whole KV cache, so finished rows keep their slot (fed nothing) until a
        # quarter of the slots are finished, or new rows are admitted.
        batch.mask = full_mask
        dead = sum(r.done for r in active)
        if dead and dead * 4 >= len(active):
            batch.compact()
        else:
            batch.trim()

    def _score_likelihoods(self, rows: list[Row]) -> None:
        """Every likelihood row, group by group (rows that share a prompt prefix, whichever sample they belong to),
        in batches within the row cap and the token budget."""
        for group in split_by_prefix(rows) if self.shared_prefix else [[r] for r in rows]:
            prefix = common_prefix([r.prompt_ids for r in group], min(r.feed_from for r in group))
            size = min(self.max_rows, max(1, self.token_budget // max(len(r.prompt_ids) for r in group)))
            for at in range(0, len(group), size):
                self._likelihood_batch(group[at:at + size], prefix)

    def _likelihood_batch(self, batch: list[Row], prefix: list[int]) -> None:
        """One pass; out of memory: two halves, down to a row that cannot run alone, which fails loudly."""
        try:
            self._likelihood_pass(batch, prefix)
        except self._oom:
            self.stats.oom_splits += 1
            if len(batch) == 1:
                batch[0].fail("memory", OOM_ALONE)
                return
            half = len(batch) // 2
            self._likelihood_batch(batch[:half], prefix)
            self._likelihood_batch(batch[half:], prefix)

    def _likelihood_pass(self, batch: list[Row], prefix: list[int]) -> None:
        import torch

        now = time.perf_counter()
        if self.fault_injector:
            self.fault_injector("likelihood", len(batch))
        cache, _, (kept,) = self._stored_cache([prefix])
        start = len(prefix)
        if start > kept:
            self._decoder(torch.tensor([prefix[kept:]], device=self.device), None,
                          torch.arange(kept, start, device=self.device)[None], cache)
            self.stats.forward_passes += 1
            self.stats.prefill_tokens += start - kept
            self._store(prefix, cache, 0, torch.arange(start, device=self.device))
        if start:
            cache.batch_repeat_interleave(len(batch))
        rests = [r.prompt_ids[start:] for r in batch]
        width = max(len(rest) for rest in rests)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        for i, rest in enumerate(rests):
            ids[i, :len(rest)] = torch.tensor(rest, dtype=torch.long)
        positions = torch.arange(start, start + width)[None].expand(len(batch), -1)
        hidden = self._decoder(ids.to(self.device), None, positions.to(self.device), cache).last_hidden_state
        self.stats.forward_passes += 1
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
            part = picks[at:at + 256]
            rows_t = torch.tensor([p[0] for p in part], device=self.device)
            cols_t = torch.tensor([p[1] for p in part], device=self.device)
            targets = torch.tensor([p[2] for p in part], device=self.device)
            logits = head(hidden[rows_t, cols_t])[:, :self.vocab_size].float()
            logp = (logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)).tolist()
            for (i, _, _), value in zip(part, logp):
                batch[i].logprob_sum += value
                batch[i].logprob_count += 1

    def _choice_mask(self, choice: tuple[str, str]):
        """Tokens whose text (quotes and spaces stripped) starts with the yes / the no character, and the
        whitespace-only tokens a grammar may allow before either."""
        if choice not in self._choice_masks:
            import torch

            stripped = [t.lstrip(' "') for t in self.grammars.token_texts]
            yes = torch.tensor([t.startswith(choice[0]) for t in stripped])
            no = torch.tensor([t.startswith(choice[1]) for t in stripped])
            neutral = torch.tensor([t.strip() == "" and t != "" for t in self.grammars.token_texts])
            self._choice_masks[choice] = (yes, no, neutral)
        return self._choice_masks[choice]

    def _result(self, row: Row) -> StageResult:
        calls = row.calls
        if row.score_from is not None:
            return self._likelihood_result(row, calls)
        tok = self.judge.tokenizer
        body = [t for t in row.out if t not in self.eos_ids]
        text = tok.decode(body, skip_special_tokens=True)
        res = StageResult(request=row.request, value=None, raw_output=text, prompt=row.prompt,
                          tokens_in=len(row.prompt_ids), tokens_out=len(row.out), seconds=0.0,
                          batch_size=calls, error=row.error, error_kind=row.error_kind, cap=row.cap,
                          forced_tokens=row.forced, decoded_tokens=row.decoded, choice_probs=list(row.choice_probs))
        res.seconds = time.perf_counter() - row.started if row.started else 0.0
        if res.error is None:
            from pydantic import ValidationError

            try:
                res.value = parse_output(row.request.schema, text)
            except (ValidationError, ValueError) as exc:
                res.error_kind = "schema"
                res.error = f"output does not match the schema: {str(exc).splitlines()[0]}"
        return res

    def _likelihood_result(self, row: Row, calls: int) -> StageResult:
        res = StageResult(request=row.request, value=None, raw_output=row.request.continuation or "",
                          prompt=row.prompt, tokens_in=len(row.prompt_ids), tokens_out=0, batch_size=calls,
                          error=row.error, error_kind=row.error_kind, cap=0)
        res.seconds = time.perf_counter() - row.started if row.started else 0.0
        if res.error is None:
            n = row.logprob_count
            res.value = Likelihood(mean_logprob=row.logprob_sum / n, tokens=n)
        return res


def _holed(seqs: list[list[int]], starts: list[int], pad_id: int):
    """Token lists as one batch: each left-aligned, masked holes after it, position ids going on from its start
    (holes repeat the last position; they are never attended). Returns ids, mask, positions."""
    import torch

    width = max(len(seq) for seq in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    positions = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (seq, start) in enumerate(zip(seqs, starts)):
        ids[i, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, :len(seq)] = 1
        positions[i] = torch.arange(start, start + width).clamp(max=start + max(len(seq), 1) - 1)
    return ids, mask, positions


def _identity(request: StageRequest) -> tuple:
    """What a request's answer depends on (not which sample or stage asked)."""
    return (json.dumps(request.messages, sort_keys=True), request.schema_json, request.max_new_tokens,
            request.verdict_choice, request.continuation)


def _fail_open(open_rows: dict[int, Row], exc: Exception) -> None:
    """The engine itself raised (not out of memory): every row taken and not answered fails with the error, kind
    "model", so the retry layer reruns it once and the driver never loses a row."""
    message = engine_raised(exc)
    for row in open_rows.values():
        if not row.done:
            row.fail("model", message)


def _unpack(bitmask, vocab_size: int):
    """[rows, words] int32 bitmask -> [rows, vocab] bool."""
    import torch

    shifts = torch.arange(32, dtype=torch.int32)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
