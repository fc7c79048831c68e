"""What a model file says of itself before any weight is read: its chat template, architecture, context length, the
size of its weights, and whether the file holds every byte its header lists.

A judge answers chat prompts, so a model without a chat template (a base model) cannot judge; neither can an
architecture transformers does not load from GGUF, nor a context too short for the stages' instructions, nor a GGUF
file cut short. Each is read from the GGUF header (the key-value block and the tensors' descriptions at the front of
the file, read here without touching the tensors: under a second for any size) or from a model directory's
config.json and tokenizer files, and refused in one line before the weights are loaded or a GGUF is converted
(converting a 250 MB file took over two minutes before it was refused). The weights' size (a GGUF's tensor
descriptions, safetensors' headers) lets a judge too large for its device be refused before it loads."""

from __future__ import annotations

import functools
import json
import math
import os
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


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as the GGUF header describes it: where its bytes start in the data section, and what they hold."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # from the data section's start

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    def nbytes(self) -> int:
        """The tensor's bytes in the file: whole blocks of its GGML type (the gguf package's table of them)."""
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        except ValueError:
            raise ModelLoadError(
                f"tensor {self.name} is of GGML type {self.ggml_type}, which the installed gguf package does not "
                "know; upgrade gguf (pip install -U gguf)"
            ) from None
        return self.elements // block * size


@dataclass(frozen=True)
class GGUFLayout:
    """A GGUF file's header: its key-value pairs (strings and numbers), its tensors, where their data starts."""

    metadata: dict[str, object]
    tensors: tuple[GGUFTensor, ...]
    data_start: int  # the byte the data section starts at: past the tensors' descriptions, aligned

    def data_end(self) -> int:
        """The byte the last tensor ends at: a file shorter than this was cut short."""
        return self.data_start + max((t.offset + t.nbytes() for t in self.tensors), default=0)


GGUF_ALIGNMENT = 32  # the data section's alignment where general.alignment does not give one (the specification's)


def read_gguf_layout(path: Path) -> GGUFLayout:
    """The GGUF header: key-value pairs, strings and numbers (arrays are skipped, not read: a vocabulary's 150,000
    tokens are passed over by their lengths), and the tensors' descriptions; no tensor's data is read. Raises
    ModelLoadError for a file that is not GGUF or whose header is cut short. Read once per file and version: a run
    asks for it when the engine is chosen and again as the judge loads (a 1.5B's header: 0.4 s on 2 cores)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"{path} cannot be read: {exc.strerror or exc}") from None
    return _layout(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _layout(path: Path, size: int, mtime_ns: int) -> GGUFLayout:
    """read_gguf_layout's read, keyed by the file's size and time as well: a file replaced is read again."""
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
            tensor_count, metadata = number(10), {}
            for _ in range(number(10)):
                key, kind = text(), number(4)
                if kind == _STRING:
                    metadata[key] = text()
                elif kind in _FIXED:
                    metadata[key] = number(kind)
                else:
                    skip(kind)
            tensors = []
            for _ in range(tensor_count):
                name = text()
                shape = tuple(number(10) for _ in range(number(4)))
                tensors.append(GGUFTensor(name, shape, ggml_type=number(4), offset=number(10)))
            alignment = int(metadata.get("general.alignment") or GGUF_ALIGNMENT)
            data_start = -(-f.tell() // alignment) * alignment
            return GGUFLayout(metadata, tuple(tensors), data_start)
    except (EOFError, ValueError, KeyError, struct.error, OSError) as exc:
        raise ModelLoadError(
            f"{path} is truncated or corrupt and its GGUF header cannot be read ({type(exc).__name__}); copy the file "
            "again"
        ) from None


def read_gguf_metadata(path: Path) -> dict[str, object]:
    """The GGUF header's key-value pairs, strings and numbers (read_gguf_layout)."""
    return read_gguf_layout(path).metadata


def refuse_cut_short(path: Path, layout: GGUFLayout) -> None:
    """A GGUF file shorter than the tensors its header lists was cut short (a copy or a download that stopped): it
    is refused from the header and the file's size, before transformers' reader fails on it deep in a tensor, after
    reading the whole vocabulary (13 s for the embedded judge's 98 MB cut in half)."""
    size, end = path.stat().st_size, layout.data_end()
    if size < end:
        raise ModelLoadError(
            f"{path} is truncated: its GGUF header lists {len(layout.tensors)} tensors ending at byte {end:,}, but "
            f"the file holds {size:,} bytes ({end - size:,} missing); copy the file again"
        )


def _gguf_header(path: Path) -> ModelHeader:
    layout = read_gguf_layout(path)
    refuse_cut_short(path, layout)
    metadata = layout.metadata
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


# Bytes an element of each safetensors dtype; the floating ones load in the judge's dtype, the rest as they are.
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
_SAFETENSORS_FLOATS = ("F64", "F32", "F16", "BF16")


def weights_in_memory(path: Path, element_bytes: int) -> int | None:
    """Bytes a judge's weights take once loaded with floating-point elements of `element_bytes` each, from its files'
    headers alone: a GGUF's tensor descriptions (every tensor rebuilt in that dtype), or a model directory's
    safetensors headers. None where the files do not say: a directory of .bin weights, or a dtype not listed."""
    if path.is_file():
        return sum(t.elements for t in read_gguf_layout(path).tensors) * element_bytes
    total = 0
    for file in sorted(path.glob("*.safetensors")):
        for name, entry in _safetensors_header(file).items():
            if name == "__metadata__":
                continue
            kind = entry.get("dtype")
            if kind not in _SAFETENSORS_BYTES:
                return None
            width = element_bytes if kind in _SAFETENSORS_FLOATS else _SAFETENSORS_BYTES[kind]
            total += math.prod(entry.get("shape") or ()) * width
    return total or None  # no safetensors: .bin weights, whose size only loading tells


def _safetensors_header(file: Path) -> dict:
    """A safetensors file's JSON header (each tensor's dtype, shape and offsets), read without its data."""
    try:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            return json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(
            f"{file} is truncated or corrupt: its safetensors header cannot be read ({type(exc).__name__}); copy the "
            "file again"
        ) from None


def refuse_cut_gguf(model: object) -> None:
    """Where model names a .gguf file by its path, its header is read now (read_header): a file cut short or not GGUF
    is refused in a second, before an engine is chosen (which imports torch: seconds) or a weight loads."""
    if not isinstance(model, (str, os.PathLike)) or not str(model).endswith(".gguf"):
        return
    path = Path(model).expanduser()
    if path.is_file():
        read_header(path)


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
