"""What a model file says of itself before any weight is read: its chat template, architecture and context length.

A judge answers chat prompts, so a model without a chat template (a base model) cannot judge; neither can an
architecture transformers does not load from GGUF, nor a context too short for the stages' instructions. Each is read
from the GGUF header (the key-value block at the front of the file, read here without touching the tensors: under a
second for any size) or from a model directory's config.json and tokenizer files, and refused in one line before the
weights are loaded or a GGUF is converted (converting a 250 MB file took over two minutes before it was refused).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from offline_sumscore.core.errors import ModelLoadError

# The stages' instructions and a verdict's room take several hundred tokens before any source text.
MIN_CONTEXT = 1024

# GGUF's value types (the format's specification): each fixed-width one as struct reads it, and its size
_UNPACK = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_FIXED = {kind: struct.calcsize(form) for kind, form in _UNPACK.items()}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class ModelHeader:
    """What a model says of itself; None where it does not say."""

    path: Path
    architecture: str | None
    context_length: int | None
    has_chat_template: bool
    where: str  # where the chat template is looked for, for the error


def read_gguf_metadata(path: Path) -> dict[str, object]:
    """The GGUF header's key-value pairs, strings and numbers (arrays are skipped, not read: a vocabulary's 150,000
    tokens are passed over by their lengths). Raises ModelLoadError for a file that is not GGUF or is cut short."""
    try:
        with open(path, "rb") as f:

            def take(n: int) -> bytes:
                data = f.read(n)
                if len(data) != n:
                    raise EOFError
                return data

            def number(kind: int):
                return struct.unpack(_UNPACK[kind], take(_FIXED[kind]))[0]

            def text() -> str:
                return take(number(10)).decode("utf-8", errors="replace")

            def skip(kind: int) -> None:
                if kind in _FIXED:
                    f.seek(_FIXED[kind], 1)
                elif kind == _STRING:
                    f.seek(number(10), 1)
                elif kind == _ARRAY:
                    inner, count = number(4), number(10)
                    if inner in _FIXED:
                        f.seek(_FIXED[inner] * count, 1)
                    else:
                        for _ in range(count):
                            skip(inner)
                else:
                    raise ValueError(f"value type {kind}")

            if take(4) != b"GGUF":
                raise ModelLoadError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
            version = number(4)
            if version < 2:
                raise ModelLoadError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
            number(10)  # the tensors' count: their descriptions follow the metadata, and are not read
            metadata: dict[str, object] = {}
            for _ in range(number(10)):
                key, kind = text(), number(4)
                if kind == _STRING:
                    metadata[key] = text()
                elif kind in _FIXED:
                    metadata[key] = number(kind)
                else:
                    skip(kind)
            return metadata
    except (EOFError, ValueError, KeyError, struct.error, OSError) as exc:
        raise ModelLoadError(
            f"{path} is truncated or corrupt and its GGUF header cannot be read ({type(exc).__name__}); copy the file "
            "again"
        ) from None


def _gguf_header(path: Path) -> ModelHeader:
    metadata = read_gguf_metadata(path)
    arch = metadata.get("general.architecture")
    context = metadata.get(f"{arch}.context_length")
    return ModelHeader(
        path=path,
        architecture=str(arch) if arch is not None else None,
        context_length=int(context) if isinstance(context, int) else None,
        has_chat_template=bool(metadata.get("tokenizer.chat_template")),
        where="the GGUF key tokenizer.chat_template",
    )


def _directory_header(path: Path) -> ModelHeader:
    def json_file(name: str) -> dict:
        try:
            return json.loads((path / name).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{path / name} cannot be read as JSON: {exc}") from None

    config = json_file("config.json")
    text = config.get("text_config") or config
    architectures = config.get("architectures") or []
    context = text.get("max_position_embeddings") or text.get("n_positions") or text.get("seq_length")
    template = (
        bool(json_file("tokenizer_config.json").get("chat_template"))
        or (path / "chat_template.jinja").exists()
        or bool(json_file("chat_template.json").get("chat_template"))
        or any((path / "additional_chat_templates").glob("*.jinja"))
    )
    return ModelHeader(
        path=path,
        architecture=architectures[0] if architectures else config.get("model_type"),
        context_length=int(context) if isinstance(context, int) else None,
        has_chat_template=template,
        where="tokenizer_config.json's chat_template, chat_template.jinja or chat_template.json",
    )


def read_header(path: Path) -> ModelHeader:
    """What a .gguf file or a model directory says of itself, without loading a weight."""
    return _gguf_header(path) if path.is_file() else _directory_header(path)


def refuse_unable(path: Path) -> ModelHeader:
    """The header of a model that can judge; raises ModelLoadError, in one line naming what is missing, for one that
    cannot: no chat template, an architecture transformers cannot load from GGUF, or a context under MIN_CONTEXT."""
    header = read_header(path)
    if not header.has_chat_template:
        raise ModelLoadError(
            f"{path} has no chat template ({header.where}): a base model cannot follow a judge's instructions; pass "
            "an instruct/chat model (refused before loading any weight)"
        )
    if path.is_file():
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

        if header.architecture not in GGUF_SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"{path}: architecture {header.architecture!r}, which transformers does not load from GGUF (it loads "
                f"{', '.join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ('general', 'tokenizer'))}); convert "
                "the model to a Hugging Face directory, or pass another"
            )
    if header.context_length is not None and header.context_length < MIN_CONTEXT:
        raise ModelLoadError(
            f"{path} holds a context of {header.context_length} tokens; a judge needs at least {MIN_CONTEXT} (the "
            "stages' instructions alone take several hundred)"
        )
    return header
