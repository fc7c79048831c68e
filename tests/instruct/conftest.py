"""The instruct tier: the design users run, on Qwen2.5-Coder-1.5B-Instruct, the default judge (`make setup` fetches
it). Behaviour that depends on judging well is asserted here, never exact scores."""

from __future__ import annotations

import pytest

INSTRUCT_JUDGE = "qwen2.5-coder-1.5b"


@pytest.fixture(scope="session")
def instruct_judge():
    from offline_sumscore.engine.judge import load_judge

    # Absent, this fails with the one line that says how to get it: the tier never skips silently.
    return load_judge(INSTRUCT_JUDGE)
