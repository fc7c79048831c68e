#!/usr/bin/env bash
# The one device call for a lent GPU (see benchmarks/README.md): the throughput ladder on Llama-3.1-8B's geometry
# with random bf16 weights. Run through the device tool from the repository root, carrying .gpu (git-ignored):
#   .gpu/whl        wheels for what the GPU image lacks (outlines, llguidance, pydantic, ...), Python 3.12
#   .gpu/tokenizer  the embedded judge's tokenizer files (no weights travel)
#   .gpu/data.jsonl one summary per SummEval document (source, summary), read by --data
# Writes $OUT/throughput_gpu.{json,md} and $OUT/log.txt.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/log.txt"
python3 -c "import torch, transformers, outlines, llguidance; print('torch', torch.__version__, 'transformers', \
transformers.__version__, 'outlines', outlines.__version__ if hasattr(outlines, '__version__') else '?', \
'llguidance', llguidance.__version__ if hasattr(llguidance, '__version__') else '?')" 2>&1 | tee -a "$OUT/log.txt"
timeout "${LADDER_SECONDS:-480}" python3 benchmarks/throughput.py --config gpu --tokenizer .gpu/tokenizer \
  --data .gpu/data.jsonl --out "$OUT/throughput_gpu" 2>&1 | tee -a "$OUT/log.txt" | grep -v '^{'
