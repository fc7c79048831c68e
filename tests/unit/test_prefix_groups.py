"""How the engine groups requests that share a prompt prefix (no model: rows with token lists only)."""

from offline_sumscore.engine.local.rows import Row
from offline_sumscore.engine.local.scheduler import split_by_prefix

PREAMBLE = list(range(1000, 1030))  # a chat template's system turn and the start of the user turn: 30 tokens


def row(i, tokens):
    return Row(ticket=i, request=None, prompt="", prompt_ids=list(tokens), cap=0)


def test_rows_sharing_a_source_group_together_across_samples():
    source = list(range(2000, 2800))
    rows = [row(i, PREAMBLE + source + [9, i]) for i in range(3)]
    assert [len(g) for g in split_by_prefix(rows)] == [3]


def test_a_short_prompt_never_pulls_long_ones_into_a_group_that_shares_only_the_preamble():
    # Two sources of 800 tokens and baseline prompts of 60: all share the 30-token preamble. Before, a run took in
    # any row sharing half of its shortest prompt, so one baseline chained everything into one group whose prefix
    # was the preamble: every source was then run in full, row by row (7 GB and 4x the time on REALSumm).
    a = [row(i, PREAMBLE + list(range(2000, 2800)) + [9, i]) for i in range(3)]
    b = [row(10 + i, PREAMBLE + list(range(3000, 3800)) + [9, i]) for i in range(3)]
    base = [row(20 + i, PREAMBLE + [5, 6, 7] + list(range(i, i + 27))) for i in range(4)]
    groups = split_by_prefix(a + b + base)
    family = {r.ticket: name for name, members in (("a", a), ("b", b), ("base", base)) for r in members}
    assert all(len({family[r.ticket] for r in g}) == 1 for g in groups)  # no group mixes a source with anything
    assert sorted(len(g) for g in groups if family[g[0].ticket] != "base") == [3, 3]  # each source shared by its 3
    for g in groups:
        longest = max(len(r.prompt_ids) for r in g)
        common = min(len(_common(g[0].prompt_ids, r.prompt_ids)) for r in g)
        assert len(g) == 1 or common >= longest // 2


def _common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
