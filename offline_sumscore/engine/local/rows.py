"""A row: one request as the engine runs it, and every change to it.

One progress model for every row, as vLLM's v1 scheduler keeps it: a row's tokens are its prompt and its output so
far, `computed` of them have their keys and values in its slot, and the rest (`pending`) go into its next pass. A
stored prefix copied into its slot, a shared prefix copied from the row that computed it, a prompt's remainder, a
pick and the tokens its grammar forces after it: each only moves `computed` or lengthens the output.

Other modules read a row's fields and change them only through its methods here: admission starts it, the step's
one update (step.Stepper.update) moves it, and a failure ends it. tests/unit/test_step_plan.py holds the rest of the
engine to that, so a row's state and its counters change in this file alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from offline_sumscore.core.errors import Failure
from offline_sumscore.core.stages import StageRequest, cap_error
from offline_sumscore.engine.local.drafts import NgramIndex


@dataclass
class Row:
    ticket: int  # the feed's ticket for its request
    request: StageRequest
    prompt: str  # rendered with the chat template once, kept for the result's audit
    prompt_ids: list[int]  # a likelihood row's continuation included, from score_from on
    cap: int  # output tokens allowed (0 for a likelihood row)
    calls: int = 1  # requests handed over together with this one (the result's batch_size)
    score_from: int | None = None  # likelihood rows: index in prompt_ids of the continuation's first token
    out: list[int] = field(default_factory=list)  # every token after the prompt (decoded and forced)
    computed: int = 0  # tokens of prompt_ids + out whose keys and values are in its slot
    matcher: Any = None  # its grammar's state (llguidance)
    decoded: int = 0  # of out: picked from the judge's distribution
    forced: int = 0  # of out: fixed by the grammar
    choice_probs: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # likelihood rows: each continuation token's, in order
    expected: list[tuple[int, float]] = field(default_factory=list)  # and the most expected token there, its own
    context: NgramIndex | None = None  # prompt_ids + out, indexed for drafts, built when the row first drafts
    slot: int | None = None  # its KV slot in the running batch
    admitted: int = 0  # its place in the order of admission
    started: float = 0.0
    done: bool = False
    error: str | None = None
    error_kind: str | None = None  # see StageResult.error_kind

    # -- reading ----------------------------------------------------------------------------------------------
    @property
    def pending(self) -> list[int]:
        """Its tokens not yet computed: what its next pass feeds."""
        n = len(self.prompt_ids)
        if self.computed >= n:
            return self.out[self.computed - n :]
        return self.prompt_ids[self.computed :] + self.out

    @property
    def feed_from(self) -> int:
        """Tokens from here on are read: the last prompt token of a row that generates, the token before the
        continuation of a likelihood row. A shared prefix ends before it."""
        return len(self.prompt_ids) - 1 if self.score_from is None else self.score_from - 1

    def ngrams(self) -> NgramIndex:
        """Its prompt and output so far, indexed for drafts (built on first use, then extended)."""
        if self.context is None:
            self.context = NgramIndex(self.prompt_ids)
        self.context.extend(self.out[len(self.context) - len(self.prompt_ids) :])
        return self.context

    # -- in the batch -----------------------------------------------------------------------------------------
    def place(self, slot: int, order: int) -> None:
        self.slot, self.admitted = slot, order

    def leave(self) -> None:
        self.slot = None

    def start(self, matcher, computed: int, now: float) -> None:
        """Admitted: its grammar's fresh state, and `computed` tokens already in its slot (a stored prefix)."""
        self.matcher, self.computed, self.started = matcher, computed, now

    def computed_to(self, n: int) -> None:
        """Its first n tokens' keys and values are in its slot (a shared prefix copied in, a pass's feed)."""
        self.computed = n

    def restart(self) -> None:
        """Back to its prompt: a preempted row is rerun from scratch (greedy decoding makes the rerun identical)."""
        self.matcher, self.context = None, None
        self.out, self.choice_probs = [], []
        self.decoded = self.forced = self.computed = 0

    # -- its grammar and its picks ----------------------------------------------------------------------------
    def take_forced(self) -> int:
        """The text its grammar fixes next, appended without being decoded; returns how many tokens."""
        forced = self.matcher.compute_ff_tokens()
        if forced:
            self.matcher.consume_tokens(forced)
            self.out.extend(forced)
            self.forced += len(forced)
        return len(forced)

    def keep_forced_guess(self, token: int) -> None:
        """A draft token its grammar forced: taken as decoding would have inserted it, its keys and values already
        written by the pass that checked the draft."""
        self.matcher.consume_token(token)
        self.out.append(token)
        self.forced += 1
        self.computed += 1

    def take_pick(self, token: int, p_yes: float | None, eos_ids, *, guessed: bool) -> None:
        """The judge's greedy pick, and P(yes) where it decides a verdict. An end token ends the row. guessed: the
        pick equals the draft token the pass fed after it, whose keys and values are written: it counts as
        computed."""
        if p_yes is not None:
            self.choice_probs.append(p_yes)
        self.decoded += 1
        self.out.append(token)
        if token in eos_ids:
            self.done = True
            return
        self.matcher.consume_token(token)
        if guessed:
            self.computed += 1

    def stop_if_complete(self) -> bool:
        """A grammar that allows nothing but the end token has nothing left to read from the model: the row ends
        here, with no forward pass. Returns whether it ended now."""
        if self.done or not self.matcher.is_stopped():
            return False
        self.done = True
        return True

    def finish(self) -> None:
        self.done = True

    # -- likelihood rows --------------------------------------------------------------------------------------
    def start_scoring(self, computed: int, now: float) -> None:
        self.started, self.computed, self.logprobs, self.expected = now, computed, [], []

    def read_logprob(self, logprob: float, expected: int, expected_logprob: float) -> None:
        self.logprobs.append(logprob)
        self.expected.append((expected, expected_logprob))

    # -- failing ----------------------------------------------------------------------------------------------
    def fail(self, kind: str, message: str) -> None:
        self.done, self.error_kind, self.error = True, kind, message

    def fail_at_cap(self) -> bool:
        """Its output reached its token cap: it fails, its raw output kept. Returns whether it did."""
        if len(self.out) < self.cap:
            return False
        self.fail(Failure.CAP, cap_error(self.cap))
        return True
