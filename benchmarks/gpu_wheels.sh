#!/usr/bin/env bash
# The GPU check's bundle (make gpu-bundle), for a GPU machine without network: the wheels it lacks, for its Python,
# and the embedded judge's tokenizer and config (no weights), in a git-ignored folder (.gpu/) that travels with the
# repository; then two checks made here, before the machine's time is spent:
#   1. the bundle's size, against what may travel with a device call (LIMIT_MIB, 58: the call carries 64 in all);
#   2. a dry-run install from those wheels and the packages the machine already has (IN_IMAGE, no index): every
#      requirement resolves without a network.
# What any such machine needs already installed (too large to carry): Python with pip, a CUDA build of torch and
# transformers>=5; IN_IMAGE lists the small packages this assumes it has (add them to CARRIED where it lacks them).
# Usage: benchmarks/gpu_wheels.sh [PYTHON_VERSION] [DEST]
#   benchmarks/gpu_wheels.sh 3.12 .gpu/whl   # the H200 image's Python (make gpu-bundle)
#   benchmarks/gpu_wheels.sh 3.11 .gpu/whl-rehearsal   # the CPU rehearsal (benchmarks/gpu_rehearsal.sh)
set -euo pipefail
PY_VERSION=${1:-3.12}
DEST=${2:-.gpu/whl}
# Versions as tested here (pip freeze of the project's venv). The image has the rest of what these need: jinja2,
# cloudpickle, pillow, attrs, typing-extensions, numpy, click, filelock (KINDS.md's package list).
CARRIED=(outlines==1.3.3 outlines_core==0.2.14 llguidance==1.9.1 pydantic==2.14.4 pydantic_core==2.50.5
         annotated-types==0.8.0 typing-inspection==0.4.5 diskcache==5.6.3 genson==1.4.0 jsonschema==4.26.0
         jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1)
IN_IMAGE=(jinja2==3.1.6 markupsafe==3.0.4 cloudpickle==3.1.3 pillow==13.0.0 attrs==26.1.0 typing_extensions==4.16.0)
PLATFORMS=()
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 \
         manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do PLATFORMS+=(--platform "$p"); done
LIMIT_MIB=${LIMIT_MIB:-58}  # the whole bundle: a device call carries 64 MiB in all, the repository's 4-5 among them

download() {  # into $1
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
    "${PLATFORMS[@]}" -d "$@"
}
rm -rf "$DEST" && mkdir -p "$DEST"
download "$DEST" "${CARRIED[@]}"
size=$(du -sm "$DEST" | cut -f1)
echo "$(ls "$DEST" | wc -l) wheels for Python $PY_VERSION in $DEST: ${size} MiB (limit ${LIMIT_MIB} MiB)"
[ "$size" -le "$LIMIT_MIB" ] || { echo "too large to carry: ${size} MiB > ${LIMIT_MIB} MiB" >&2; exit 1; }

# The dry run: the image's own packages stand in as wheels in a scratch folder (they are not carried).
image=$(mktemp -d)
trap 'rm -rf "$image"' EXIT
download "$image" "${IN_IMAGE[@]}"
names=("${CARRIED[@]%%==*}")
python3 -m pip install -q --dry-run --ignore-installed --no-index --find-links "$DEST" --find-links "$image" \
  --only-binary=:all: --python-version "$PY_VERSION" --implementation cp "${PLATFORMS[@]}" --target "$image/t" \
  --report "$image/report.json" "${CARRIED[@]}"
python3 - "$image/report.json" "$DEST" <<'PY'
import json, os, sys
report, dest = json.load(open(sys.argv[1])), sys.argv[2]
carried = {f for f in os.listdir(dest)}
chosen = [os.path.basename(i["download_info"]["url"]) for i in report["install"]]
missing = [c for c in chosen if c not in carried]
print(f"dry run: {len(chosen)} packages resolve offline; from the image: {', '.join(sorted(missing)) or 'none'}")
PY

# What the check reads there besides the wheels: the embedded judge's tokenizer, chat template and config (its
# geometry, filled with random weights there: the weights themselves are 513 MiB).
mkdir -p .gpu/tokenizer
judge=${OFFLINE_SUMSCORE_MODELS:-models/converted}/SmolLM2-135M-Instruct  # where `make setup` converted it
cp "$judge"/{tokenizer.json,tokenizer_config.json,chat_template.jinja,config.json,generation_config.json} .gpu/tokenizer/
total=$(du -sm .gpu --exclude=image-venv --exclude='whl-rehearsal' | cut -f1)
echo "carry .gpu: ${total} MiB ($(ls .gpu | tr '\n' ' '))"
[ "$total" -le "$LIMIT_MIB" ] || { echo "the bundle is too large to carry: ${total} MiB > ${LIMIT_MIB} MiB" >&2; exit 1; }
