"""Run by the vLLM tests in vLLM's own environment (.venv-vllm): the demo rows scored by VLLMEngine in each design
the parity test compares, written as JSON (argv[1]). vLLM spawns its engine process: hence the __main__ guard."""

import json
import sys

from tests.vllm.designs import DESIGNS, demo_rows, score_all

if __name__ == "__main__":
    from offline_sumscore.engine.vllm_engine import VLLMEngine

    engine = VLLMEngine(enforce_eager=True)  # no compile: the first compile takes minutes on 2 cores
    rows = score_all(engine, demo_rows())
    json.dump({"describe": engine.describe(), "rows": rows, "designs": list(DESIGNS)}, open(sys.argv[1], "w"))
