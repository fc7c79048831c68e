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
    """What one row feeds in a step: its pending tokens, then its draft (if any), and its first mask row. A chunk
    is the start of a prompt too long for the pass's token budget: the rest goes on in later steps, so nothing is
    read after it (no mask row, no read point, no draft)."""

    slot: int
    pending: list[int]
    draft: Draft | None
    mask_row: int
    chunk: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.pending + (self.draft.tokens if self.draft else [])

    @property
    def mask_rows(self) -> int:
        """One for the token after its pending ones, and one after each draft token; none after a chunk."""
        return 0 if self.chunk else 1 + (len(self.draft.tokens) if self.draft else 0)

    def read_points(self, first_token: int) -> list[ReadPoint]:
        """After its pending tokens, and after each guessed draft token (Draft.read_points); none after a chunk."""
        if self.chunk:
            return []
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
    def reading(self) -> list[Feed]:
        """The feeds the judge's pick is read after: all but chunks."""
        return [feed for feed in self.feeds if not feed.chunk]

    @property
    def mask_rows(self) -> int:
        return sum(feed.mask_rows for feed in self.feeds)

    def read_points(self, offsets) -> list[ReadPoint]:
        """Every read point of the pass, in mask-row order; offsets: each slot's first token in the pass."""
        return [read for feed in self.feeds for read in feed.read_points(int(offsets[feed.slot]))]

    def grammar_rows(self, rows) -> list[tuple]:
        """(grammar state, mask row, draft tokens) of each feed: what the grammar compiler fills masks from."""
        return [(rows[f.slot].matcher, f.mask_row, f.draft.tokens if f.draft else []) for f in self.reading]


@dataclass(frozen=True)
class StepOutput:
    """What the model said: the pick at each read point, by (slot, draft tokens before it), and which reading rows'
    grammars allowed nothing but the end token after their pending tokens."""

    picks: dict[tuple[int, int], Pick]
    only_eos: dict[int, bool]


def plan_step(batch, drafter: Drafter, pass_tokens: int) -> StepPlan | None:
    """The next step's plan (None: no row feeds). Feeding rows: every live row with tokens not yet computed,
    except rows waiting for a shared prefix this step computes; a row whose grammar is complete finished when its
    last token was taken, without a pass. The pass carries at most pass_tokens of their pending tokens
    (fed_per_row); a row that gets all of its own may add a draft of guessed tokens (drafts.py)."""
    waiting = batch.waiting()
    rows = batch.rows
    feeding = [
        s
        for s, r in enumerate(rows)
        if r is not None and not r.done and r.ticket not in waiting and r.computed < len(r.prompt_ids) + len(r.out)
    ]
    if not feeding:
        return None
    pending = {s: rows[s].pending for s in feeding}  # a property that slices: read once a step
    fed = fed_per_row(rows, pending, pass_tokens)
    whole = [s for s in feeding if s in fed and fed[s] == len(pending[s])]
    drafts = drafter.propose(rows, whole, sum(fed.values()), pass_tokens)
    feeds, mask_row = [], 0
    for s in feeding:
        if s not in fed:
            continue
        feed = Feed(s, pending[s][: fed[s]], drafts.get(s), mask_row, chunk=fed[s] < len(pending[s]))
        feeds.append(feed)
        mask_row += feed.mask_rows
    tokens: list[list[int]] = [[] for _ in rows]
    for feed in feeds:
        tokens[feed.slot] = feed.tokens
    starts = [r.computed if r is not None else 0 for r in rows]
    return StepPlan(feeds, tokens, starts)


def fed_per_row(rows, pending: dict[int, list[int]], pass_tokens: int) -> dict[int, int]:
    """How many of its pending tokens (pending, by slot) each feeding row feeds, within pass_tokens a pass (as vLLM's
    max_num_batched_tokens): rows past their prompt first (a pick and the tokens forced after it, a few each), then
    prompts in the order their rows were admitted, the last one cut to what is left. A row left out feeds in a
    later step. On a CPU a pass of many thousand tokens runs slower per token than one of a few thousand: the
    activations of each layer no longer fit the cache."""
    order = sorted(pending, key=lambda s: (rows[s].computed < len(rows[s].prompt_ids), rows[s].admitted, s))
    fed, left = {}, pass_tokens
    for s in order:
        if left <= 0:
            break
        fed[s] = min(len(pending[s]), left)
        left -= fed[s]
    return fed
