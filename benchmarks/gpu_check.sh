#!/usr/bin/env bash
# The throughput ladder on any GPU machine without network, in one command (see benchmarks/README.md): Llama-3.1-8B's
# geometry with random bf16 weights and Llama-3's 128k vocabulary, the full engine first, results written after
# every rung. Prepare on a machine with network first (nothing is fetched on the GPU machine):
#   DATA=FILE benchmarks/gpu_wheels.sh 3.12 .gpu/whl   # the wheels it lacks, size-checked, dry-run resolved
# which also writes .gpu/tokenizer (the embedded judge's tokenizer files, no weights) and .gpu/data.jsonl (SummEval
# sources and summaries). .gpu is git-ignored: copy it to the GPU machine with the repository.
#   run: bash benchmarks/gpu_check.sh            carry: [".gpu"]
# Rehearsed on the CPU by benchmarks/gpu_rehearsal.sh (PYTHON, WHEELS, OUT and extra ladder arguments, such as
# --allow-cpu --layers 1, are taken from the environment and the command line).
# Writes $OUT/throughput_gpu.{json,md} and $OUT/log.txt.
set -o pipefail
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu/whl}
OUT=${OUT:-$PWD/gpu_out}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS: run benchmarks/gpu_wheels.sh first" >&2; exit 1; }
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHEELS"/*.whl 2>&1 | tee "$OUT/log.txt" || { echo "the carried wheels did not install" >&2; exit 1; }
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$OUT/log.txt"
"$PYTHON" -c "
import torch, transformers, outlines, llguidance, pydantic, offline_sumscore.engine.local
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__,
      'llguidance', getattr(llguidance, '__version__', '?'), 'pydantic', pydantic.VERSION)
" 2>&1 | tee -a "$OUT/log.txt" || { echo "an import failed: see $OUT/log.txt" >&2; exit 1; }
timeout "${LADDER_SECONDS:-480}" "$PYTHON" benchmarks/throughput.py --config gpu --tokenizer .gpu/tokenizer \
  --data .gpu/data.jsonl --out "$OUT/throughput_gpu" "$@" 2>&1 | tee -a "$OUT/log.txt" | grep -v '^{'
status=${PIPESTATUS[0]}
echo "ladder exit status: $status" | tee -a "$OUT/log.txt"
exit "$status"
