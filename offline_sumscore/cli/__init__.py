"""The `sumscore` command line: one module per group of commands, all on one click group (app.main). May import
every layer below it.

Flags are kebab-case and map 1:1 to the scorers' keyword arguments; each default is read from the scorer's
signature, so it is defined once. Exit codes: 0 every row scored; 1 some rows failed (each recorded in OUTPUT with
its error); 2 bad usage or input; 3 INPUT holds no rows; 4 a file could not be written; 130 interrupted (Ctrl-C) and
143 terminated (SIGTERM), the rows scored so far kept. Errors are one line, never a traceback.
"""

from offline_sumscore.cli import calibrate, judges, results, score  # noqa: F401 - each registers its commands on main
from offline_sumscore.cli.app import main

__all__ = ["main"]
