"""The judge's decoder over KV slots: one ragged forward pass, and the vocabulary projection where tokens are read."""

from __future__ import annotations

import inspect
import time
import weakref

import numpy as np
import torch

from offline_sumscore.engine.cpu.attention_kernel import attention_kernel
from offline_sumscore.engine.local.attention_cuda import call_rule
from offline_sumscore.engine.local.device_memory import DeviceMemory, device_memory
from offline_sumscore.engine.local.features import EngineStats, Timing
from offline_sumscore.engine.local.kv_budget import KVBudget
from offline_sumscore.engine.local.kv_slots import KVGeometry, KVSlots
from offline_sumscore.engine.local.lab import LabSettings
from offline_sumscore.engine.local.transfer import to_device


class Passes:
    def __init__(
        self,
        model,
        *,
        max_rows: int,
        stats: EngineStats,
        spares: list[KVSlots] | None = None,
        peaks: dict | None = None,
        lab: LabSettings | None = None,
        memory: DeviceMemory | None = None,
    ):
        """lab: the developer hook's settings (lab.py): a timing hook, the attention kernel on or off. memory: the
        device's (device_memory.py); a bounded one gets a GPU's attention calls, and slots that claim their shapes
        from the engine's KV budget once it is set (budget). peaks: the judge's activation peaks measured before
        (activation_peak), kept across engines."""
        lab = lab or LabSettings()
        self.model, self.max_rows, self.stats, self.on_timing = model, max_rows, stats, lab.on_timing
        self.memory = memory if memory is not None else device_memory(model.device)
        self.budget: KVBudget | None = None  # set by the engine on a bounded device, once it is sized
        self.call_rule = call_rule(self.memory.bounded)
        # The attention kernel where it applies (None: SDPA), and what passes attend with, in words.
        head_dim = KVGeometry.of(model.config, model.dtype).head_dim
        softcap = getattr(model.config, "attn_logit_softcapping", None)  # Gemma-2's
        if self.memory.kind == "emulated":  # as on a GPU: the CPU's kernels stay out
            self.kernel, self.attention = None, f"sdpa (on an {self.memory.describe()})"
        else:
            self.kernel, self.attention = attention_kernel(
                model.device, model.dtype, head_dim, lab.attention_kernel, softcap
            )
        self.spares = spares if spares is not None else []  # the judge's idle KV slots (take_slots)
        self.peaks = peaks if peaks is not None else {}
        # slots taken -> stats.nan_rows then (give_slots); weak, so slots a failed run dropped leave no entry
        self._nan_rows_at_take: weakref.WeakKeyDictionary[KVSlots, int] = weakref.WeakKeyDictionary()
        self.device = model.device
        # transformers 5.24 renamed the decoder's past_key_values argument to cache (the old name is deprecated).
        params = inspect.signature(model.get_decoder().forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._no_mask = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=self.device)  # a pass's masks are its own
        self.logit_cap = getattr(model.config, "final_logit_softcapping", None)  # Gemma-2 and Gemma-3

    def slots(self, rows: int = 0, columns: int = 0) -> KVSlots:
        """A slot set (on a bounded device, its shape claimed from the KV budget: KVBudgetExceeded where it does not
        fit)."""
        return KVSlots(
            self.model.config,
            dtype=self.model.dtype,
            device=self.device,
            rows=rows,
            columns=columns,
            row_limit=self.max_rows,
            budget=self.budget,
            call_rule=self.call_rule,
        )

    def take_slots(self) -> KVSlots:
        """Empty KV slots for a run. On a CPU, the judge's idle ones if it has some, as vLLM allocates its KV cache
        once at start-up: fresh buffers cost their first touch (page faults, 0.4 to 1 GB/s on the 2-core machine:
        zeroing a run's slots took 9% of the ladder's standard workload), and a reused set is zeroed already and
        wide enough. On a bounded device (a GPU) fresh ones, which follow the run's rows from nothing."""
        slots = self.spares.pop() if not self.memory.bounded and self.spares else self.slots()
        slots.empty(row_limit=self.max_rows)
        self._nan_rows_at_take[slots] = self.stats.nan_rows
        return slots

    def fresh_slots(self, slots: KVSlots) -> KVSlots:
        """In place of slots from take_slots, an empty set that starts from nothing (the old one freed): given back
        as they would have been."""
        taken_at = self._nan_rows_at_take.pop(slots, self.stats.nan_rows)
        slots.free()
        fresh = self.slots()
        fresh.empty(row_limit=self.max_rows)
        self._nan_rows_at_take[fresh] = taken_at
        return fresh

    def give_slots(self, slots: KVSlots) -> None:
        """Slots from take_slots back: on a CPU to the judge, for the next run; on a bounded device freed, their
        claim on the budget with them. Not kept after a pass that came out NaN since they were taken: their keys may
        be NaN in columns the next run's rows attend without owning (a masked key weighs 0, but 0 x NaN is NaN)."""
        taken_at = self._nan_rows_at_take.pop(slots, None)
        if self.memory.bounded:
            slots.free()
        elif taken_at == self.stats.nan_rows:
            self.spares.append(slots)

    def activation_peak(self, tokens: int, reads: int, vocab: int) -> int:
        """The most memory one full pass takes beyond its keys and values, measured (as vLLM profiles its model
        before sizing its cache): `tokens` prompt tokens in rows of at most the model's context, fresh prompts as a
        prefill pass is, and the vocabulary projection at `reads` of them, on slots of their own. In bytes; 0
        where the device cannot tell. Measured once per judge and pass: a second engine on the same judge reads it."""
        # The same model, pass and way of attending allocate the same, whatever memory is free around them.
        attends = "sdpa" if self.kernel is None else "kernel"
        key = (tokens, reads, vocab, attends, self.call_rule, self.memory.kind, str(self.model.dtype), str(self.device))
        if key not in self.peaks:
            self.peaks[key] = self._measure_peak(tokens, reads, vocab)
        return self.peaks[key]

    def _measure_peak(self, tokens: int, reads: int, vocab: int) -> int:
        context = int(getattr(self.model.config, "max_position_embeddings", 0) or tokens)
        lengths = [min(context, tokens - at) for at in range(0, tokens, context)]
        counted = self.stats.forward_passes  # the profile is no pass of any run's
        with torch.inference_mode(), self.memory.tracking(), self.memory.measuring() as found:
            slots = KVSlots(
                self.model.config, dtype=self.model.dtype, device=self.device, exact=True, call_rule=self.call_rule
            )
            slots.reserve(len(lengths), max(lengths))
            slots.place(len(lengths))
            held = sum(b.numel() * b.element_size() for b in slots.key_buffers + slots.value_buffers)
            feeds = [[t % vocab for t in range(n)] for n in lengths]
            hidden, _ = self.run(slots, feeds, [0] * len(lengths), kind="profile", commit=False)
            self.logits(hidden, list(range(min(reads, tokens))), vocab)
            slots.free()  # now, not when a reference cycle is next collected
            del hidden
        self.stats.forward_passes = counted
        return max(0, (found["peak"] or 0) - held)

    def run(self, slots: KVSlots, feeds: list[list[int]], starts: list[int], *, kind: str, commit: bool = True):
        """One forward pass of the decoder: slot r feeds the tokens feeds[r] (none: []), at positions from
        starts[r] on, all of them as one flat [1, tokens] sequence, each attending its own row
        (attention.ragged_attention): no holes anywhere. Returns the hidden states [tokens, hidden] and each slot's
        first token in them. Raises with the slots as they were. kind names the pass for the timing hook."""
        started = time.perf_counter()
        layout = slots.begin([len(f) for f in feeds])
        layout.kernel = self.kernel
        ids = np.fromiter((t for f in feeds for t in f), dtype=np.int64, count=layout.tokens)[None]
        positions = (np.repeat(np.asarray(starts, dtype=np.int64), layout.counts) + layout.step_of)[None]
        try:
            hidden = self.model.get_decoder()(
                input_ids=to_device(torch.from_numpy(ids), self.device),
                attention_mask=self._no_mask,
                position_ids=to_device(torch.from_numpy(positions), self.device),
                use_cache=True,
                ragged_pass=layout,
                **{self._cache_kw: slots},
            ).last_hidden_state[0]
        except BaseException:
            slots.abort()
            raise
        self.stats.forward_passes += 1
        if commit:
            slots.commit()
        if self.on_timing is not None and kind != "profile":
            rows, widest = sum(1 for f in feeds if f), max(map(len, feeds), default=0)
            seconds = time.perf_counter() - started
            self.on_timing(Timing(kind, seconds, rows, widest, layout.tokens, *layout.cells))
        return hidden, layout.offsets

    def logits(self, hidden, at: list[int], vocab: int):
        """The vocabulary projection at these places of a pass's hidden states only: float32 [len(at), vocab]."""
        where = to_device(torch.tensor(at, dtype=torch.long), self.device)
        logits = self.model.get_output_embeddings()(hidden.index_select(0, where))[:, :vocab].float()
        if self.logit_cap:  # as the model's own head applies it: tanh(logits / cap) x cap
            logits = torch.tanh(logits / self.logit_cap) * self.logit_cap
        return logits
