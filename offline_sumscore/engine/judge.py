"""Loading a local judge model: the embedded default, a Hugging Face model directory, or a .gguf file.

Never touches the network: HF_HUB_OFFLINE is forced on and every load is local_files_only, whatever the
environment says. Every automatic decision (device, dtype, what outlines/transformers settings we changed)
is recorded on the Judge with its reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offline_sumscore.core.errors import Failure, ModelLoadError
from offline_sumscore.core.schemas import max_json_chars
from offline_sumscore.engine import presets as preset_table
from offline_sumscore.engine.device_fit import out_of_memory_said, refuse_larger_than_device
from offline_sumscore.engine.gguf_convert import (  # noqa: F401 (the embedded judge's names, imported from here)
    EMBEDDED_GGUF,
    EMBEDDED_NAME,
    _force_offline,
    _load_gguf,
    convert_gguf,
    embedded_gguf_path,
)
from offline_sumscore.engine.presets import DEFAULT_JUDGE, FAST_JUDGE, models_root  # noqa: F401 (imported from here too)

MIN_ROOM = 16  # tokens the context must have left after the prompt for any JSON verdict
# Names the judge used when none is given (a preset name or a path); the tests set the fast judge here.
JUDGE_ENV = "OFFLINE_SUMSCORE_JUDGE"


def presets() -> dict[str, dict]:
    """The judge presets (offline_sumscore/engine/presets.toml): name -> fields."""
    return preset_table.presets()


def default_judge() -> str:
    """The judge a run without --model uses: $OFFLINE_SUMSCORE_JUDGE when set, else DEFAULT_JUDGE."""
    return os.environ.get(JUDGE_ENV) or DEFAULT_JUDGE


def judge_reference(model: str | os.PathLike | None) -> str:
    """What model names as a path-like string: None is the default judge, a preset name its file's path."""
    name = str(model) if model is not None else default_judge()
    table = presets()
    if not Path(name).expanduser().exists() and name in table:
        return str(models_root() / table[name]["path"])
    return name


def resolve_model_path(model: str | os.PathLike | None) -> Path:
    """The directory or .gguf file to load, checked; None means the default judge (default_judge())."""
    table = presets()
    if model is None:
        model = default_judge()
        if model == DEFAULT_JUDGE:
            from offline_sumscore.engine.judge_files import how_to_get, present_file

            if present_file(table[model], models_root()) is None:
                raise ModelLoadError(
                    f"the default judge, {model}, is not here: {how_to_get(model, table[model])}; or --model "
                    f"{FAST_JUDGE} for the small embedded judge (fast, at chance on real data)"
                )
    path = Path(model).expanduser()
    if not path.exists() and str(model) == FAST_JUDGE:
        return convert_gguf(embedded_gguf_path(), models_root() / EMBEDDED_NAME)
    if not path.exists() and str(model) in table:
        from offline_sumscore.engine.judge_files import check_preset_file

        # Absent: how to get it (a fetchable preset: `sumscore setup --judge NAME`; loading never downloads).
        path = check_preset_file(str(model), table[str(model)], models_root())
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


def _pick_dtype(dtype: str, device: str, prepared: bool = False) -> tuple[Any, str]:
    """The dtype to load in and why. prepared: the judge is a prepared GGUF (gguf_weights.py)."""
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
    if prepared:
        # Its weights are bfloat16 roundings of 4-6-bit codes: float32 would double the memory (6.2 GB for a 1.5B, 30
        # GB for a 7B) and add no information. On a CPU without native bfloat16, cpu/bf16_linears.py keeps prefill fast.
        return (
            torch.bfloat16,
            "auto: a GGUF judge is kept in bfloat16 on CPU, half float32's memory (--dtype float32 to upcast)",
        )
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
    grammar_compiler: Any = field(default=None, repr=False)  # made by grammars() on first use
    embedded: bool = False  # the embedded 135M judge (the scorers choose their stage designs by it)
    loaded_attention: str | None = None  # what the model was loaded with, before an engine set its own attention
    # KV slots no run holds, kept for the next (on a CPU: engine/local/forward.py Passes.take_slots)
    spare_slots: list = field(default_factory=list, repr=False)
    # A full pass's measured memory peak, by the pass's shape and how it attends (engine/local/forward.py Passes
    # .activation_peak): measured once per judge, not by every engine sized on it (seconds each on a GPU's pass size)
    activation_peaks: dict = field(default_factory=dict, repr=False)
    special_texts: tuple[str, ...] | None = None  # the tokenizer's special tokens as text; found on first render

    def __post_init__(self):
        if self.loaded_attention is None:  # read once, here: an engine sets its own attention on the model later
            self.loaded_attention = getattr(getattr(self.model, "config", None), "_attn_implementation", None)

    def grammars(self):
        """The compiled grammars of this judge's tokenizer, made on first use: one cache per loaded judge, so every
        engine and scorer on it shares them."""
        if self.grammar_compiler is None:
            from offline_sumscore.engine.grammar import GrammarCompiler

            self.grammar_compiler = GrammarCompiler(self.model, self.tokenizer)
        return self.grammar_compiler

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


def prepare_judge(path: str | os.PathLike) -> Path:
    """The folder load_judge loads a .gguf judge from: which of its tensors stay the file's block codes, each checked
    to the bit, and the rest in bfloat16, written once and cached by the file's content under models_root()/prepared
    (engine/gguf_weights.py). The fetch command calls it after a download, so a judge's first run does not."""
    from offline_sumscore.engine.gguf_weights import prepare_gguf

    path = Path(path).expanduser()
    if not path.is_file() or path.suffix != ".gguf":
        raise ModelLoadError(
            f"{path} is not a .gguf file; only a GGUF judge is prepared (a model directory loads as it is)"
        )
    return prepare_gguf(path, models_root())


def load_judge(model: str | os.PathLike | None = None, *, device: str = "auto", dtype: str = "auto") -> Judge:
    """Load a judge from disk: a model directory, a .gguf file or a preset name (`sumscore models`). model=None is the
    default judge, Qwen2.5-Coder-1.5B-Instruct once `sumscore setup --judge qwen2.5-coder-1.5b` has fetched it
    (default_judge(); $OFFLINE_SUMSCORE_JUDGE names another); "smollm2-135m" is the small embedded judge."""
    _force_offline()
    from offline_sumscore.engine.local.device_memory import DEVICE_MEMORY_ENV, emulated_memory_mib

    started = time.perf_counter()
    path = resolve_model_path(model)  # a model that cannot judge is refused there, before its weights load
    dev, dev_reason = _pick_device(device)
    # Every GGUF but the embedded judge's (float32 in memory, its CPU kernels and tests tied to those bits) loads from
    # its prepared folder: on a CPU its weights stay the file's block codes, never dequantized to float32 at every load.
    to_prepare = path.is_file() and path.name != EMBEDDED_GGUF
    torch_dtype, dtype_reason = _pick_dtype(dtype, dev, to_prepare)
    weights = refuse_larger_than_device(path, dev, torch_dtype)  # before a GGUF is prepared or a weight loads
    prepared = prepare_judge(path) if to_prepare else None
    with out_of_memory_said(path, dev, weights):
        hf_model, tokenizer, weights_said = _load_weights(path, prepared, torch_dtype, dev)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"{path} has no chat template (tokenizer_config.json: chat_template); pass an "
            f"instruct/chat model, not a base model"
        )
    with out_of_memory_said(path, dev, weights):
        hf_model.to(dev)
    hf_model.eval()
    decisions = {"device": f"{dev} ({dev_reason})", "dtype": f"{torch_dtype} ({dtype_reason})"}
    if prepared is not None:
        decisions["weights"] = weights_said
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
    elif dev == "cpu" and str(torch_dtype) == "torch.bfloat16":
        from offline_sumscore.engine.cpu.bf16_linears import hybrid_linears

        decisions["bf16_linears"] = hybrid_linears(hf_model)
    if prepared is not None and dev == "cpu" and emulated is None:
        decisions["embedding"] = _embedding_off_memory(hf_model, prepared)
    config = hf_model.config.to_dict()
    context = int(getattr(hf_model.config, "max_position_embeddings", 0) or 2048)
    name = path.name
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


def _load_weights(path: Path, prepared: Path | None, torch_dtype, dev: str):
    """(model, tokenizer, what was done with a prepared GGUF's weights or None), in the host's memory; an unreadable
    model is a ModelLoadError naming it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from offline_sumscore.engine.local.device_memory import emulated_memory_mib

    try:
        if prepared is not None:
            from offline_sumscore.engine.gguf_load import load_prepared

            in_place = dev == "cpu" and emulated_memory_mib() is None
            return load_prepared(prepared, path, torch_dtype, dev, in_place)
        if path.is_file():
            hf_model, tokenizer = _load_gguf(path)
            return hf_model.to(dtype=torch_dtype), tokenizer, None
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        hf_model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch_dtype)
        return hf_model, tokenizer, None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(
            f"{path} could not be loaded as a causal language model: {str(exc).splitlines()[0]}"
        ) from exc


def _embedding_off_memory(hf_model, prepared: Path) -> str:
    """A prepared judge's embedding table on a CPU: its codes, rebuilt a row at a time, or read a row at a time from
    its bfloat16 shard (embedding_rows.py) where the file held it in a type the code kernel does not rebuild."""
    from offline_sumscore.engine.cpu.embedding_rows import embedding_from_file
    from offline_sumscore.engine.cpu.gguf_codes import CodedEmbedding

    table = hf_model.get_input_embeddings()
    if isinstance(table, CodedEmbedding):
        return (
            f"the {table.num_embeddings:,} x {table.embedding_dim} table's codes, each row rebuilt as a pass reads it"
        )
    return embedding_from_file(hf_model, prepared)


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
        name=path.name,
        path=str(path),
        device="",
        dtype="",
        identity=_identity(path, config.to_dict()),
        context_length=int(getattr(text, "max_position_embeddings", 0) or 2048),
        embedded=path.name in (EMBEDDED_NAME, EMBEDDED_GGUF),
    )
