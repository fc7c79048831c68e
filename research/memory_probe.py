"""Where a long run's memory goes, in-process: the embedded design on the soak's rows, in chunks through
score_many, and after each chunk the resident memory, the prefix store's fill, and glibc's heap (mallinfo2: its
arenas, the memory in use in them, the memory they hold free) beside the seconds per row.

    python -m research.memory_probe --rows 700            # the figures behind the prefix store's pool of blocks
    python -m research.memory_probe --rows 700 --trim     # malloc_trim(0) after every chunk, by hand
    python -m research.memory_probe --design generating --rows 300 --chunk 50   # the soak's generating design

Memory in use that stays flat while the arenas and the resident memory grow is fragmentation, not a leak. Linux with
glibc only (mallinfo2, malloc_trim). Prints one JSON line a chunk.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

from benchmarks.lib.soak_rows import make_rows
from offline_sumscore import SummarizationScorer

# the soak's generating design (benchmarks/soak.py GENERATING), as scorer options
GENERATING = dict(claims="sentences", coverage="questions", verdicts="yes-no", max_questions=3)
GENERATING.update(max_text_chars=120, max_reason_chars=60)


class MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()
    ]


def rss_mib() -> int:
    return next(int(line.split()[1]) // 1024 for line in open("/proc/self/status") if line.startswith("VmRSS"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=700)
    ap.add_argument("--chunk", type=int, default=100)
    ap.add_argument("--design", choices=["embedded", "generating"], default="embedded")
    ap.add_argument("--trim", action="store_true", help="malloc_trim(0) after every chunk")
    args = ap.parse_args()
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    rows = make_rows(args.rows)
    scorer = SummarizationScorer(cache=None, **(GENERATING if args.design == "generating" else {}))
    engine = scorer.engine
    for at in range(0, args.rows, args.chunk):
        started = time.perf_counter()
        part = rows[at : at + args.chunk]
        scorer.score_many([(r["source"], r["summary"]) for r in part], on_error="return")
        seconds = (time.perf_counter() - started) / len(part)
        if args.trim:
            libc.malloc_trim(0)
        heap, store = libc.mallinfo2(), engine.store
        record = {"rows": at + len(part), "rss_mib": rss_mib(), "s_per_row": round(seconds, 3)}
        record.update(store_tokens=store.tokens, store_entries=len(store), evictions=store.evictions)
        pool = store.pool
        if pool is not None:  # the pool's resident part: the blocks written so far
            block_bytes = pool.keys[:, :, :1].nbytes * 2
            record.update(pool_written_mib=round(pool.high_water * block_bytes / 2**20))
        record.update(spare_slots=[list(s.capacity) for s in engine.passes.spares])  # (slots, columns) each
        record.update(arena_mib=heap.arena >> 20, mmapped_mib=heap.hblkhd >> 20)
        record.update(in_use_mib=heap.uordblks >> 20, free_in_arena_mib=heap.fordblks >> 20)
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
