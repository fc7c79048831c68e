"""Where judges live on this machine and what the presets say of them (presets.toml beside this module).

Plain data and paths, nothing loaded: the judge loader (judge.py) and the fetcher (judge_files.py) both read them.
"""

from __future__ import annotations

import os
from pathlib import Path

# The judge used when none is named: the smallest one measured to follow the judge's instructions (docs/judges.md).
DEFAULT_JUDGE = "qwen2.5-coder-1.5b"
# The embedded judge by name: fast, for tests and smoke runs; at chance on real data. `sumscore setup --judge` alone
# converts it.
FAST_JUDGE = "smollm2-135m"


def models_root() -> Path:
    """Where converted weights live: $OFFLINE_SUMSCORE_MODELS, else the checkout's models/converted when the
    package runs from a checkout (editable install), else ~/.cache/offline_sumscore/models."""
    env = os.environ.get("OFFLINE_SUMSCORE_MODELS")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2] / "models"
    if (checkout / "README.md").exists():
        return checkout / "converted"
    return Path.home() / ".cache" / "offline_sumscore" / "models"


def presets() -> dict[str, dict]:
    """The judge presets (offline_sumscore/engine/presets.toml): name -> fields."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    return tomllib.loads((Path(__file__).resolve().parent / "presets.toml").read_text())
