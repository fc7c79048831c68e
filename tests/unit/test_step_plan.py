"""A step's plan (engine/local/plan.py) from rows alone, no model; and the rule that a row changes only through its
own methods (engine/local/rows.py), checked on the engine's source."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import offline_sumscore.engine.local as local
from offline_sumscore.engine.local.drafts import Draft
from offline_sumscore.engine.local.plan import plan_step
from offline_sumscore.engine.local.rows import Row
from offline_sumscore.engine.local.scheduler import Batch, Forming

ENGINE = Path(local.__file__).parent
ROW_FIELDS = {f.name for f in dataclasses.fields(Row)}
MUTATING = {"append", "extend", "insert", "pop", "clear", "remove", "sort", "reverse", "__setitem__"}


def row(ticket, prompt, out=(), computed=0, done=False):
    r = Row(ticket, None, "", list(prompt), cap=50)
    r.out, r.computed, r.done = list(out), computed, done  # a test's own rows: set up directly
    return r


class Drafts:
    """A drafter that guesses fixed tokens for some slots (the real one: drafts.Drafter)."""

    def __init__(self, by_slot):
        self.by_slot = by_slot

    def propose(self, rows, feeding, fed, pass_tokens):
        return {s: d for s, d in self.by_slot.items() if s in feeding}


def test_the_plan_feeds_each_rows_pending_tokens_from_its_computed_columns_with_mask_rows_in_order():
    prompt = [1, 2, 3, 4]
    rows = [
        row(0, prompt),  # fresh: its whole prompt
        None,  # a free slot
        row(2, prompt, out=[7], computed=4),  # decoding: its last pick
        row(3, prompt, out=[7, 8], computed=6, done=True),  # finished: feeds nothing
        row(4, prompt, out=[9], computed=4),  # decoding, with a draft of two tokens
    ]
    batch = Batch(rows=rows)
    plan = plan_step(batch, Drafts({4: Draft([5, 6], [False, True], stopped=False)}), 4096)
    assert [f.slot for f in plan.feeds] == [0, 2, 4]
    assert plan.tokens == [[1, 2, 3, 4], [], [7], [], [9, 5, 6]]
    assert plan.starts == [0, 0, 4, 6, 4]
    assert [f.mask_row for f in plan.feeds] == [0, 1, 2] and plan.mask_rows == 5
    offsets = [0, 4, 4, 5, 5]  # each slot's first token in the pass
    reads = plan.read_points(offsets)
    # after slot 0's last prompt token; after slot 2's pick; after slot 4's pick and after its guessed token (the
    # forced one is read only after it, where the draft ends)
    assert [(r.slot, r.hidden_at, r.mask_row, r.after_draft) for r in reads] == [
        (0, 3, 0, 0),
        (2, 4, 1, 0),
        (4, 5, 2, 0),
        (4, 7, 4, 2),
    ]


def test_rows_waiting_for_a_shared_prefix_feed_nothing_until_it_is_formed_and_an_idle_batch_has_no_plan():
    prompt = list(range(10, 40))
    lead, waiting = row(0, prompt), row(1, prompt)
    batch = Batch(rows=[lead, waiting], forming=[Forming(lead, [waiting], prompt[:20])])
    plan = plan_step(batch, Drafts({}), 4096)
    assert [f.slot for f in plan.feeds] == [0] and plan.tokens[1] == []
    assert plan_step(Batch(rows=[row(0, prompt, computed=30, done=True), None]), Drafts({}), 4096) is None
    assert plan_step(SimpleNamespace(rows=[], waiting=set), Drafts({}), 4096) is None


def test_a_pass_over_its_token_budget_feeds_decoding_rows_first_then_prompts_in_admission_order_in_chunks():
    prompt = list(range(100, 130))  # 30 tokens
    rows = [
        row(0, prompt, computed=10),  # admitted second: 20 prompt tokens left
        row(1, prompt, out=[7], computed=30),  # decoding: its last pick
        row(2, prompt),  # admitted first: all 30 prompt tokens
        row(3, prompt),  # admitted third
    ]
    for order, r in zip((1, 0, 0, 2), rows):
        r.admitted = order
    plan = plan_step(Batch(rows=rows), Drafts({1: Draft([5], [False], stopped=False)}), 26)
    # the decoding row (1 token), then slot 2's prompt (the 25 tokens left: a chunk); slots 0 and 3 wait
    assert [(f.slot, len(f.pending), f.chunk) for f in plan.feeds] == [(1, 1, False), (2, 25, True)]
    assert plan.tokens == [[], [7, 5], prompt[:25], []]
    assert [f.slot for f in plan.reading] == [1] and plan.mask_rows == 2  # nothing is read after a chunk
    assert [r.slot for r in plan.read_points([0, 0, 2, 27])] == [1, 1]
    # with room for all: every row whole, and its pick read after it
    plan = plan_step(Batch(rows=rows), Drafts({}), 100)
    whole = [(0, 20, False), (1, 1, False), (2, 30, False), (3, 30, False)]
    assert [(f.slot, len(f.pending), f.chunk) for f in plan.feeds] == whole
    assert plan.mask_rows == 4


def test_a_prompts_chunk_gets_no_draft_and_leaves_the_draft_budget_what_the_pass_carries():
    from offline_sumscore.engine.local.drafts import Drafter

    drafter = Drafter(enabled=True, forced_tokens=True, gpu=False, eos_ids={0})
    prompt = list(range(100, 130))
    rows = [row(0, prompt), row(1, prompt)]
    rows[1].admitted = 1
    seen = {}

    def propose(rows, feeding, fed, pass_tokens):
        seen.update(feeding=feeding, fed=fed, pass_tokens=pass_tokens)
        return {}

    drafter.propose = propose
    plan_step(Batch(rows=rows), drafter, 40)
    assert seen == {"feeding": [0], "fed": 40, "pass_tokens": 40}  # slot 1 fed 10 of its 30: a chunk, no draft


def writes_to_rows(source: str) -> list[str]:
    """Lines where source assigns a Row field on anything but self, or calls a mutating method on one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            targets = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATING:
            targets = [node.func.value]
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr in ROW_FIELDS and not _is_self(t.value):
                found.append(f"line {t.lineno}: .{t.attr}")
    return found


def _is_self(node) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def test_no_module_of_the_engine_but_rows_py_changes_a_row():
    changed = {
        path.name: hits
        for path in sorted(ENGINE.glob("*.py"))
        if path.name != "rows.py" and (hits := writes_to_rows(path.read_text()))
    }
    assert not changed, changed


def test_the_row_write_check_sees_assignments_tuples_augmented_and_list_mutations():
    source = "r.computed = 1\nrow.done, x = True, 2\nrow.computed += 3\nrow.out.append(4)\nself.done = True\n"
    assert writes_to_rows(source) == ["line 1: .computed", "line 2: .done", "line 3: .computed", "line 4: .out"]
