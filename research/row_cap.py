"""Bigger passes on a CPU: the full engine on the ladder's bulk workload under several row caps (batch_size), in turns.

    python -m research.row_cap --data DATA/summeval_dev.jsonl --caps 64,128,256 --samples 100 --repeats 2

The CPU default is 64 rows a batch (capacity.py). vLLM's CPU build schedules up to 256 sequences a step, and at bulk
its steps carry about 1,210 tokens against our passes' 527: each pass reads every weight once, so fewer, larger
passes read them fewer times. For each cap: wall, samples/s, forward passes, tokens per pass, and the verdicts
against the default cap's (flips; the largest change of a P(yes)). The caps run in turns (64, 128, 256, 256, 128,
64, ...) so the machine's drift falls on all of them. Prints a markdown table; writes results/row_cap.md (--name).
"""

from __future__ import annotations

from pathlib import Path

from offline_sumscore.engine.local import TransformersEngine
from research.bulk_turns import in_turns, turns_parser, turns_table, warm_bulk

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = turns_parser(__doc__.splitlines()[0], samples=100, name="row_cap")
    ap.add_argument("--caps", default="64,128,256")
    args = ap.parse_args()
    caps = [int(c) for c in args.caps.split(",")]
    judge, inputs, options = warm_bulk(args.data, args.samples)
    runs = in_turns(caps, lambda cap: TransformersEngine(judge, batch_size=cap), inputs, options, args.repeats, "cap")
    lines = [
        f"# Row cap on a CPU: the full engine on the bulk workload ({len(inputs)} samples, {args.repeats} runs a cap)",
        "",
        *turns_table(runs, caps, len(inputs), "rows a batch"),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / f"{args.name}.md").write_text(text)


if __name__ == "__main__":
    main()
