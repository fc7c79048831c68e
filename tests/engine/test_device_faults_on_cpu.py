"""Faults a GPU run would meet, made visible on the CPU with the real embedded judge.

- CUDA's attention kernels can return NaN for a query row that may attend to no position; the engine's attention
  is run here with exactly that behaviour, and its rows must not change under it (no query row ever is blind).
- Out of memory can strike inside a forward pass (in any decoder layer, or in the vocabulary projection after it);
  it is raised here from hooks on a layer and on the head, in a step (where admitted rows compute their prompts, as
  running rows decode) and in a likelihood pass; an admission that finds no room is refused and tried again.
- Every synchronisation with the device stalls a GPU's queue: the operations that would synchronise are counted
  per decoding step.
- A step must not copy the cache: no concatenation of keys and values, no expansion of them per query head.
"""

import time
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers.integrations import sdpa_attention

from offline_sumscore.engine.local import TransformersEngine, attention
from offline_sumscore.engine.local.lab import LabSettings
from offline_sumscore.engine.local.plan import Feed, StepPlan
from offline_sumscore.engine.local.sampling import unpack
from offline_sumscore.scorers.stages.claims import claims_list
from tests.engine.test_engine_on_embedded_judge import mix, same

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def reference(judge):
    return TransformersEngine(judge).run(mix())


# -- rows that attend to nothing ----------------------------------------------------------------------------
def test_no_query_row_ever_attends_to_nothing_so_nan_attention_changes_no_row(judge, reference, monkeypatch):
    blind, calls = [], []

    def nan_on_blind_rows(query, key, value, mask, scaling, group, softcap=None):
        """The engine's attention call, except that a query row whose mask allows no key gets NaN, as CUDA's
        kernels can give."""
        rows, heads, queries, dim = query.shape
        stacked = query.reshape(rows, heads // group, group * queries, dim)
        out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
        calls.append(1)
        allowed = mask if mask.dtype == torch.bool else mask == 0  # the engine's masks are additive (0 / -inf)
        nothing = ~allowed.any(-1)  # [rows, 1, group x queries]
        if nothing.any():
            blind.append(int(nothing.sum()))
            out = out.masked_fill(nothing[..., None], float("nan"))
        return out.reshape(rows, heads, queries, dim)

    monkeypatch.setattr(attention, "_gqa", nan_on_blind_rows)
    engine = TransformersEngine(judge, lab=LabSettings(attention_kernel=False))  # SDPA's calls and masks, as on a GPU
    results = engine.run(mix())
    assert calls and blind == []
    same(reference, results)


# -- out of memory anywhere in a pass -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "where,phase", [("layer", "step"), ("head", "step"), ("layer", "likelihood"), ("head", "likelihood")]
)
def test_out_of_memory_from_a_layer_or_the_head_in_any_pass_is_recovered(judge, reference, where, phase):
    engine = TransformersEngine(judge)
    state = {"phase": None, "raised": 0}

    def tracked(name, original):
        def wrapped(*args, **kwargs):
            state["phase"] = name
            try:
                return original(*args, **kwargs)
            finally:
                state["phase"] = None

        return wrapped

    engine.stepper.step = tracked("step", engine.stepper.step)
    engine.likelihood.one_pack = tracked("likelihood", engine.likelihood.one_pack)
    layers = judge.model.get_decoder().layers
    module = layers[len(layers) // 2] if where == "layer" else judge.model.get_output_embeddings()

    def hook(_module, args, kwargs):
        hidden = (
            args[0] if args else kwargs["hidden_states"]
        )  # [1, tokens, hidden] in a layer, [reads, hidden] at the head
        if state["phase"] == phase and hidden.shape[-2] > 1 and not state["raised"]:
            state["raised"] += 1
            raise torch.OutOfMemoryError(f"injected in the {where} during {phase}")

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        results = engine.run(mix())
    finally:
        handle.remove()
    assert state["raised"] == 1 and engine.stats.oom_splits == 1
    same(reference, results)


def test_an_admission_that_runs_out_of_memory_waits_for_running_rows_to_leave(judge, reference):
    engine = TransformersEngine(judge, batch_size=4)
    original, counts = engine.admission.place, {"tries": 0, "steps": 0}
    step = engine.stepper.step

    def place(units, batch):
        if batch.live:  # no room for new rows while any run: only an empty batch admits
            counts["tries"] += 1
            raise torch.OutOfMemoryError("injected: no room next to the running rows")
        return original(units, batch)

    def counted_step(batch):
        counts["steps"] += 1
        return step(batch)

    engine.admission.place, engine.stepper.step = place, counted_step
    results = engine.run(mix())
    same(reference, results)
    # Each refused admission is tried again only once a running row has left, not at every step.
    finished_while_running = sum(1 for r in results if r.request.continuation is None)
    assert counts["tries"] <= 3 * finished_while_running < counts["steps"]


# -- host work and synchronisations per step ------------------------------------------------------------------
SYNCING = {
    torch.Tensor.tolist,
    torch.Tensor.item,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.cuda,
}


class CountSyncs(TorchFunctionMode):
    """Counts the tensor operations that make the host wait for a GPU (reads of values, data-dependent shapes)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SYNCING:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_a_decoding_step_synchronises_with_the_device_once(judge, reference):
    engine = TransformersEngine(judge)
    step, per_step = engine.stepper.step, []

    def counted(batch):
        with CountSyncs() as mode:
            step(batch)
        per_step.append(mode.count)

    engine.stepper.step = counted
    same(reference, engine.run(mix()))
    assert len(per_step) > 10 and max(per_step) == 1


def test_a_step_neither_concatenates_nor_expands_the_cache(judge, reference, monkeypatch):
    calls = {"cat": 0, "repeat_kv": 0}
    repeat_kv = sdpa_attention.repeat_kv

    def counted_repeat(*args, **kwargs):
        calls["repeat_kv"] += 1
        return repeat_kv(*args, **kwargs)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counted_repeat)

    class CountCat(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.cat:  # along the sequence axis of [rows, heads, columns, dim] tensors: a cache grows
                tensors, dim = args[0], (args[1] if len(args) > 1 else (kwargs or {}).get("dim", 0))
                if tensors[0].dim() == 4 and dim in (2, -2):
                    calls["cat"] += 1
            return func(*args, **(kwargs or {}))

    engine = TransformersEngine(judge)
    step = engine.stepper.step

    def counted(batch):
        with CountCat():
            step(batch)

    engine.stepper.step = counted
    same(reference, engine.run(mix()))
    assert calls == {"cat": 0, "repeat_kv": 0}


def test_host_work_per_step_at_512_rows_takes_less_than_the_vocabulary_unpack_it_replaced(judge):
    """The step's host work (grammar masks for every row and the finished-row check) at 512 rows, against the old
    per-step unpack of the bitmask to a rows x vocabulary boolean, measured side by side (best of 3)."""
    from offline_sumscore.core import schemas

    engine = TransformersEngine(judge)
    grammar = schemas.grammar_of(claims_list(3, 50))
    rows = [SimpleNamespace(matcher=engine.grammars.matcher(grammar)) for _ in range(512)]
    live = list(range(512))
    sampler = engine.sampler

    def best(fn):
        times = []
        for _ in range(3):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return min(times)

    plan = StepPlan([Feed(i, [0], None, i) for i in live], [[0] for _ in live], [0 for _ in live])
    now = best(lambda: sampler.masks(rows, plan))
    bitmask = sampler._bitmask[:512]

    def old():
        allowed = unpack(bitmask, sampler.vocab_size)
        return allowed.sum(1) == allowed[:, sampler.eos_ids].sum(1)

    before = best(old)
    assert now < before, (now, before)


def test_nan_logits_fail_the_row_loudly_and_are_never_read_as_a_verdict(judge):
    engine = TransformersEngine(judge)
    requests = [r for r in mix() if r.stage == "coverage"]

    def poison(_module, _args, output):
        return torch.full_like(output, float("nan"))

    handle = judge.model.get_output_embeddings().register_forward_hook(poison)
    try:
        results = engine.run(requests)
    finally:
        handle.remove()
    assert all(r.error_kind == "model" and "NaN" in r.error and not r.choice_probs for r in results)
    assert engine.stats.nan_rows == len(requests)


# -- a grammar fill that fails after the pass -----------------------------------------------------------------
def test_a_mask_fill_that_raises_after_the_pass_fails_its_rows_loudly_and_the_run_goes_on(judge, reference):
    """A grammar fill that raises after the pass leaves the cache as it was (the pass is not committed): the rows in
    flight fail naming the error, and every other row comes out as it does in a run without the fault."""
    engine = TransformersEngine(judge)
    fills, fill = [], engine.sampler.masks

    def fails_third(rows, plan):
        fills.append(1)
        if len(fills) == 3:
            raise RuntimeError("the grammar's fill failed")
        return fill(rows, plan)

    engine.sampler.masks = fails_third
    results = engine.run(mix())
    failed = [r for r in results if not r.ok]
    assert failed and all("the grammar's fill failed" in r.error for r in failed)
    kept = [(a, b) for a, b in zip(reference, results) if b.ok]
    assert kept
    same([a for a, _ in kept], [b for _, b in kept])
