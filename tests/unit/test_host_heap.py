"""The host heap is handed back every TRIM_EVERY forward passes, counted, and never where the C library has no
malloc_trim."""

from offline_sumscore.engine.cpu.host_heap import HeapTrimmer
from offline_sumscore.engine.local.features import EngineStats


def test_the_heap_is_trimmed_every_so_many_passes_and_counted():
    stats, calls = EngineStats(), []
    trimmer = HeapTrimmer(stats, every=10)
    trimmer._trim = calls.append
    for passes in (3, 9, 10, 15, 19, 20, 31):
        stats.forward_passes = passes
        trimmer.after_step()
    assert calls == [0, 0, 0] and stats.heap_trims == 3  # at 10, 20 and 31 passes
    assert stats.heap_trim_seconds >= 0


def test_without_malloc_trim_nothing_is_called():
    stats = EngineStats()
    trimmer = HeapTrimmer(stats, every=1)
    trimmer._trim = None
    stats.forward_passes = 5
    trimmer.after_step()
    assert stats.heap_trims == 0


def test_on_this_linux_the_c_library_has_malloc_trim():
    import sys

    if sys.platform.startswith("linux"):
        assert HeapTrimmer(EngineStats())._trim is not None
