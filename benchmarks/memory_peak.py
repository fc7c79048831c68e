"""The most memory a command's processes held at once, as memory in use (PSS) and as the kernel's resident maximum.

    python -m benchmarks.memory_peak [--watch PID] [--every 0.25] [--out FILE.json] -- COMMAND ...

Runs COMMAND and, until it exits, reads the proportional set size (PSS, /proc/PID/smaps_rollup) of every process
in its tree, or of the process --watch names (a server the command talks to), every --every seconds; prints one JSON
line: the highest sum seen, the kernel's resident maximum (VmHWM) of each process read, the command's exit status
and its wall time.

Why both: resident memory (VmRSS, VmHWM, ru_maxrss, /usr/bin/time's "Maximum resident set size") counts a page once
for every address it is mapped at, and our engine maps one copy of a shared prompt prefix into every row's KV slot
(engine/local/shared_pages.py), so there it counts the prefix once a row. PSS counts a page once (split among the
processes that map it), which is the memory a machine has given. For a process that maps nothing twice, as
llama-server, the two agree. A peak between two readings goes unseen, so PSS's peak is a lower bound by at most what
a quarter-second allocates.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks.lib.process_memory import watch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--watch", type=int, help="read this process (a server) instead of the command's tree")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between readings")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (put it after --)")
    if args.watch and not os.path.exists(f"/proc/{args.watch}"):
        parser.error(f"no process {args.watch} to watch")
    result = watch(command, args.watch, args.every)
    line = json.dumps(result)
    if args.out:
        args.out.write_text(line + "\n")
    print(line)
    return result["returncode"]


if __name__ == "__main__":
    sys.exit(main())
