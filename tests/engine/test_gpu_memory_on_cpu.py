"""The engine's GPU branches on the CPU, with the real embedded judge, under OFFLINE_SUMSCORE_DEVICE_MEMORY: the
engine sizes, grows and allocates as on a GPU with that much memory (the judge's weights included), and the emulated
device refuses any allocation past it with torch.OutOfMemoryError, as CUDA's allocator does.

The two hangs a review of the CUDA branches found, each a test here: a long document beside short rows under a
memory that cannot hold them all (the slots grew by allocating new buffers before freeing the old, and the rows sent
back after the failure were admitted straight back to the same allocation, for ever), and an out-of-memory error
after a step's commit (its rows were left computed with nothing pending, and the stream never ended). Every run here
counts its steps and stops the test past a bound: a hang fails, it never hangs the suite.
"""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from offline_sumscore.core.errors import ModelLoadError
from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.local import TransformersEngine, prefix_store
from offline_sumscore.engine.local.kv_slots import KVSlots
from offline_sumscore.engine.local.scheduler import planned_width
from offline_sumscore.scorers.stages.verdict import statement_prompt, yes_no_verdict
from tests.engine.test_engine_on_embedded_judge import mix, same

pytestmark = pytest.mark.model
SWITCH = "OFFLINE_SUMSCORE_DEVICE_MEMORY"
WIDE = 2048  # MiB: the weights' 513 and room for every row of mix() at once
NARROW = 1000  # MiB: a long document and a few short rows, not all of them
TINY = 850  # MiB: not even the long document alone


class Hung(BaseException):
    """A stream past its bound of steps (a BaseException: the engine's own handlers must not catch it)."""


def bounded(engine: TransformersEngine, limit: int) -> dict:
    """Counts the engine's steps and raises Hung past `limit`."""
    steps, step = {"n": 0}, engine.stepper.step

    def counted(batch):
        steps["n"] += 1
        if steps["n"] > limit:
            raise Hung(f"{limit} steps and the stream has not ended")
        return step(batch)

    engine.stepper.step = counted
    return steps


@pytest.fixture(scope="module")
def gpu_judge():
    """The embedded judge loaded as on a GPU: plain modules, none of the CPU's kernels."""
    from offline_sumscore.engine.judge import load_judge

    before = os.environ.get(SWITCH)
    os.environ[SWITCH] = str(WIDE)
    try:
        judge = load_judge()
    finally:
        os.environ.pop(SWITCH) if before is None else os.environ.__setitem__(SWITCH, before)
    assert "emulated GPU" in judge.decisions["device_memory"] and "cpu_gemm" not in judge.decisions
    yield judge
    # Its weights map the judge's file, as a GPU judge's never would on the CPU: gone before the next module's checks
    # of what the packed judge maps (engines here hold it in reference cycles, through their patched steps).
    del judge
    gc.collect()


def engine_on(judge, mib: int, monkeypatch) -> TransformersEngine:
    monkeypatch.setenv(SWITCH, str(mib))
    engine = TransformersEngine(judge)
    described = engine.describe()
    assert described["device_memory"] == "emulated" and described["attention_calls"] == "gpu"
    assert described["attention_kernel"].startswith("sdpa") and described["pick_kernel"].startswith("torch")
    assert engine.max_rows == 512 and engine.in_flight() == 128  # a GPU's defaults: a quarter of the rows in flight
    return engine


def one_source() -> list:
    """mix()'s rows of one document: every kind of pass the injections need (generated lists, verdicts, likelihoods),
    in half the time."""
    return [r for r in mix() if r.sample_id == "a"]


@pytest.fixture(scope="module")
def reference(gpu_judge):
    mp = pytest.MonkeyPatch()
    try:
        return engine_on(gpu_judge, WIDE, mp).run(one_source())
    finally:
        mp.undo()


# -- a long document among short rows -------------------------------------------------------------------------
SHORT = "The city council of Lindford voted on Tuesday to build a new public library on Mill Street."
LONG = " ".join(
    f"Heavy rain flooded the river town of Ostby on day {k}, and about {200 + k} homes were evacuated while schools "
    "stayed shut."
    for k in range(115)
)


def verdict(i: int, source: str) -> StageRequest:
    return StageRequest(
        f"s{i}",
        "support",
        tuple(statement_prompt(source, f"Claim number {i} is true.", with_reason=True)),
        yes_no_verdict(30),
        verdict_choice=("Y", "N"),
    )


class LateFeed:
    """Ten short rows, then the long document while they run, then twenty more short rows."""

    def __init__(self):
        self.shorts = [verdict(i, f"{SHORT} Item {i}.") for i in range(30)]
        self.long = verdict(99, LONG)
        self.calls, self.results = 0, {}

    def take(self):
        self.calls += 1
        if self.calls == 1:
            return list(enumerate(self.shorts[:10]))
        if self.calls == 4:
            return [(99, self.long)]
        if self.calls == 6:
            return list(enumerate(self.shorts[10:], start=10))
        return []

    def give(self, ticket, result):
        self.results[ticket] = result


def test_a_long_document_beside_short_rows_on_a_gpu_that_cannot_hold_them_all_ends_with_every_row_answered(
    gpu_judge, monkeypatch
):
    engine = engine_on(gpu_judge, NARROW, monkeypatch)
    feed = LateFeed()
    tokens = len(gpu_judge.tokenizer(gpu_judge.render(feed.long.messages))["input_ids"])
    assert tokens > 3000  # a document of about 2,000 tokens was enough to hang the engine on an H200
    steps = bounded(engine, 200)
    engine.stream(feed)
    assert len(feed.results) == 31 and all(r.ok for r in feed.results.values()), [
        r.error for r in feed.results.values() if r.error
    ]
    # the device could not hold them all at once: the long row ran beside few others, never all thirty
    assert 31 * (tokens + 30) > engine.token_budget and steps["n"] < 100
    assert engine.device_memory.refusals == 0  # the budget kept every allocation inside the device


def test_a_judge_larger_than_the_device_is_one_line_naming_its_weights_and_the_cap_before_it_loads(tmp_path):
    """The CLI on the embedded judge's 513 MiB under a 300 MiB GPU: refused from its files' headers, before loading,
    in one line with the model-load exit code (it was torch.OutOfMemoryError's traceback, once the judge had
    loaded)."""
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "source": "The council met on Tuesday.", "summary": "It met."}) + "\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", **{SWITCH: "300"})
    command = [sys.executable, "-m", "offline_sumscore", "score", str(src), "-o", str(tmp_path / "out.jsonl")]
    proc = subprocess.run([*command, "--model", "smollm2-135m"], env=env, capture_output=True, text=True, timeout=300)
    said = (proc.stdout + proc.stderr).strip()
    assert proc.returncode == 2 and "\n" not in said, said
    assert "its weights take 513 MiB in float32, more than the whole device holds: emulated GPU of 300 MiB" in said
    assert "(refused before loading)" in said and "OutOfMemoryError" not in said and "Loading weights" not in said


def test_a_device_with_room_for_the_weights_but_not_a_pass_is_one_line_not_out_of_memory(gpu_judge, monkeypatch):
    """540 MiB: the 513 MiB of weights fit, one pass beside them does not; sizing says so in one line."""
    with pytest.raises(ModelLoadError, match="does not fit this device with room to judge") as info:
        engine_on(gpu_judge, 540, monkeypatch)
    assert "\n" not in str(info.value) and "emulated GPU of 540 MiB" in str(info.value)


def test_a_document_too_large_for_the_device_fails_alone_naming_its_tokens_and_the_budget(gpu_judge, monkeypatch):
    engine = engine_on(gpu_judge, TINY, monkeypatch)
    feed = LateFeed()
    bounded(engine, 200)
    engine.stream(feed)
    failed = {t: r for t, r in feed.results.items() if not r.ok}
    assert list(failed) == [99] and len(feed.results) == 31
    message = failed[99].error
    assert failed[99].error_kind == "memory" and "too large to run even alone" in message
    assert f"KV budget of {engine.token_budget} tokens" in message and re.search(r"needs 3[0-9]{3} ", message), message


def test_memory_taken_by_another_process_after_sizing_is_met_by_the_devices_own_refusals_and_never_hangs(
    gpu_judge, monkeypatch
):
    """The budget is measured when the engine starts; here something else then takes most of what it counted on
    (another process on the GPU), so the device itself refuses the slots' growth, not the budget."""
    engine = engine_on(gpu_judge, NARROW, monkeypatch)
    memory = engine.device_memory
    with memory.tracking():
        squatter = torch.empty(memory.free() - 60 * 2**20, dtype=torch.uint8)  # leaves 60 MiB
    feed = LateFeed()
    steps = bounded(engine, 300)
    try:
        engine.stream(feed)
    finally:
        del squatter
    assert len(feed.results) == 31 and memory.refusals > 0 and engine.stats.oom_splits > 0
    failed = [r for r in feed.results.values() if not r.ok]
    assert all(r.error_kind == "memory" and "emulated GPU out of memory" in r.error for r in failed)
    assert len(failed) < 31 and steps["n"] < 300


# -- out of memory at every place the engine allocates ---------------------------------------------------------
class Injection:
    """Raises torch.OutOfMemoryError once, at the first call of the wrapped function that `when` accepts."""

    def __init__(self, when=lambda *args, **kwargs: True):
        self.when, self.raised = when, 0

    def wrap(self, original):
        def wrapped(*args, **kwargs):
            if not self.raised and self.when(*args, **kwargs):
                self.raised += 1
                raise torch.OutOfMemoryError("injected")
            return original(*args, **kwargs)

        return wrapped


def inject(engine: TransformersEngine, site: str, monkeypatch) -> Injection:
    """site: where the engine allocates (slot growth; a likelihood pack's slots; a decoder layer or the vocabulary
    projection in a step; the step's update after its commit)."""
    step_running = {"on": False}
    if site == "slot growth":
        injection = Injection(lambda self, rows, columns: step_running["on"] and columns > 64)
        monkeypatch.setattr(KVSlots, "_reallocate", injection.wrap(KVSlots._reallocate))
    elif site == "likelihood pack":
        injection = Injection()
        engine.likelihood._slots = injection.wrap(engine.likelihood._slots)
    elif site in ("layer", "head"):
        layers = engine.judge.model.get_decoder().layers
        module = layers[len(layers) // 2] if site == "layer" else engine.judge.model.get_output_embeddings()
        injection = Injection(lambda *args: step_running["on"])
        engine._hooks = [module.register_forward_pre_hook(injection.wrap(lambda *args: None))]
    elif site == "update after commit":
        injection = Injection()
        engine.stepper.accept = injection.wrap(engine.stepper.accept)
    else:
        raise AssertionError(site)
    step = engine.stepper.step

    def marked(batch):
        step_running["on"] = True
        try:
            return step(batch)
        finally:
            step_running["on"] = False

    engine.stepper.step = marked
    return injection


@pytest.mark.parametrize("site", ["slot growth", "likelihood pack", "layer", "head", "update after commit"])
def test_out_of_memory_at_any_allocation_ends_with_every_row_answered_or_failed_never_a_hang(
    gpu_judge, reference, site, monkeypatch
):
    engine = engine_on(gpu_judge, WIDE, monkeypatch)
    injection = inject(engine, site, monkeypatch)
    steps = bounded(engine, 300)
    try:
        results = engine.run(one_source())
    finally:
        for hook in getattr(engine, "_hooks", []):
            hook.remove()
    assert injection.raised == 1 and steps["n"] < 300 and len(results) == len(reference)
    if site == "update after commit":  # the one row being updated fails, naming it; every other row as before
        failed = [r for r in results if not r.ok]
        assert len(failed) == 1 and failed[0].error_kind == "memory" and "injected" in failed[0].error
        same([a for a, b in zip(reference, results) if b.ok], [b for b in results if b.ok])
    else:  # recovered: the same verdicts as a run without the fault
        assert engine.stats.oom_splits == 1
        same(reference, results)


def test_the_prefix_stores_pool_is_allocated_when_a_gpu_engine_is_sized_and_a_failure_there_is_said_at_once(
    gpu_judge, monkeypatch
):
    engine = engine_on(gpu_judge, WIDE, monkeypatch)
    pool = engine.store.pool
    assert pool is not None and pool.keys.numel() > 0  # inside the budget from the start, never in a step
    injection = Injection()
    monkeypatch.setattr(prefix_store.BlockPool, "allocate", injection.wrap(prefix_store.BlockPool.allocate))
    with pytest.raises(ModelLoadError, match="the prefix store's pool"):
        TransformersEngine(gpu_judge)


def test_a_cpu_engine_whose_store_pool_runs_out_of_memory_in_the_update_after_commit_ends_with_every_row(judge):
    """The review's third hang, on a CPU judge: the store's pool is made at its first keep, in the step's update,
    after the pass is committed. Out of memory there used to strand the step's rows; now the store keeps nothing."""
    engine = TransformersEngine(judge)
    reference_results = TransformersEngine(judge).run([r for r in one_source() if r.continuation is None])
    injection = Injection()
    original = prefix_store.BlockPool.__init__
    prefix_store.BlockPool.__init__ = injection.wrap(original)
    try:
        steps = bounded(engine, 300)
        results = engine.run([r for r in one_source() if r.continuation is None])
    finally:
        prefix_store.BlockPool.__init__ = original
    assert injection.raised == 1 and engine.store.refused == 1 and steps["n"] < 300
    same(reference_results, results)


# -- a loop that makes no progress ----------------------------------------------------------------------------
def test_a_loop_that_makes_no_progress_fails_its_rows_by_name_instead_of_spinning(judge, monkeypatch):
    from offline_sumscore.engine.local import step as step_module

    monkeypatch.setattr(step_module, "plan_step", lambda batch, drafter, pass_tokens: None)  # nothing ever runs
    engine = TransformersEngine(judge)
    requests = [r for r in mix() if r.stage == "coverage"]
    results = engine.run(requests)
    assert all(not r.ok and "made no progress" in r.error for r in results)


def test_planned_width_counts_a_rows_prompt_and_the_output_it_is_planned_for(gpu_judge):
    from offline_sumscore.engine.local.admission import rows_for

    (row,) = rows_for(gpu_judge, [(0, verdict(1, SHORT))])
    assert planned_width(row) == len(row.prompt_ids) + min(row.cap, 256)
    row.out = [0] * 300  # a row past its plan is as wide as what it has written
    assert planned_width(row) == len(row.prompt_ids) + 300
