#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py) on a GPU machine with no network, in one command, within 8 minutes.
# Prepared on a machine with the registries, in one command: `make gpu-bundle` writes .gpu/ (git-ignored, at most
# 60 MiB): the wheels the GPU image lacks, for its Python, and the embedded judge's tokenizer and config (no weights).
#   device tool: run `bash benchmarks/gpu_check.sh`, carry [".gpu"]; the table comes back in $OUT (gpu_check.md)
# Rehearsed on the CPU by `python -m benchmarks.gpu_check --rehearse` (in make test) and, with the image's own
# package versions in a venv of their own, by benchmarks/gpu_rehearsal.sh.
set -o pipefail
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.gpu/whl}
OUT=${OUT:-$PWD/gpu_out}
SITE=${SITE:-/tmp/site}
SECONDS_LEFT=${CHECK_SECONDS:-450}
mkdir -p "$OUT"
ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no wheels in $WHEELS: run make gpu-bundle on a machine with the registries, and carry .gpu" >&2; exit 1; }
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHEELS"/*.whl 2>&1 | tee "$OUT/log.txt" || { echo "the carried wheels did not install" >&2; exit 1; }
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OUT
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$OUT/log.txt"
timeout "$SECONDS_LEFT" "$PYTHON" -m benchmarks.gpu_check --tokenizer .gpu/tokenizer --out "$OUT" "$@" 2>&1 \
  | tee -a "$OUT/log.txt"
status=${PIPESTATUS[0]}
echo "gpu check exit status: $status (124: cut at ${SECONDS_LEFT} s; the table holds what ran)" | tee -a "$OUT/log.txt"
exit "$status"
