"""What two runs of the same work may differ in (row_diff): timing and the engine's memory-derived sizing, never a
verdict."""

import copy

from benchmarks.lib.row_diff import differing_rows

ROW = {
    "id": "r0",
    "score": 0.5,
    "claims": [{"claim": "A tram line was approved.", "supported": True}],
    "stages": {"claims": {"seconds": 1.2, "cached": False, "batch_size": 4}},
    "run_config": {"engine": {"max_rows": 64, "token_budget": 131072, "prefix_store": 32768, "capacity": "..."}},
}


def test_rows_that_differ_only_in_timing_and_memory_derived_sizing_are_the_same_work():
    other = copy.deepcopy(ROW)
    other["stages"]["claims"].update(seconds=3.4, cached=True, batch_size=1)
    other["run_config"]["engine"].update(token_budget=65536, prefix_store=16384, capacity="less free memory")
    assert differing_rows([ROW], [other]) == []


def test_a_changed_verdict_or_row_cap_is_a_difference():
    flipped, fewer_rows = copy.deepcopy(ROW), copy.deepcopy(ROW)
    flipped["claims"][0]["supported"] = False
    fewer_rows["run_config"]["engine"]["max_rows"] = 8
    assert differing_rows([ROW, ROW], [flipped, fewer_rows]) == [0, 1]
