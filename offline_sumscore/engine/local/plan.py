"""What one decoding step runs, as plain values: the plan, decided from the rows before the model is touched, and
the output read back from the model. As vLLM v1's scheduler hands its runner a SchedulerOutput and takes back a
ModelRunnerOutput: the pass reads the plan's tokens and starts, the sampler its grammar rows and read points, and
the step's one update (step.Stepper.update) both; nothing else passes between them, and nothing here changes a row.
"""

from __future__ import annotations

from dataclasses import dataclass

from offline_sumscore.engine.local.drafts import Draft, Drafter


@dataclass(frozen=True)
class ReadPoint:
    """Where a step reads a row's next token: its slot, the token's place in the pass's hidden states, the bitmask
    row of the grammar state there, and how many of the row's draft tokens come before it."""

    slot: int
    hidden_at: int
    mask_row: int
    after_draft: int


@dataclass(frozen=True)
class Pick:
    token: int  # -1: the logits were NaN, nothing was read
    p_yes: float | None  # where the pick decides a closed-choice verdict


@dataclass(frozen=True)
class Feed:
    """What one row feeds in a step: its pending tokens, then its draft (if any), and its first mask row."""

    slot: int
    pending: list[int]
    draft: Draft | None
    mask_row: int

    @property
    def tokens(self) -> list[int]:
        return self.pending + (self.draft.tokens if self.draft else [])

    @property
    def mask_rows(self) -> int:
        """One for the token after its pending ones, and one after each draft token."""
        return 1 + (len(self.draft.tokens) if self.draft else 0)

    def read_points(self, first_token: int) -> list[ReadPoint]:
        """After its pending tokens, and after each guessed draft token (Draft.read_points)."""
        last = len(self.pending) - 1
        after = [0] + (self.draft.read_points() if self.draft else [])
        return [ReadPoint(self.slot, first_token + last + m, self.mask_row + m, m) for m in after]


@dataclass(frozen=True)
class StepPlan:
    """One step: each feeding row's feed (mask rows numbered in feeding order), and, by slot, the tokens the pass
    feeds ([] for a slot that feeds nothing) and the columns already computed before them."""

    feeds: list[Feed]
    tokens: list[list[int]]
    starts: list[int]

    @property
    def mask_rows(self) -> int:
        return sum(feed.mask_rows for feed in self.feeds)

    def read_points(self, offsets) -> list[ReadPoint]:
        """Every read point of the pass, in mask-row order; offsets: each slot's first token in the pass."""
        return [read for feed in self.feeds for read in feed.read_points(int(offsets[feed.slot]))]

    def grammar_rows(self, rows) -> list[tuple]:
        """(grammar state, mask row, draft tokens) of each feed: what the grammar compiler fills masks from."""
        return [(rows[f.slot].matcher, f.mask_row, f.draft.tokens if f.draft else []) for f in self.feeds]


@dataclass(frozen=True)
class StepOutput:
    """What the model said: the pick at each read point, by (slot, draft tokens before it), and which feeding
    rows' grammars allowed nothing but the end token after their pending tokens."""

    picks: dict[tuple[int, int], Pick]
    only_eos: dict[int, bool]


def plan_step(batch, drafter: Drafter) -> StepPlan | None:
    """The next step's plan (None: no row feeds). Feeding rows: every live row with tokens not yet computed,
    except rows waiting for a shared prefix this step computes; a row whose grammar is complete finished when its
    last token was taken, without a pass. Each may add a draft of guessed tokens (drafts.py)."""
    waiting = batch.waiting()
    rows = batch.rows
    feeding = [
        s
        for s, r in enumerate(rows)
        if r is not None and not r.done and r.ticket not in waiting and r.computed < len(r.prompt_ids) + len(r.out)
    ]
    if not feeding:
        return None
    drafts = drafter.propose(rows, feeding)
    feeds, mask_row = [], 0
    for s in feeding:
        feed = Feed(s, rows[s].pending, drafts.get(s), mask_row)
        feeds.append(feed)
        mask_row += feed.mask_rows
    tokens: list[list[int]] = [[] for _ in rows]
    for feed in feeds:
        tokens[feed.slot] = feed.tokens
    starts = [r.computed if r is not None else 0 for r in rows]
    return StepPlan(feeds, tokens, starts)
