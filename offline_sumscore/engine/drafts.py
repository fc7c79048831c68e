"""Draft tokens for speculative decoding, found by n-gram lookup: no draft model, nothing to load.

A judge's outputs repeat what it has read and what it has written: a reason quotes the statement or the article, a
list of questions repeats its own opening, and the reasons of one stage open alike from row to row. So the tokens
that followed the last few tokens of a row's context elsewhere are a good guess at what follows them now. Three
places are searched, longest match first: the row's own prompt and output (prompt lookup decoding) and the outputs
that earlier rows of the same grammar produced (suffix decoding across requests). The executor feeds the guess
after the row's pending tokens in one forward pass and keeps the longest prefix the judge's own greedy picks agree
with, plus the pick that disagreed: the output is what decoding token by token would give, in fewer passes.

Deterministic: a draft depends only on the tokens seen so far, in the order the engine saw them.
"""

from __future__ import annotations

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
