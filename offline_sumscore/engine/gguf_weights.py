"""A GGUF judge prepared once into a bfloat16 model directory, cached by the file's content.

transformers loads a GGUF by dequantizing every weight to float32 in memory, at every load: Qwen2.5-Coder-1.5B's
1.1 GB Q4_K_M file became 6.7 GB and took 16-24 s each run here, and a 7B would need about 30 GB. prepare_gguf
instead writes the model once as a Hugging Face directory (config.json, the tokenizer's files with its chat template,
bfloat16 safetensors in shards of at most SHARD_BYTES (512 MiB) with a model.safetensors.index.json) that later runs
load as they load any model directory: 3.1 GB for the 1.5B, read from the page cache in seconds.

Contract:
- The folder is root/prepared/<first 16 hex digits of the file's sha256>/: the same bytes anywhere (moved, copied,
  renamed) are prepared once; changed bytes are a new folder. The hash is read from the fetcher's sidecar
  `<file>.sha256` ("<64 hex> <bytes>", judge_files.read_sidecar) where its size matches the file's, else computed once
  and memoised in root/prepared/hashes.json by resolved path, size and mtime_ns.
- Every weight equals transformers' own float32 load of the file rounded to bfloat16: each tensor is dequantized with
  gguf's reader and passed through transformers' per-architecture tensor processor (Llama's q/k un-permutation,
  Gemma's norm offset...) and its GGUF->HF name map, built from a model on the meta device, as
  transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint does. A tied head is written once (the file holds
  no output.weight; the config says tie_word_embeddings).
- The conversion holds one shard and the tensor in hand, never the whole model: its peak is the file's mapping, the
  largest tensor in float32 and one shard, far below the float32 model.
- Atomic as convert_gguf is: a file lock serialises preparers, the work happens in a temporary folder beside the
  target, the marker (PREPARED_FROM) is written last and the folder renamed into place. A folder without the marker
  (a killed run's, a damaged one) is never taken as finished: it is prepared again.
- model_header.refuse_unable(gguf) runs before any preparing: a model that cannot judge is never prepared (a folder
  already prepared from the same bytes passed it then, and is returned without reading the header again).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from offline_sumscore.core.durable import replace_dir, replace_text
from offline_sumscore.core.errors import ModelLoadError
from offline_sumscore.engine.judge_files import hash_file, read_sidecar

MARKER = "PREPARED_FROM"  # written last: a folder without it is unfinished
SHARD_BYTES = 512 << 20  # a shard's weights at most (a larger tensor is a shard of its own); held whole while written
FORMAT = 1  # bump when what a prepared folder holds changes: an older folder is then prepared again


def prepared_dir(gguf: Path, root: Path) -> Path:
    """Where gguf's prepared folder lies (whether or not it is there yet)."""
    return Path(root) / "prepared" / content_hash(Path(gguf), Path(root))[:16]


def is_prepared(folder: Path) -> bool:
    try:
        return json.loads((folder / MARKER).read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def prepare_gguf(gguf: Path, root: Path) -> Path:
    """gguf's prepared model directory under root, written once (see the module's contract)."""
    from filelock import FileLock

    from offline_sumscore.engine.model_header import refuse_unable

    gguf = Path(gguf)
    target = prepared_dir(gguf, root)
    if is_prepared(target):  # these bytes passed the header check when they were prepared: not read again (1.9 s)
        return target
    refuse_unable(gguf)  # from the header, in a second: a model that cannot judge is never prepared
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if is_prepared(target):  # another process finished it while this one waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            started = time.perf_counter()
            tensors = _write(gguf, tmp)
            marker = {
                "format": FORMAT,
                "gguf": str(gguf.resolve()),
                "size": gguf.stat().st_size,
                "sha256": content_hash(gguf, Path(root)),
                "tensors": tensors,
                "seconds": round(time.perf_counter() - started, 1),
            }
            (tmp / MARKER).write_text(json.dumps(marker) + "\n")
            if target.exists():  # an unfinished or damaged folder (no marker): replaced whole
                shutil.rmtree(target)
            replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def content_hash(gguf: Path, root: Path) -> str:
    """The sha256 of gguf's bytes: the fetcher's sidecar where its size matches, else a memo in root, else read."""
    stat = gguf.stat()
    claimed = read_sidecar(gguf)  # the fetcher's, written after it verified the file
    if claimed is not None and claimed[1] == stat.st_size and len(claimed[0]) == 64:
        return claimed[0]
    memo_path = Path(root) / "prepared" / "hashes.json"
    key = f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    memo[key] = hash_file(gguf)
    # Re-read and merge just before writing: another process may have memoised another file meanwhile. A race
    # loses at most an entry, which costs one more hash, never a wrong one.
    try:
        memo = {**json.loads(memo_path.read_text()), key: memo[key]}
    except (OSError, ValueError):
        pass
    replace_text(memo_path, json.dumps(memo, indent=1, sort_keys=True) + "\n")
    return memo[key]


def _write(gguf: Path, out: Path) -> int:
    """config.json, the tokenizer and the bfloat16 shards of gguf into the folder out. Returns the tensors written."""
    import numpy as np
    import torch
    from safetensors.torch import save_file

    config, tokenizer, reader, processor, name_map = _open(gguf)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)

    weight_map: dict[str, str] = {}
    shard: dict[str, torch.Tensor] = {}
    shard_files: list[str] = []
    total = 0

    def flush() -> None:
        nonlocal shard
        if shard:
            name = f"model-{len(shard_files) + 1:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            shard_files.append(name)
            weight_map.update(dict.fromkeys(shard, name))
            shard = {}

    def add(hf_name: str, tensor) -> None:
        nonlocal total
        if hf_name in weight_map or hf_name in shard:
            raise ModelLoadError(f"{gguf}: two GGUF tensors map to {hf_name}; prepare it with transformers instead")
        if shard and sum(t.nbytes for t in shard.values()) + tensor.nbytes > SHARD_BYTES:
            flush()
        shard[hf_name] = tensor
        total += tensor.nbytes

    # What a processor writes itself (MoE experts merged from several GGUF tensors), as load_gguf_checkpoint takes it.
    parsed = {"tensors": {}}
    from gguf import dequantize

    for tensor in reader.tensors:
        try:
            weights = dequantize(tensor.data, tensor.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise ModelLoadError(
                f"{gguf}: tensor {tensor.name} ({tensor.tensor_type.name}) cannot be dequantized here ({exc}); "
                "upgrade the gguf package or pass a model in another quantization"
            ) from None
        result = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=name_map, parsed_parameters=parsed
        )
        if result.name is None or result.name not in name_map:
            continue  # handled by the processor itself, or a tensor transformers does not load either
        # float32 first, as transformers holds it, then bfloat16: the same rounding as its load cast to bfloat16.
        values = np.asarray(result.weights, dtype=np.float32)
        if not (values.flags.writeable and values.flags.c_contiguous):  # a view of the file's mapping (F32)
            values = np.array(values, copy=True)
        add(name_map[result.name], torch.from_numpy(values).to(torch.bfloat16))
        del weights, values, result
    for hf_name, merged in parsed["tensors"].items():
        add(hf_name, merged.to(torch.float32).to(torch.bfloat16).contiguous())
    flush()
    del reader  # its mapping of the file goes with it

    count = len(shard_files)
    renamed = {name: f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i, name in enumerate(shard_files)}
    for old, new in renamed.items():
        os.replace(out / old, out / new)
    index = {"metadata": {"total_size": total}, "weight_map": {k: renamed[v] for k, v in sorted(weight_map.items())}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return len(weight_map)


def _open(gguf: Path):
    """(config, tokenizer, reader, tensor processor, GGUF->HF name map) for gguf, as transformers reads them."""
    from offline_sumscore.engine.gguf_convert import UNREADABLE, _force_offline, unreadable_gguf

    _force_offline()
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    where = {"pretrained_model_name_or_path": str(gguf.parent), "gguf_file": gguf.name, "local_files_only": True}
    try:
        reader = GGUFReader(str(gguf))
        architecture = read_field(reader, "general.architecture")[0]
        _refuse_new_loader(gguf, architecture)
        config = AutoConfig.from_pretrained(**where)
        tokenizer = AutoTokenizer.from_pretrained(**where)
    except UNREADABLE as exc:
        raise unreadable_gguf(gguf, exc) from None
    for key in ("quantization_config",):
        if hasattr(config, key):
            delattr(config, key)
    config.dtype = torch.bfloat16  # what the shards hold: dtype="auto" loads them as they are
    with torch.device("meta"):  # the model's names and shapes only, no memory: the name map needs nothing more
        skeleton = AutoModelForCausalLM.from_config(config)
    # load_gguf_checkpoint gives the processor the file's config under transformers' names; the config built from it
    # holds the same entries (a superset), and reading the file's metadata again would cost seconds (its vocabulary).
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    name_map = get_gguf_hf_weights_map(skeleton, processor)
    return config, tokenizer, reader, processor, name_map


def _refuse_new_loader(gguf: Path, architecture: str) -> None:
    """transformers loads a few architectures (Qwen3.5, LFM2) through its newer GGUF path, with conversions of its own
    that this module does not repeat: those are refused here, by name, rather than prepared differently."""
    try:
        from transformers.integrations.gguf.utils import is_gguf_arch_supported
    except ImportError:  # a transformers without the newer path loads everything the way this module does
        return
    if is_gguf_arch_supported(architecture):
        raise ModelLoadError(
            f"{gguf}: architecture {architecture!r} is one transformers converts on its newer GGUF path, which "
            "preparing does not repeat; convert the model to a Hugging Face directory and pass that"
        )
