"""The scheduler's decisions without a model: the prefix store (lookup, extension, LRU eviction) and the plan feed
(each sample's next wave is ready the moment its own answers are in; new samples join while others run)."""

import torch

from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import stream_in_waves
from offline_sumscore.engine.local.prefix_store import STORE_BLOCK, PrefixStore
from offline_sumscore.scorers.base import PlanFeed
from offline_sumscore.scorers.stages.verdict import YesNoVerdict


def kv(tokens, layers=2):
    """Fake keys and values whose entries are the token ids, so a slice shows which tokens it holds."""
    t = torch.tensor(tokens, dtype=torch.float32)[None, None, :, None]
    return [(t.clone(), -t.clone()) for _ in range(layers)]


def test_the_store_serves_the_longest_common_prefix_of_any_stored_prompt():
    store = PrefixStore(budget=1000)
    source = list(range(100, 180))
    store.add(source + [1, 2, 3], kv(source + [1, 2, 3]))
    found, n = store.lookup(source + [7, 8])
    assert n == len(source)  # the claim after the source differs: only the source is reused
    assert found[0][0][0, 0, :, 0].tolist() == source and found[1][1][0, 0, :, 0].tolist() == [-t for t in source]
    assert store.lookup(list(range(500, 540))) == (None, 0)
    assert store.lookup(source[: STORE_BLOCK - 1]) == (None, 0)  # shorter than one block: not worth a lookup


def test_an_entry_that_extends_another_replaces_it_and_the_oldest_goes_first_under_the_budget():
    store = PrefixStore(budget=100)
    a, b = list(range(0, 40)), list(range(1000, 1040))
    store.add(a, kv(a))
    store.add(a + [5] * 20, kv(a + [5] * 20))
    assert len(store) == 1 and store.tokens == 60  # the shorter entry is covered by the longer one
    store.add(b, kv(b))  # 100 tokens: at the budget
    assert len(store) == 2 and store.evictions == 0
    store.lookup(a)  # a is now the most recently used
    c = list(range(2000, 2030))
    store.add(c, kv(c))  # 130 tokens: the least recently used (b) goes
    assert store.evictions == 1 and store.lookup(b) == (None, 0) and store.lookup(a)[1] == 40
    assert store.tokens == 90
    # Evicted entries leave no nodes behind: a store emptied by eviction has an empty tree.
    store.add(list(range(3000, 3100)), kv(list(range(3000, 3100))))
    assert len(store) == 1 and set(store.root) == {tuple(range(3000, 3000 + STORE_BLOCK))}


def request(sample, stage):
    return StageRequest(sample, stage, ({"role": "user", "content": stage},), YesNoVerdict)


def answer(req):
    return StageResult(request=req, value=YesNoVerdict(verdict=True), raw_output="Yes")


def plan(name, waves, log):
    got = []
    for w in range(waves):
        results = yield [request(name, f"{name}.w{w}.{k}") for k in range(2)]
        got.append(len(results))
        log.append(f"{name} finished wave {w}")
    return (name, got)


def test_a_sample_moves_to_its_next_wave_as_soon_as_its_own_answers_are_in_and_new_samples_join():
    log, done = [], {}
    feed = PlanFeed([plan("a", 2, log), plan("b", 1, log), plan("c", 1, log)], done.__setitem__, in_flight=2)
    first = feed.take()
    assert [r.stage for _, r in first] == ["a.w0.0", "a.w0.1", "b.w0.0", "b.w0.1"]  # c waits: 2 in flight
    for ticket, req in first[:2]:  # a's answers only
        feed.give(ticket, answer(req))
    assert [r.stage for _, r in feed.take()] == ["a.w1.0", "a.w1.1"]  # a goes on while b is still out
    for ticket, req in first[2:]:
        feed.give(ticket, answer(req))
    assert done == {1: ("b", [2])}
    assert [r.stage for _, r in feed.take()] == ["c.w0.0", "c.w0.1"]  # b's slot went to c


def test_in_waves_an_engine_gets_one_call_per_wave_across_samples():
    class Recorder:
        calls = []

        def run(self, reqs):
            self.calls.append([r.stage for r in reqs])
            return [answer(r) for r in reqs]

    log, done = [], {}
    stream_in_waves(Recorder(), PlanFeed([plan("a", 2, log), plan("b", 1, log)], done.__setitem__, in_flight=8))
    assert Recorder.calls == [["a.w0.0", "a.w0.1", "b.w0.0", "b.w0.1"], ["a.w1.0", "a.w1.1"]]
    assert done == {0: ("a", [2, 2]), 1: ("b", [2])}


def test_the_store_keeps_its_prefixes_in_one_pool_of_blocks_that_eviction_hands_back():
    store = PrefixStore(budget=64)  # 4 blocks of 16, plus one for a part-filled last block
    a, b, c = list(range(0, 40)), list(range(100, 130)), list(range(200, 250))
    store.add(a, kv(a))
    pool = store.pool
    assert pool is not None and pool.keys.shape[2] == 64 // STORE_BLOCK + 1  # [layers, kv heads, blocks, ...]
    store.add(b, kv(b))  # 40 + 30 tokens > 64: a goes
    assert store.evictions == 1 and store.lookup(a) == (None, 0)
    found, n = store.lookup(b + [9])
    assert n == 30 and found[0][0][0, 0, :, 0].tolist() == b and found[1][1][0, 0, :, 0].tolist() == [-t for t in b]
    store.add(c, kv(c))  # b goes; c's 50 tokens take 4 blocks, the ones a and b held among them
    assert store.pool is pool and sorted(pool.free + store.entries[store.exact[tuple(c)]].blocks) == list(range(5))
    found, n = store.lookup(c)
    assert n == 50 and found[0][0][0, 0, :, 0].tolist() == c  # a part-filled last block reads back whole
