"""The first GPU contact, ready: everything the engine's CUDA branches were read and emulated for, on the real device,
in one command that needs no network and writes one table.

    bash benchmarks/gpu_check.sh                # on the GPU machine: the carried wheels, then this, within 8 minutes
    python -m benchmarks.gpu_check --rehearse   # here, on the CPU: the same sections on an emulated GPU (make test)

Sections, each written to the table the moment it ends (a run cut short keeps what it measured):
  env        torch, CUDA, the device, the packages that decide the numbers
  families   the 7 judge families in bfloat16 through the engine against transformers' own forward pass and generate
             (tiny random-weight models, the embedded judge's tokenizer): likelihood difference, same greedy text
  syncs      torch.cuda.set_sync_debug_mode over decoding steps: the host waits once a step, no more
  memory     a long document among short rows on a device that cannot hold them all (memory taken first, so the
             engine sizes itself in what is left), then memory taken after sizing (the device's own refusals), then
             an out-of-memory error injected at each place the engine allocates: every row answered or failed by
             name, in a bounded number of steps
  attention  one layer's attention on the layouts a review found padded 512x and 751x: cells computed against
             needed and the time of a pass's calls, at four call costs (GPU_CALL_CELLS is an estimate until this runs)
  ladder     a random-weight Llama-3.1-8B geometry (SmolLM2's tokenizer and its 49,152-token vocabulary): transformers'
             generate (batched per grammar and wave, as outlines runs it) against our engine on the same workload:
             samples/s, decoded tokens/s, rows held at once, peak memory, and verdicts that differ
With --rehearse (no CUDA): the GPU branches through OFFLINE_SUMSCORE_DEVICE_MEMORY, float32, tiny sizes; a check that
needs the real device says so in its row. Writes OUT/gpu_check.md and OUT/gpu_check.json; prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings
from functools import partial
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402 - after HF_HUB_OFFLINE is set

SWITCH = "OFFLINE_SUMSCORE_DEVICE_MEMORY"


class Table:
    """The check's one table, written whole after every row (json and markdown)."""

    def __init__(self, out: Path, header: dict):
        self.out, self.header, self.rows = out, header, []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, section: str, check: str, figures: str, ok: bool | None = True) -> None:
        ok = None if ok is None else bool(ok)  # numpy's booleans are no JSON
        self.rows.append(dict(section=section, check=check, figures=figures, ok=ok))
        print(f"{section:10} {'ok ' if ok else 'n/a' if ok is None else 'FAIL'} {check}: {figures}", flush=True)
        self.write()

    def write(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(dict(self.header, rows=self.rows), indent=1))
        lines = [f"# GPU check: {self.header['device']}", "", self.header["versions"], ""]
        lines += ["| section | check | result | figures |", "|---|---|---|---|"]
        for r in self.rows:
            verdict = "ok" if r["ok"] else "n/a" if r["ok"] is None else "**FAIL**"
            lines.append(f"| {r['section']} | {r['check']} | {verdict} | {r['figures']} |")
        (self.out / "gpu_check.md").write_text("\n".join(lines) + "\n")


def tokenizer_dir(given: str | None) -> str:
    from offline_sumscore.engine.judge import models_root

    return given or str(models_root() / "SmolLM2-135M-Instruct")


def versions() -> str:
    import llguidance
    import outlines  # noqa: F401 - must import there
    import transformers

    found = [f"torch {torch.__version__}", f"transformers {transformers.__version__}"]
    found.append(f"llguidance {getattr(llguidance, '__version__', '?')}")
    if torch.cuda.is_available():
        found.append(f"CUDA {torch.version.cuda}")
    return ", ".join(found)


# -- families -----------------------------------------------------------------------------------------------------
def check_families(table: Table, device: str, dtype: torch.dtype) -> None:
    """Each family's tiny model, moved to the device in dtype: our engine against transformers' own forward and
    generate on the same device (their SDPA)."""
    from offline_sumscore.engine.local import TransformersEngine
    from tests.conftest import embedded_tokenizer
    from tests.engine.test_architectures import as_judge, families, reference, requests, tiny_model

    tokenizer = embedded_tokenizer()
    exact = dtype == torch.float32
    for family in families():
        model = tiny_model(family, tokenizer).to(device=device, dtype=dtype)
        judge = as_judge(model, tokenizer)
        reqs = requests()
        mean, text = reference(model, tokenizer, judge, reqs)
        engine = TransformersEngine(judge)
        likelihood, questions = engine.run(reqs)
        diff = abs(likelihood.value.mean_logprob - mean) if likelihood.ok else float("inf")
        same = questions.raw_output == text
        calls = engine.describe()["attention_calls"]
        ok = diff < (1e-4 if exact else 0.05) and (same or not exact)
        table.add("families", family, f"likelihood diff {diff:.1e}, same text {same}, {calls} calls", ok)


# -- syncs ----------------------------------------------------------------------------------------------------
def check_syncs(table: Table, judge, quick: bool) -> None:
    """Host waits a decoding step: CUDA's own sync debug mode where there is a GPU, else the operations that would
    wait (the engine tests' count). quick: one document's rows, not two."""
    from offline_sumscore.engine.local import TransformersEngine
    from tests.engine.test_device_faults_on_cpu import CountSyncs

    engine = TransformersEngine(judge)
    step, per_step = engine.stepper.step, []

    def counted(batch):
        if torch.cuda.is_available():
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    step(batch)
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            per_step.append(sum("synchroniz" in str(w.message) for w in seen))
        else:
            with CountSyncs() as mode:
                step(batch)
            per_step.append(mode.count)

    engine.stepper.step = counted
    results = engine.run([r for r in mix(quick) if r.continuation is None])
    how = "set_sync_debug_mode" if torch.cuda.is_available() else "operations that would wait, counted"
    ok = all(r.ok or r.error_kind == "cap" for r in results) and max(per_step) <= 1
    table.add("syncs", "host waits per decoding step", f"max {max(per_step)} over {len(per_step)} steps ({how})", ok)


# -- memory -----------------------------------------------------------------------------------------------------
def small_judge(tok_dir: str, device: str, dtype: str):
    """The embedded judge's geometry (SmolLM2-135M) with random weights, on the device: its weights do not travel."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from offline_sumscore.engine.judge import Judge

    config = AutoConfig.from_pretrained(tok_dir, local_files_only=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device=device, dtype=getattr(torch, dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    return Judge(
        model=model,
        tokenizer=tokenizer,
        name="random-smollm2-135m",
        path="(random)",
        device=device,
        dtype=dtype,
        identity="random-small",
        context_length=8192,
        decisions={"weights": "random, SmolLM2-135M geometry"},
    )


def check_memory(table: Table, judge, quick: bool) -> None:
    """The long document among short rows, under memory that cannot hold them all: on a GPU, memory taken before
    the engine sizes itself (it then sizes in what is left) and after (the device's own refusals); then the
    injections. quick (make test's rehearsal, whose engine tests run all of these): one of each."""
    from offline_sumscore.engine.local import TransformersEngine
    from offline_sumscore.engine.local.device_memory import device_memory
    from tests.engine.test_gpu_memory_on_cpu import LateFeed, bounded

    memory = device_memory(judge.model.device)
    for when in ("after sizing",) if quick else ("before sizing", "after sizing"):
        held = None
        room = 1400 * 2**20 if when == "before sizing" else 700 * 2**20  # above the weights, for the KV and a pass
        with memory.tracking():
            if when == "before sizing":
                held = take(memory, room, judge.model.device)
            engine = TransformersEngine(judge)
            if when == "after sizing":
                held = take(memory, 60 * 2**20, judge.model.device)
        feed, started = LateFeed(), time.perf_counter()
        steps = bounded(engine, 400)
        try:
            engine.stream(feed)
        except BaseException as exc:  # noqa: BLE001 - the row says what happened
            table.add("memory", f"long document, memory taken {when}", f"{type(exc).__name__}: {exc}", False)
            continue
        finally:
            del held
            memory.release_cached()
        failed = [r for r in feed.results.values() if not r.ok]
        named = all(r.error_kind == "memory" and r.error for r in failed)
        figures = (
            f"{len(feed.results)} of 31 answered, {len(failed)} failed by name, {steps['n']} steps, "
            f"{engine.stats.oom_splits} out-of-memory splits, {time.perf_counter() - started:.1f} s; "
            f"budget {engine.token_budget} tokens"
        )
        table.add("memory", f"long document, memory taken {when}", figures, len(feed.results) == 31 and named)
    check_injections(table, judge, ("layer", "update after commit") if quick else None, quick)


def take(memory, leave: int, device) -> torch.Tensor:
    """Memory held as another process would hold it, leaving about `leave` bytes free; a tenth less each time the
    allocator refuses (free memory is not all in one piece)."""
    size = max(0, memory.free() - leave)
    while True:
        try:
            return torch.empty(size, dtype=torch.uint8, device=device)
        except torch.OutOfMemoryError:
            size = size * 9 // 10


def mix(quick: bool) -> list:
    """The engine tests' mixed rows (generated lists, verdicts, likelihoods); quick: those of one document."""
    from tests.engine.test_engine_on_embedded_judge import mix as mixed

    return [r for r in mixed() if r.sample_id == "a" or not quick]


def check_injections(table: Table, judge, sites=None, quick: bool = False) -> None:
    from offline_sumscore.engine.local import TransformersEngine
    from tests.engine.test_gpu_memory_on_cpu import bounded, inject

    for site in sites or ("slot growth", "likelihood pack", "layer", "head", "update after commit"):
        engine = TransformersEngine(judge)
        patches = _Patches()
        injection = inject(engine, site, patches)
        steps = bounded(engine, 300)
        try:
            results = engine.run(mix(quick))
        finally:
            patches.undo()
            for hook in getattr(engine, "_hooks", []):
                hook.remove()
        failed = [r for r in results if not r.ok and r.error_kind != "cap"]
        ok = (
            injection.raised == 1 and len(results) == len(mix(quick)) and len(failed) <= (site == "update after commit")
        )
        table.add("memory", f"out of memory injected: {site}", f"{len(failed)} failed, {steps['n']} steps", ok)


class _Patches:
    """monkeypatch's setattr and undo, outside pytest."""

    def __init__(self):
        self.done = []

    def setattr(self, target, name, value):
        self.done.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def undo(self):
        for target, name, value in reversed(self.done):
            setattr(target, name, value)


# -- attention --------------------------------------------------------------------------------------------------
def check_attention(table: Table, device: str, dtype: torch.dtype, rehearse: bool) -> None:
    """One layer's ragged attention at Qwen2.5-7B's heads on the review's layouts, at four call costs: cells
    computed over needed, the calls it makes, and the time of a pass's attention (median of 5 after a warm-up)."""
    from dataclasses import replace

    from offline_sumscore.engine.local.attention import RaggedPass, ragged_attention
    from offline_sumscore.engine.local.attention_cuda import GPU_CALLS
    from tests.unit.test_device_memory import scenario

    heads, kv_heads, dim = (28, 4, 128) if not rehearse else (4, 2, 16)
    layouts = [(400, 50, 800), (500, 100, 3000)] if not rehearse else [(40, 6, 80)]
    for rows, multi, prompt in layouts:
        filled, counts = scenario(rows, multi, prompt)
        columns = int((filled + counts).max())
        keys = torch.randn(rows, kv_heads, columns, dim, device=device, dtype=dtype)
        values = torch.randn_like(keys)
        query = torch.randn(1, heads, int(counts.sum()), dim, device=device, dtype=dtype)
        for cells in (1 << 14, 1 << 16, 1 << 18, 1 << 20):
            layout = RaggedPass(filled, counts, torch.device(device), calls=replace(GPU_CALLS, call_cells=cells))
            computed, needed = layout.cells
            times = []
            for k in range(6):
                started = time.perf_counter()
                ragged_attention(query, keys, values, layout, None)
                if device == "cuda":
                    torch.cuda.synchronize()
                if k:
                    times.append(time.perf_counter() - started)
            ms = sorted(times)[len(times) // 2] * 1000
            figures = f"{computed / needed:.2f}x the cells needed, {len(layout.runs) + 1} calls, {ms:.2f} ms a layer"
            default = cells == GPU_CALLS.call_cells  # the others are the sweep that will set it: no verdict
            table.add(
                "attention",
                f"{rows} rows, {multi} multi-token, {prompt}-token prompt; call_cells {cells}"
                + (" (the default)" if default else ""),
                figures,
                computed <= 5 * needed if default else None,
            )


# -- ladder -----------------------------------------------------------------------------------------------------
def check_ladder(table: Table, tok_dir: str, device: str, rehearse: bool, samples: int) -> None:
    """transformers' generate (batched per grammar and wave) and our engine, on the same workload and judge."""
    from benchmarks.lib.ladder_judge import load
    from benchmarks.lib.outcomes import flip_rate
    from benchmarks.lib.outlines_engine import OutlinesEngine
    from benchmarks.lib.workloads import frozen_inputs, ladder_caps
    from offline_sumscore import SummarizationScorer
    from offline_sumscore.engine.local import TransformersEngine
    from offline_sumscore.engine.local.device_memory import device_memory

    layers = 1 if rehearse else 32
    judge = load("gpu", tok_dir, None, layers=layers, allow_cpu=rehearse, vocab=0)
    caps = ladder_caps(dict(questions=3, text_chars=60, reason_chars=40))
    inputs = frozen_inputs(None, samples, 3000)
    outcomes = {}
    memory, held = device_memory(judge.model.device), {"rows": 0}

    def counted(batch, step):
        held["rows"] = max(held["rows"], len(batch.live))
        return step(batch)

    for name in ("ours", "transformers generate"):
        with memory.tracking(), memory.measuring() as found:  # the engine's own sizing and pool counted too
            engine = TransformersEngine(judge) if name == "ours" else OutlinesEngine(judge, batch=True)
            if name == "ours":
                engine.stepper.step = partial(counted, step=engine.stepper.step)
            started = time.perf_counter()
            results = SummarizationScorer(engine=engine, **caps).score_many(inputs, on_error="return")
            seconds = time.perf_counter() - started
        decoded = engine.stats.decoded_tokens + engine.stats.forced_tokens if name == "ours" else engine.decoded_tokens
        peak = (found["peak"] or 0) / 2**30
        outcomes[name] = results
        failed = sum(1 for r in results if getattr(r, "error", None))
        rows = f", up to {held['rows']} rows held" if name == "ours" else ""
        figures = (
            f"{len(inputs) / seconds:.2f} samples/s, {decoded / seconds:.0f} output tokens/s{rows}, peak "
            f"{peak:.2f} GiB above the weights (keys and values, activations), {failed} failed, {seconds:.1f} s"
        )
        table.add("ladder", f"{name}: {judge.name}, {len(inputs)} samples", figures, failed == 0)
    flips = flip_rate(outcomes["transformers generate"], outcomes["ours"])
    numerics = "bfloat16" if device == "cuda" else "float32"
    table.add("ladder", "verdicts that differ, ours against generate", f"{flips:.1%} ({numerics} numerics)", None)


# -- the run ------------------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description="The GPU check (the module docstring).")
    ap.add_argument("--rehearse", action="store_true", help="on the CPU, through an emulated GPU (make test)")
    ap.add_argument("--tokenizer", default=None, help="the embedded judge's tokenizer and config (.gpu/tokenizer)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_out")))
    ap.add_argument("--sections", default="families,syncs,memory,attention,ladder")
    ap.add_argument("--samples", type=int, default=None, help="ladder samples (48 on a GPU; rehearsed: 2, 1 quick)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="make test's rehearsal: one of each memory check, one document's rows, one ladder sample",
    )
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.rehearse:
        raise SystemExit("no CUDA device: run with --rehearse for the CPU rehearsal")
    if args.rehearse:
        # room for the ladder's one-layer 8B geometry in float32 (2.5 GiB, its 4096-wide embedding and head)
        os.environ[SWITCH] = os.environ.get(SWITCH, "6000")
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    device = "cuda" if cuda else "cpu"
    dtype, dtype_name = (torch.bfloat16, "bfloat16") if cuda else (torch.float32, "float32")
    name = torch.cuda.get_device_name() if cuda else f"CPU rehearsal, an emulated GPU of {os.environ[SWITCH]} MiB"
    table = Table(args.out, dict(device=name, versions=versions(), rehearsal=args.rehearse))
    tok_dir = tokenizer_dir(args.tokenizer)
    table.add("env", "device", f"{name}; {versions()}", True)
    wanted = args.sections.split(",")
    ladder_samples = 48 if cuda else 1 if args.quick else 2
    sections = {
        "families": lambda: check_families(table, device, dtype),
        "syncs": lambda: check_syncs(table, small_judge(tok_dir, device, dtype_name), args.quick),
        "memory": lambda: check_memory(table, small_judge(tok_dir, device, dtype_name), args.quick),
        "attention": lambda: check_attention(table, device, dtype, args.rehearse),
        "ladder": lambda: check_ladder(table, tok_dir, device, args.rehearse, args.samples or ladder_samples),
    }
    for section in wanted:
        started = time.perf_counter()
        try:
            sections[section]()
        except Exception as exc:  # noqa: BLE001 - one section's failure is a row, and the next section runs
            table.add(section, "raised", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", False)
        print(f"-- {section}: {time.perf_counter() - started:.1f} s", flush=True)
        gc.collect()  # the section's judges and engines, held in reference cycles: gone before the next
    print((args.out / "gpu_check.md").read_text())
    if any(r["ok"] is False for r in table.rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
