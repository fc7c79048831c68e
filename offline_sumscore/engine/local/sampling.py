"""The grammar's side of decoding: each row's grammar state, the tokens it forces, whether it is complete, the masks
of a step's read points, and the judge's greedy picks and P(yes) under them.

Masks are filled on the CPU, in llguidance's threads, into one pinned bitmask while the device runs the pass, moved
to the device once, unpacked and applied there; on a CPU with AVX-512 the pick kernel (pick_kernel.py) applies the
packed masks as it reads each row's logits, once. Where the allowed tokens form a closed choice (true/false, "1"/"0"),
P(yes) is read from the same distribution; picks and P(yes) come back in one transfer, the step's one
synchronisation with the device. A NaN in the logits is never read as a verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from offline_sumscore.engine.cpu.pick_kernel import pick_kernel as native_picks
from offline_sumscore.engine.local.features import EngineFeatures, EngineStats, Timing
from offline_sumscore.engine.local.plan import Pick, ReadPoint, StepPlan
from offline_sumscore.engine.local.transfer import to_device


class Sampler:
    def __init__(
        self,
        judge,
        grammars,
        *,
        features: EngineFeatures,
        stats: EngineStats,
        max_rows: int,
        on_timing,
        pick_kernel: bool = True,
    ):
        """pick_kernel: the pick kernel where it applies (pick_kernel.py); else torch's operators."""
        import llguidance

        self.grammars, self.features, self.stats, self.on_timing = grammars, features, stats, on_timing
        tok, gen = judge.tokenizer, judge.model.generation_config
        eos = gen.eos_token_id if gen.eos_token_id is not None else tok.eos_token_id
        self.eos_ids = sorted(set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id})
        self.vocab_size = grammars.vocab_size
        self.device = judge.model.device
        self.max_rows = max_rows
        self._executor = llguidance.LLExecutor()  # fills the rows' grammar masks in parallel threads
        self._choices: dict[tuple[str, str], ChoiceTokens] = grammars.choices  # the judge's, shared by its engines
        self._allocate_bitmask(max_rows)
        self.kernel, self.picks_on = native_picks(self.device, pick_kernel)  # the kernel, or None; in words

    # -- a row's grammar --------------------------------------------------------------------------------------
    def start(self, row, computed: int, now: float) -> None:
        """A row about to run: its grammar's fresh state, `computed` tokens already in its slot, and the tokens its
        grammar fixes from the start."""
        row.start(self.grammars.matcher(row.request.grammar), computed, now)
        if self.features.forced_tokens:
            self.take_forced(row)
        self.finish_if_complete(row)

    def take_forced(self, row) -> None:
        """The text the grammar fixes next, appended to the row's output without being decoded."""
        self.stats.forced_tokens += row.take_forced()

    def finish_if_complete(self, row) -> None:
        """A grammar that allows nothing but the end token ends the row with no forward pass (a verdict-only row
        costs exactly the one pass that reads its verdict)."""
        if self.features.logit_verdicts and row.stop_if_complete():
            self.stats.skipped_forwards += 1

    # -- masks ------------------------------------------------------------------------------------------------
    def masks(self, rows, plan: StepPlan):
        """The plan's grammar masks, filled in parallel into one reused bitmask ([rows, words] int32, pinned on a
        GPU host): a feed's mask_row for its next token, mask_row + 1 + m for the token after its draft token m.
        Also which reading rows' grammars (StepPlan.reading) allow nothing but the end token (a numpy check over the
        words, not over the vocabulary), by slot."""
        started = time.perf_counter()
        total = plan.mask_rows
        if self._bitmask.shape[0] < total:
            self._allocate_bitmask(total)
        bitmask = self._bitmask[:total]
        self.grammars.fill_bitmasks(self._executor, plan.grammar_rows(rows), bitmask)
        reading = plan.reading
        only_eos = ~(self._bitmask_np[[feed.mask_row for feed in reading]] & self._eos_words).any(axis=1)
        self._timed(started)
        return bitmask, dict(zip((feed.slot for feed in reading), only_eos.tolist()))

    def _allocate_bitmask(self, rows: int) -> None:
        words = -(-self.vocab_size // 32)
        self._bitmask = torch.zeros(
            (max(rows, self.max_rows), words), dtype=torch.int32, pin_memory=self.device.type == "cuda"
        )
        self._bitmask_np = self._bitmask.numpy()  # the same memory, for host-side checks
        eos = np.full(words, 0xFFFFFFFF, dtype=np.uint32)
        for t in self.eos_ids:
            if t < self.vocab_size:
                eos[t // 32] &= np.uint32(0xFFFFFFFF ^ (1 << (t % 32)))
        self._eos_words = eos.view(np.int32)

    def _timed(self, started: float) -> None:
        if self.on_timing is not None:
            self.on_timing(Timing("masks", time.perf_counter() - started))

    # -- picks ------------------------------------------------------------------------------------------------
    def pick(self, rows, reads: list[ReadPoint], logits, bitmask) -> list[Pick]:
        """The greedy pick at each read point under its grammar mask, applied on the device, and P(yes) where the
        allowed tokens form a closed choice (whitespace-only tokens are neutral; P(yes) is kept at the step whose
        pick decides the verdict, so each verdict gets exactly one). Brought back in one transfer."""
        if not reads:
            return []
        mask_rows = to_device(torch.tensor([r.mask_row for r in reads], dtype=torch.long), self.device)
        started = time.perf_counter()
        packed = to_device(bitmask, self.device).index_select(0, mask_rows)
        if self.kernel is not None:  # one pass over each row: -1 where it holds a NaN
            picks = self.kernel(logits, bitmask, mask_rows, self.vocab_size)
            poisoned = picks < 0
        else:
            allowed = unpack(packed, self.vocab_size)
            self._timed(started)
            poisoned = torch.isnan(logits).any(dim=1)
            picks = logits.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
        p_yes = self._p_yes(rows, reads, logits, packed, picks.clamp(min=0))
        back = torch.stack([picks.to(torch.float32), poisoned.to(torch.float32), p_yes], 1).tolist()
        return [Pick(-1 if bad else int(p), None if q != q else q) for p, bad, q in back]

    def _p_yes(self, rows, reads: list[ReadPoint], logits, packed, picks):
        """P(yes) = P(yes tokens) / P(yes or no tokens) under the mask, as sigmoid(logsumexp over the allowed yes
        tokens - logsumexp over the allowed no ones): the choice's columns only, never a softmax over the
        vocabulary. Closed: some yes and some no token allowed, and nothing else but neutral ones (a check on the
        packed bitmask's words). NaN where the choice is not closed or the pick decides nothing."""
        by_choice: dict[tuple[str, str], list[int]] = {}
        for k, read in enumerate(reads):
            if rows[read.slot].request.verdict_choice is not None:
                by_choice.setdefault(rows[read.slot].request.verdict_choice, []).append(k)
        p_yes = torch.full((len(reads),), float("nan"), device=self.device)
        for choice, ks in by_choice.items():
            choice_tokens = self._choice_tokens(choice)
            k_t = to_device(torch.tensor(ks, dtype=torch.long), self.device)
            mine, words = logits.index_select(0, k_t), packed.index_select(0, k_t)
            yes = masked_columns(mine, words, choice_tokens.yes).logsumexp(1)
            no = masked_columns(mine, words, choice_tokens.no).logsumexp(1)
            other = (words & choice_tokens.other_words).ne(0).any(1)
            closed = ~other & torch.isfinite(yes) & torch.isfinite(no)
            decisive = choice_tokens.decisive[picks.index_select(0, k_t)]
            value = torch.where(decisive & closed, torch.sigmoid(yes - no), torch.full_like(yes, float("nan")))
            p_yes = p_yes.index_copy(0, k_t, value)
        return p_yes

    def _choice_tokens(self, choice: tuple[str, str]) -> ChoiceTokens:
        if choice not in self._choices:
            self._choices[choice] = ChoiceTokens.of(choice, self.grammars.token_texts, self.device)
        return self._choices[choice]


@dataclass(frozen=True)
class ChoiceTokens:
    """A closed choice's tokens: those whose text (quotes and spaces stripped) starts with the yes character, with
    the no character, whether each token decides it, and the packed words of every token that is neither nor
    whitespace-only (a grammar allowing one of those is not a closed choice)."""

    yes: torch.Tensor  # token ids
    no: torch.Tensor
    decisive: torch.Tensor  # [vocab] bool
    other_words: torch.Tensor  # [words] int32, bit t set for such a token t

    @classmethod
    def of(cls, choice: tuple[str, str], texts: list[str], device) -> ChoiceTokens:
        stripped = [t.lstrip(' "') for t in texts]
        yes = np.array([t.startswith(choice[0]) for t in stripped])
        no = np.array([t.startswith(choice[1]) for t in stripped])
        neutral = np.array([t.strip() == "" and t != "" for t in texts])
        other = ~(yes | no | neutral)
        words = -(-len(texts) // 32)
        padded = np.zeros(words * 32, dtype=bool)
        padded[: len(texts)] = other
        packed = np.packbits(padded.reshape(words, 32), axis=1, bitorder="little").view(np.int32)[:, 0]
        return cls(
            yes=torch.from_numpy(np.flatnonzero(yes)).to(device),
            no=torch.from_numpy(np.flatnonzero(no)).to(device),
            decisive=torch.from_numpy(yes | no).to(device),
            other_words=torch.from_numpy(packed.copy()).to(device),
        )


def masked_columns(logits, packed, columns):
    """logits [rows, vocab] at these token columns, -inf where the row's packed mask ([rows, words] int32) does not
    allow the token: [rows, len(columns)]."""
    bits = (packed.index_select(1, columns // 32) >> (columns % 32).to(torch.int32)) & 1
    return logits.index_select(1, columns).masked_fill(bits == 0, float("-inf"))


def unpack(bitmask, vocab_size: int):
    """[rows, words] int32 bitmask -> [rows, vocab] bool, on the bitmask's device."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()
