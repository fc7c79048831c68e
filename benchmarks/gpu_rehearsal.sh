#!/usr/bin/env bash
# benchmarks/gpu_check.sh rehearsed on this CPU as the GPU machine would run it: a fresh venv holding only what the
# GPU image holds that the check uses (torch, transformers at the image's version, numpy, pytest and the small
# packages of KINDS.md's list), the carried wheels installed from their folder alone (--no-index), the check's
# sections on an emulated GPU (--rehearse). What it proves that make test's rehearsal does not: nothing the check
# imports is missing from the image or the bundle, at the image's versions.
# Usage: benchmarks/gpu_rehearsal.sh   (about 5 minutes; writes .gpu/rehearsal/)
set -euo pipefail
IMAGE=.gpu/image-venv
if [ ! -x "$IMAGE/bin/python" ]; then
  python3 -m venv "$IMAGE"
  # The image's versions where they matter (transformers 5.17.0; torch 2.13.0 is the CPU build on this disk).
  "$IMAGE/bin/python" -m pip install -q torch==2.13.0 transformers==5.17.0 numpy jinja2 cloudpickle pillow attrs \
    typing_extensions click filelock safetensors accelerate pyyaml pytest tqdm
fi
py=$("$IMAGE/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
bash benchmarks/gpu_wheels.sh "$py" .gpu/whl-rehearsal
rm -rf /tmp/site-rehearsal
time PYTHON=$IMAGE/bin/python WHEELS=.gpu/whl-rehearsal OUT=$PWD/.gpu/rehearsal SITE=/tmp/site-rehearsal \
  CHECK_SECONDS=540 bash benchmarks/gpu_check.sh --rehearse --quick "$@"
