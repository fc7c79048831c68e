"""Draft tokens for speculative decoding, found by n-gram lookup: no draft model, nothing to load.

A judge's outputs repeat what it has read and what it has written: a reason quotes the statement or the article, a
list of questions repeats its own opening, and the reasons of one stage open alike from row to row. So the tokens
that followed the last few tokens of a row's context elsewhere are a good guess at what follows them now. Three
places are searched, longest match first: the row's own prompt and output (prompt lookup decoding) and the outputs
that earlier rows of the same grammar produced (suffix decoding across requests). A guess is cut where the row's
grammar would refuse it, with the tokens the grammar forces inserted as decoding would insert them (Drafter.fit).
A step feeds it after the row's pending tokens in one forward pass and keeps the longest prefix the judge's own
greedy picks agree with, plus the pick that disagreed: the output is what decoding token by token would give, in
fewer passes.

Deterministic: a draft depends only on the tokens seen so far, in the order the engine saw them.
"""

from __future__ import annotations

from dataclasses import dataclass

LONGEST = 4  # n-gram lengths looked up, longest first
SHORTEST = 2  # a one-token match guesses badly: 7% of the tokens it proposed were kept on the ladder's workload
IN_PROMPT = 3  # a match in the prompt needs this many tokens
SEPARATOR = -1  # between outputs in a grammar's history: no n-gram spans it, no draft runs past it


class NgramIndex:
    """A growing token sequence and, for every n-gram in it (n = 1..LONGEST), where its latest two occurrences
    end: the latest may be the sequence's own tail, whose continuation is what is being guessed."""

    def __init__(self, tokens: list[int] | tuple[int, ...] = ()):
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], tuple[int, int]] = {}
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, tokens) -> None:
        seq, ends = self.tokens, self.ends
        for token in tokens:
            seq.append(token)
            end = len(seq)
            if token == SEPARATOR:
                continue
            for n in range(1, min(LONGEST, end) + 1):
                key = tuple(seq[end - n : end])
                if SEPARATOR in key:
                    break
                found = ends.get(key)
                ends[key] = (found[1] if found else -1, end)

    def continuation(self, key: tuple[int, ...], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of key (not one ending at the tail)."""
        return self.continuation_at(key, k)[0]

    def continuation_at(self, key: tuple[int, ...], k: int) -> tuple[list[int], int]:
        """continuation(), and where that occurrence of key ends (-1: none)."""
        found = self.ends.get(key)
        if found is None:
            return [], -1
        end = found[1] if found[1] < len(self.tokens) else found[0]
        if end < 0:
            return [], -1
        out = self.tokens[end : end + k]
        if SEPARATOR in out:
            out = out[: out.index(SEPARATOR)]
        return out, end


class DraftHistory:
    """The outputs of finished rows, per grammar, as one index each; the oldest half is dropped past `limit`
    tokens a grammar."""

    def __init__(self, limit: int = 1 << 15):
        self.limit = limit
        self.by_grammar: dict[object, NgramIndex] = {}

    def learn(self, grammar, output: list[int]) -> None:
        if not output:
            return
        index = self.by_grammar.get(grammar)
        if index is None:
            index = self.by_grammar[grammar] = NgramIndex()
        elif len(index) + len(output) + 1 > self.limit:
            kept = index.tokens[len(index.tokens) // 2 :]
            kept = kept[kept.index(SEPARATOR) + 1 :] if SEPARATOR in kept else []
            index = self.by_grammar[grammar] = NgramIndex(kept)
        index.extend(list(output) + [SEPARATOR])

    def index(self, grammar) -> NgramIndex | None:
        return self.by_grammar.get(grammar)


def propose(context: NgramIndex, history: NgramIndex | None, k: int, prompt_length: int = 0) -> tuple[list[int], int]:
    """Up to k tokens guessed to follow context (the row's prompt, its first prompt_length tokens, and its output
    so far), and the length of the match they came from (0: none). Longer matches first; at one length the row's
    own context, then the grammar's history. A match in the prompt needs IN_PROMPT tokens, one in an output
    SHORTEST: a two-token phrase recurs by chance in a prompt of hundreds of tokens, rarely in a short output."""
    tail = context.tokens
    for n in range(min(LONGEST, len(tail)), SHORTEST - 1, -1):
        key = tuple(tail[-n:])
        guess, end = context.continuation_at(key, k)
        if guess and (n >= IN_PROMPT or end > prompt_length):
            return guess, n
        if history is not None:
            guess = history.continuation(key, k)
            if guess:
                return guess, n
    return [], 0


@dataclass
class Draft:
    """A row's guessed continuation as fitted to its grammar: tokens, which of them the grammar forces (inserted
    unread, as Sampler.take_forced inserts them), and whether the grammar is complete after the last."""

    tokens: list[int]
    forced: list[bool]
    stopped: bool

    def read_points(self) -> list[int]:
        """m >= 1 where the judge's pick is read after m draft tokens: before each guessed (not forced) token, and
        after the last unless the grammar is complete there."""
        n = len(self.tokens)
        return [m for m in range(1, n) if not self.forced[m]] + ([n] if n and not self.stopped else [])


DRAFT_TOKENS = 8  # guessed tokens a row at most
DRAFT_BUDGET_CPU, DRAFT_BUDGET_GPU = 64, 1024  # guessed tokens a pass at most, less the pass's own tokens


class Drafter:
    """Drafts for the rows of a step: up to `tokens` guessed tokens a row and `budget` a pass. A guessed token
    costs a token's compute whether it is kept or not: about 1.5 ms on the 2-core CPU, where a pass costs about
    45 ms before its tokens; on a GPU a pass reads every weight once and a few hundred tokens ride along."""

    def __init__(self, *, enabled: bool, forced_tokens: bool, gpu: bool, eos_ids):
        self.tokens = DRAFT_TOKENS if enabled else 0
        self.budget = DRAFT_BUDGET_GPU if gpu else DRAFT_BUDGET_CPU
        self.forced_tokens, self.eos_ids = forced_tokens, eos_ids
        self.history = DraftHistory()  # finished outputs per grammar, the drafts' second source

    def learn(self, row) -> None:
        """A finished row's output joins its grammar's history."""
        if self.tokens:
            self.history.learn(row.request.grammar, [t for t in row.out if t not in self.eos_ids])

    def propose(self, rows, feeding: list[int], fed: int, pass_tokens: int) -> dict[int, Draft]:
        """Drafts for the rows in these slots, rows with the longer matches first. A guessed token pays where a
        pass has few tokens (its cost is then mostly the weights' reading), so the budget is what the pass's own
        tokens (fed) leave of it, and never more than its token budget (pass_tokens) leaves."""
        if not self.tokens:
            return {}
        guesses = []
        for s in feeding:
            row = rows[s]
            room = min(self.tokens, row.cap - len(row.out) - 1)
            if room <= 0:
                continue
            guess, matched = propose(row.ngrams(), self.history.index(row.request.grammar), room, len(row.prompt_ids))
            if guess:
                guesses.append((-matched, s, guess))
        drafts, budget = {}, min(self.budget, pass_tokens) - fed
        for _, s, guess in sorted(guesses):
            if budget <= 0:
                break
            draft = self.fit(rows[s], guess[:budget])
            if draft.tokens:
                drafts[s] = draft
                budget -= len(draft.tokens)
        return drafts

    def fit(self, row, guess: list[int]) -> Draft:
        """The longest start of guess the row's grammar admits, with forced tokens inserted after each guessed
        token as decoding would insert them; the matcher is rolled back to where it was."""
        matcher, tokens, forced, at = row.matcher, [], [], 0
        while at < len(guess) and len(tokens) < len(guess):
            token = guess[at]
            if token in self.eos_ids or matcher.try_consume_tokens([token]) != 1:
                break
            tokens.append(token)
            forced.append(False)
            at += 1
            if self.forced_tokens:
                fixed = matcher.compute_ff_tokens()
                if fixed:
                    taken = matcher.try_consume_tokens(fixed)
                    tokens += fixed[:taken]
                    forced += [True] * taken
                    if taken < len(fixed) or guess[at : at + len(fixed)] != fixed:
                        break  # the guess parts from the text the grammar fixes
                    at += len(fixed)
            if matcher.is_stopped():
                break
        stopped = matcher.is_stopped()
        matcher.rollback(len(tokens))
        return Draft(tokens, forced, stopped)
