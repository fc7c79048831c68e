"""TransformersEngine: stage requests answered by a local judge under JSON grammars, in one continuous stream.

The loop: take whatever the driver has ready (identical requests merged, likelihood requests scored at once, the
rest waiting in the scheduler), admit waiting units while the row cap and the token budget allow, run one step
over the running batch, and hand back every row that finished. Finished rows leave after every step and waiting
rows take their slots, so one long generation never holds a whole batch (iteration-level batching).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from offline_sumscore.core.errors import Failure, ModelLoadError, check_count
from offline_sumscore.core.schemas import Likelihood
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import DEFAULT_IN_FLIGHT, Engine, Feed, run_as_stream
from offline_sumscore.engine.cpu.host_heap import HeapTrimmer
from offline_sumscore.engine.grammar import BACKEND, GrammarCompiler
from offline_sumscore.engine.judge import Judge
from offline_sumscore.engine.local.admission import Admission, rows_for
from offline_sumscore.engine.local.attention import check_attention, register_attention
from offline_sumscore.engine.local.capacity import capacity, default_pass_tokens, default_rows
from offline_sumscore.engine.local.device_memory import device_memory, is_out_of_memory
from offline_sumscore.engine.local.drafts import Drafter
from offline_sumscore.engine.local.features import EngineStats
from offline_sumscore.engine.local.forward import Passes
from offline_sumscore.engine.local.kv_budget import KVBudget
from offline_sumscore.engine.local.kv_slots import KVGeometry
from offline_sumscore.engine.local.lab import LabSettings
from offline_sumscore.engine.local.likelihood import LikelihoodPath
from offline_sumscore.engine.local.memory import MemoryGuard, fail_alone
from offline_sumscore.engine.local.prefix_store import PrefixStore
from offline_sumscore.engine.local.rows import Row
from offline_sumscore.engine.local.sampling import Sampler
from offline_sumscore.engine.local.scheduler import Batch, Scheduler
from offline_sumscore.engine.local.step import Stepper
from offline_sumscore.engine.retry import engine_raised


class TransformersEngine(Engine):
    """Answers StageRequests on a loaded Judge: run(requests) -> results in the same order, or stream(feed)."""

    def __init__(
        self,
        judge: Judge,
        *,
        batch_size: int | None = None,
        token_budget: int | None = None,
        device_share: float = 1.0,
        lab: LabSettings | None = None,
    ):
        """batch_size and token_budget: rows and cached tokens a batch may hold (None: from free memory, see
        capacity.py); device_share: the share of the device this engine may fill (Ray actors sharing a GPU). lab:
        what the ladder and the engine's tests switch (features, the prefix store's budget, a timing hook), the one
        developer hook (lab.py); None: every feature on."""
        if batch_size is not None:
            check_count("batch_size", batch_size)
        if not 0 < device_share <= 1:
            raise ValueError(
                f"device_share must be in (0, 1]: the share of the device this engine may fill. Given: {device_share}"
            )
        # Ragged passes attend with ours (attention.ragged_attention), whatever the model was loaded with; a model
        # whose attention it would compute wrongly is refused here (the loader refused it before its weights).
        check_attention(judge.model.config)
        settings = lab or LabSettings()
        features = settings.features
        self.judge, self.features, self.device_share = judge, features, device_share
        self.grammars: GrammarCompiler = judge.grammars()
        self.device = judge.model.device
        self.device_memory = device_memory(self.device)  # a GPU's, an emulated one's, or the host's
        self.device_memory.register(judge.model)  # the weights count, as torch.cuda.mem_get_info counts them
        self.max_rows = batch_size or default_rows(self.device_memory)
        self.stats = EngineStats()
        self.loaded_attention = judge.loaded_attention
        judge.model.set_attn_implementation(register_attention())
        self.attention = judge.model.config._attn_implementation
        self.memory = MemoryGuard(self.device_memory, self.stats)
        self.heap = HeapTrimmer(self.stats) if self.device.type == "cpu" else None
        self.passes = Passes(
            judge.model,
            max_rows=self.max_rows,
            stats=self.stats,
            spares=judge.spare_slots,
            peaks=judge.activation_peaks,
            lab=settings,
            memory=self.device_memory,
        )
        self.sampler = Sampler(
            judge,
            self.grammars,
            features=features,
            stats=self.stats,
            max_rows=self.max_rows,
            on_timing=settings.on_timing,
            pick_kernel=settings.pick_kernel and self.device_memory.kind != "emulated",
        )
        self._size(batch_size, token_budget, settings)
        self.drafter = Drafter(
            enabled=features.drafts,
            forced_tokens=features.forced_tokens,
            gpu=self.device_memory.bounded,
            eos_ids=self.sampler.eos_ids,
        )
        self.admission = Admission(self.sampler, self.store, self.memory, self.stats)
        self.stepper = Stepper(
            self.passes, self.sampler, self.drafter, self.store, self.stats, pass_tokens=self.capacity.pass_tokens
        )
        self.likelihood = LikelihoodPath(
            self.passes,
            self.store,
            self.memory,
            self.stats,
            features=features,
            max_rows=self.max_rows,
            token_budget=self.token_budget,
            pass_tokens=self.capacity.pass_tokens,
            vocab_size=self.sampler.vocab_size,
        )
        self._lock = threading.Lock()  # one run at a time on one model (ascore runs in threads)

    def _size(self, batch_size: int | None, token_budget: int | None, settings) -> None:
        """The token budgets (capacity.py) and the prefix store. On a bounded device: a full pass measured first, then
        the KV budget the slots claim from and the store's pool, allocated now, both inside the device's memory."""
        memory, model = self.device_memory, self.judge.model
        per_pass = settings.pass_tokens or default_pass_tokens(memory)
        with memory.tracking():
            self.capacity = capacity(
                model,
                memory,
                rows=self.max_rows,
                token_budget=token_budget,
                device_share=self.device_share,
                pass_tokens=per_pass,
                given_rows=batch_size is not None,
                given_pass=settings.pass_tokens is not None,
                activation_peak=lambda: self.passes.activation_peak(per_pass, self.max_rows, self.sampler.vocab_size),
            )
            self.token_budget = self.capacity.token_budget
            geometry = KVGeometry.of(model.config, model.dtype)
            if self.capacity.bounded:
                self.passes.budget = KVBudget.holding(self.token_budget, geometry)
            # Prefixes kept across steps and calls: on a CPU a quarter of the batch's token budget, so the store can
            # never crowd out the running batch; on a bounded device its own share of the KV memory.
            store = settings.store_tokens or self.capacity.store_tokens or self.token_budget // 4
            self.store = PrefixStore(store if self.features.prefix_store else 0)
            if self.capacity.bounded:
                try:
                    self.store.allocate(geometry, model.dtype, self.device)
                except Exception as exc:  # noqa: BLE001 - only running out of memory is said in these words
                    if not is_out_of_memory(exc):
                        raise
                    raise ModelLoadError(
                        f"the prefix store's pool of {store} tokens could not be allocated on the "
                        f"{memory.describe()} ({str(exc).splitlines()[0]}): its free memory fell after the engine "
                        "measured it; another process may be using the device"
                    ) from None

    def describe(self) -> dict:
        f = self.features
        return {
            "engine": "transformers",
            "max_rows": self.max_rows,
            "token_budget": self.token_budget,
            "pass_tokens": self.capacity.pass_tokens,
            "capacity": self.capacity.reason,
            "device_memory": self.device_memory.kind,  # cpu, cuda, or emulated (OFFLINE_SUMSCORE_DEVICE_MEMORY)
            "attention_calls": self.passes.call_rule.name,  # how SDPA's calls are cut (attention_cuda.py)
            "device_share": self.device_share,
            "attention": self.attention,  # ragged passes attend with ours, whatever the model was loaded with
            "attention_kernel": self.passes.attention,  # the passes' attention kernel, or SDPA and why
            "pick_kernel": self.sampler.picks_on,  # the picks' kernel, or torch's operators and why
            "loaded_attention": self.loaded_attention,
            "grammar_backend": f"{BACKEND}: lazy token masks, no per-schema index to precompile",
            "shared_prefix": f.shared_prefix,
            "forced_tokens": f.forced_tokens,
            "logit_verdicts": f.logit_verdicts,
            "continuous": f.continuous,
            "prefix_store": self.store.budget or None,
            "drafts": {"tokens": self.drafter.tokens, "budget": self.drafter.budget} if self.drafter.tokens else None,
            "judge": dict(self.judge.describe(), runtime="local"),  # which engine answered (build.resolve)
        }

    def streams_natively(self) -> bool:
        return self.features.continuous

    def in_flight(self) -> int:
        """On a GPU a quarter of the row cap (128 samples at 512 rows: a sample holds a few rows at a time, up to a
        dozen at its widest wave), so that live rows reach the cap; on a CPU the contract's default, which fills a
        CPU's batch."""
        return max(DEFAULT_IN_FLIGHT, self.max_rows // 4) if self.capacity.bounded else DEFAULT_IN_FLIGHT

    def spare_tokens(self, request: StageRequest) -> int:
        return self.judge.spare_tokens(request)

    # -- the loop ---------------------------------------------------------------------------------------------
    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        return run_as_stream(self, requests)

    def stream(self, feed: Feed) -> None:
        """Answer a stream: take what is ready, answer what finishes, after every step. A sample's next wave joins
        the moment its own answers are in, so no sample waits for another's slow row. Every turn of the loop makes
        progress or fails rows by name (ProgressWatch): a stream cannot loop for ever."""
        import torch

        with self._lock, torch.inference_mode(), self.device_memory.tracking():
            started = time.perf_counter()
            scheduler = Scheduler(
                max_rows=self.max_rows,
                token_budget=self.token_budget,
                shared_prefix=self.features.shared_prefix,
                slot_bound=self.capacity.bounded,
            )
            batch = Batch(self.passes.take_slots())
            open_rows: dict[int, Row] = {}  # ticket -> row taken and not yet answered
            twins, watch = Twins(), ProgressWatch()
            try:
                while True:
                    ready = feed.take()
                    if ready:
                        self._take(twins.fresh(ready), open_rows, scheduler, batch)
                    elif self.likelihood.deferred and not batch.live:  # nothing runs beside them now: run or fail
                        self._score(self.likelihood.take_deferred(), open_rows, batch)
                    elif not scheduler.waiting and not batch.live:
                        break
                    else:
                        batch = self._advance(scheduler, batch, open_rows)
                    self._answer(feed, open_rows, twins)
                    if watch.stalled(self.stats.forward_passes, len(open_rows), len(scheduler.waiting), batch.released):
                        _fail_open(open_rows, RuntimeError(watch.message()))
                        scheduler.waiting.clear()
                        self.likelihood.deferred.clear()
                        batch = self._fresh(batch)
                        self._answer(feed, open_rows, twins)
                    if self.heap is not None:
                        self.heap.after_step()
            finally:
                self.passes.give_slots(batch.cache)
                self.stats.seconds += time.perf_counter() - started

    def _fresh(self, batch: Batch) -> Batch:
        """An empty batch after every open row failed: the old one's slots go back first (on a bounded device, their
        claim on the KV budget with them)."""
        self.passes.give_slots(batch.cache)
        return Batch(self.passes.take_slots())

    def _take(self, fresh, open_rows: dict[int, Row], scheduler: Scheduler, batch: Batch) -> None:
        """New requests become rows: likelihood rows are scored at once, the others wait to be admitted."""
        rows = rows_for(self.judge, fresh)
        open_rows.update((r.ticket, r) for r in rows)
        self._score([r for r in rows if not r.done and r.score_from is not None], open_rows, batch)
        scheduler.add([r for r in rows if not r.done])

    def _score(self, rows: list[Row], open_rows: dict[int, Row], batch: Batch) -> None:
        """Likelihood rows, scored now; on a bounded device those that do not fit beside the running batch wait for
        it to shrink (LikelihoodPath.deferred)."""
        try:
            self.likelihood.score(rows, room_later=bool(batch.live))
        except Exception as exc:  # noqa: BLE001 - recorded in each row, retried by the layer above
            _fail_open(open_rows, exc)

    def _advance(self, scheduler: Scheduler, batch: Batch, open_rows: dict[int, Row]) -> Batch:
        """Admit, then one step over the running rows; returns the batch (a fresh one where the engine raised and
        every open row failed). Out of memory anywhere in the step (a layer, the vocabulary projection, a slot set
        that must grow) left the slots and rows as they were: the newest half go back to wait, from scratch, and
        nothing is admitted until a running row leaves; one row alone fails, naming what it needed. Likelihood rows
        deferred for want of room are tried again whenever rows leave."""
        released = batch.released
        try:
            self.admission.admit(scheduler, batch)
            if batch.live and not self.memory.attempt(self.stepper.step, batch):
                if scheduler.preempt(batch):
                    self.admission.wait_below(len(batch.live))
                else:
                    fail_alone(batch.live, self.memory.alone())
                    batch.release_finished()
        except Exception as exc:  # noqa: BLE001 - every open row fails, kind "model"
            _fail_open(open_rows, exc)
            scheduler.waiting.clear()
            self.likelihood.deferred.clear()
            return self._fresh(batch)
        if self.likelihood.deferred and batch.released != released:
            self._score(self.likelihood.take_deferred(), open_rows, batch)
        return batch

    def _answer(self, feed: Feed, open_rows: dict[int, Row], twins: Twins) -> None:
        for ticket in [t for t, r in open_rows.items() if r.done]:
            row = open_rows.pop(ticket)
            result = self._result(row)
            if result.ok and row.score_from is None:
                self.drafter.learn(row)
            feed.give(ticket, result)
            for other, request in twins.answered(ticket):
                feed.give(other, replace(result, request=request, cached=True))

    # -- results ----------------------------------------------------------------------------------------------
    def _result(self, row: Row) -> StageResult:
        likelihood = row.score_from is not None
        text = row.request.continuation or ""
        if not likelihood:
            body = [t for t in row.out if t not in self.sampler.eos_ids]
            text = self.judge.tokenizer.decode(body, skip_special_tokens=True)
        res = StageResult(
            request=row.request,
            value=None,
            raw_output=text,  # read_reply below keeps it too; a failed row keeps it here
            prompt=row.prompt,
            tokens_in=len(row.prompt_ids),
            tokens_out=len(row.out),
            seconds=time.perf_counter() - row.started if row.started else 0.0,
            batch_size=row.calls,
            error=row.error,
            error_kind=row.error_kind,
            cap=row.cap,
            forced_tokens=row.forced,
            decoded_tokens=row.decoded,
            choice_probs=list(row.choice_probs),
        )
        if res.error is not None:
            return res
        if likelihood:
            res.value = self._likelihood(row)
            return res
        return res.read_reply(text)

    def _likelihood(self, row: Row) -> Likelihood:
        texts = self.grammars.token_texts
        return Likelihood(
            mean_logprob=sum(row.logprobs) / len(row.logprobs),
            tokens=len(row.logprobs),
            token_texts=[texts[t] for t in row.prompt_ids[row.score_from :]],
            token_logprobs=row.logprobs,
            expected_texts=[texts[t] if t < len(texts) else "" for t, _ in row.expected],
            expected_logprobs=[lp for _, lp in row.expected],
        )


class ProgressWatch:
    """The loop's guard against a stream that never ends: every turn must run a pass, answer a row, admit or send back
    a unit, or free a slot. STALL_TURNS turns in a row with none of these is a bug in the engine, never a state to
    wait out: the open rows fail, naming it, rather than wait for ever (an out-of-memory livelock once did exactly
    that, silently)."""

    STALL_TURNS = 200

    def __init__(self):
        self.last, self.same = None, 0

    def stalled(self, *state) -> bool:
        self.same = self.same + 1 if state == self.last else 0
        self.last = state
        return self.same >= self.STALL_TURNS

    def message(self) -> str:
        return (
            f"the engine made no progress in {self.STALL_TURNS} turns of its loop (no pass, no row answered, admitted "
            "or freed): a bug, reported rather than waited on; please report it with the rows that failed"
        )


class Twins:
    """Identical requests in flight (a source's questions, asked for each of its summaries), by StageRequest.key:
    computed once, since greedy decoding would give every copy the same answer."""

    def __init__(self):
        self.computing: dict[str, int] = {}  # key -> the ticket computing it
        self.waiting: dict[int, tuple[str, list[tuple[int, StageRequest]]]] = {}  # that ticket -> key, its twins

    def fresh(self, ready: list[tuple[int, StageRequest]]) -> list[tuple[int, StageRequest]]:
        """The requests not already in flight; the others wait for their twin's answer."""
        fresh = []
        for ticket, request in ready:
            key = request.key
            if key in self.computing:
                self.waiting[self.computing[key]][1].append((ticket, request))
            else:
                self.computing[key], self.waiting[ticket] = ticket, (key, [])
                fresh.append((ticket, request))
        return fresh

    def answered(self, ticket: int) -> list[tuple[int, StageRequest]]:
        """The twins waiting on this ticket's answer."""
        key, twins = self.waiting.pop(ticket)
        del self.computing[key]
        return twins


def _fail_open(open_rows: dict[int, Row], exc: Exception) -> None:
    """The engine itself raised (not out of memory): every row taken and not answered fails with the error, kind
    "model", so the retry layer reruns it once and the driver never loses a row."""
    message = engine_raised(exc)
    for row in open_rows.values():
        if not row.done:
            row.fail(Failure.MODEL, message)
