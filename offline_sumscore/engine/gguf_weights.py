"""A GGUF judge prepared once, cached by the file's content: its quantized weights stay the file's own block codes.

transformers loads a GGUF by dequantizing every weight to float32 in memory, at every load: Qwen2.5-Coder-1.5B's
1.1 GB Q4_K_M file became 6.7 GB and took 16-24 s each run here, and a 7B would need about 30 GB. prepare_gguf
instead writes, once, a Hugging Face directory (config.json, the tokenizer's files with its chat template) with
coded.json, the list of the file's tensors that later runs use as they lie in the file (each linear weight and the
embedding table in a type cpu/gguf_codes.py rebuilds: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), and
bfloat16 safetensors (shards of at most SHARD_BYTES, with a model.safetensors.index.json) for the rest: norms and
biases, a few hundred KB for the 1.5B. load_prepared maps the file and multiplies its codes (the 1.5B's weights in
the file's 1.1 GB, where bfloat16 took 2.9 GiB), or, on a GPU, rebuilds them there in the model's dtype.

Contract:
- The folder is root/prepared/<first 16 hex digits of the file's sha256>/: the same bytes anywhere (moved, copied,
  renamed) are prepared once; changed bytes are a new folder. The hash is read from the fetcher's sidecar
  `<file>.sha256` ("<64 hex> <bytes>", judge_files.read_sidecar) where its size matches the file's, else computed once
  and memoised in root/prepared/hashes.json by resolved path, size and mtime_ns.
- Every weight equals transformers' own float32 load of the file: each tensor is dequantized with gguf's reader and
  passed through transformers' per-architecture tensor processor (Llama's q/k un-permutation, Gemma's norm
  offset...) and its GGUF->HF name map, built from a model on the meta device, as
  transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint does. A coded tensor is listed only where the
  kernel's rebuild of its codes equals that to the bit, every weight compared, with the rows in the processor's
  order (found by passing row numbers through it); the rest is written in bfloat16, rounded once. The marker records
  the kernel source that checked the codes: a changed kernel prepares the file again. Where no kernel can be built,
  every weight is written in bfloat16 (2.6x the file), and the marker says why. A tied head is listed once (the file
  holds no output.weight; the config says tie_word_embeddings).
- The preparation holds one shard and the tensor in hand, never the whole model: its peak is the file's mapping,
  the largest tensor in float32 (twice: gguf's rebuild and the kernel's) and one shard, far below the float32 model.
- Atomic as convert_gguf is: a file lock serialises preparers, the work happens in a temporary folder beside the
  target, the marker (PREPARED_FROM) is written last and the folder renamed into place. A folder without the marker
  (a killed run's, a damaged one) is never taken as finished: it is prepared again.
- model_header.refuse_unable(gguf) runs before any preparing: a model that cannot judge is never prepared (a folder
  already prepared from the same bytes passed it then, and is returned without reading the header again).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

from offline_sumscore.core.durable import replace_dir, replace_text
from offline_sumscore.core.errors import ModelLoadError
from offline_sumscore.engine.judge_files import hash_file, read_sidecar

MARKER = "PREPARED_FROM"  # written last: a folder without it is unfinished
SHARD_BYTES = 512 << 20  # a shard's weights at most (a larger tensor is a shard of its own); held whole while written
FORMAT = 2  # bump when what a prepared folder holds changes: an older folder is then prepared again (2: coded.json)
CODED = "coded.json"  # the tensors held as the file's block codes: name, type, shape, offset, row order


def prepared_dir(gguf: Path, root: Path) -> Path:
    """Where gguf's prepared folder lies (whether or not it is there yet)."""
    return Path(root) / "prepared" / content_hash(Path(gguf), Path(root))[:16]


def is_prepared(folder: Path) -> bool:
    """A finished folder of this format, whose coded tensors were checked by this very kernel source (a changed
    kernel checks every tensor again). One prepared where no kernel could be built holds every weight in bfloat16."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == FORMAT and marker.get("kernel") in (kernel_identity(), "unavailable")


def kernel_identity() -> str:
    """The GGUF block-code kernel's source, hashed: what checked a folder's coded tensors."""
    from offline_sumscore.engine.cpu.gguf_codes import SOURCE

    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


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
            prepared = _write(gguf, tmp)
            marker = {
                "format": FORMAT,
                "gguf": str(gguf.resolve()),
                "size": gguf.stat().st_size,
                "sha256": content_hash(gguf, Path(root)),
                **prepared,
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


def _write(gguf: Path, out: Path) -> dict:
    """config.json, the tokenizer, coded.json and the dense shards of gguf into the folder out. Returns what was
    prepared, for the marker."""
    import numpy as np
    import torch
    from gguf import dequantize

    from offline_sumscore.engine.cpu import gguf_codes

    config, tokenizer, reader, processor, name_map, skeleton = _open(gguf)
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    module, why_not = gguf_codes.kernel()
    shards = DenseShards(gguf, out)
    coded: list[dict] = []
    inexact: list[str] = []
    # What a processor writes itself (MoE experts merged from several GGUF tensors), as load_gguf_checkpoint takes it.
    parsed = {"tensors": {}}
    for tensor in reader.tensors:
        if module is not None:
            entry = _coded_entry(module, tensor, skeleton, processor, name_map)
            if entry == "inexact":
                inexact.append(tensor.name)
            elif entry is not None:
                coded.append(entry)
                continue
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
        shards.add(name_map[result.name], torch.from_numpy(values).to(torch.bfloat16))
        del weights, values, result
    for hf_name, merged in parsed["tensors"].items():
        shards.add(hf_name, merged.to(torch.float32).to(torch.bfloat16).contiguous())
    del reader  # its mapping of the file goes with it
    dense = shards.finish({c["name"] for c in coded})
    (out / CODED).write_text(json.dumps(coded) + "\n")
    if inexact:  # the kernel rebuilt a tensor differently from gguf's reference: a bug, said, never used
        warnings.warn(
            f"{gguf}: {len(inexact)} tensors ({', '.join(inexact[:3])}...) were not rebuilt to the bit by the GGUF "
            "block-code kernel; they are held in bfloat16 instead",
            stacklevel=3,
        )
    return {
        "tensors": dense + len(coded),
        "coded": len(coded),
        "dense": dense,
        "inexact": inexact,
        "kernel": kernel_identity() if module is not None else "unavailable",
        "kernel_unavailable_because": why_not,
    }


class DenseShards:
    """The tensors not held as codes, written as bfloat16 safetensors in shards of at most SHARD_BYTES, with the
    index transformers reads (model.safetensors.index.json)."""

    def __init__(self, gguf: Path, out: Path):
        self.gguf, self.out = gguf, out
        self.weight_map: dict[str, str] = {}
        self.shard: dict = {}
        self.files: list[str] = []
        self.total = 0

    def add(self, hf_name: str, tensor) -> None:
        if hf_name in self.weight_map or hf_name in self.shard:
            raise ModelLoadError(
                f"{self.gguf}: two GGUF tensors map to {hf_name}; prepare it with transformers instead"
            )
        if self.shard and sum(t.nbytes for t in self.shard.values()) + tensor.nbytes > SHARD_BYTES:
            self.flush()
        self.shard[hf_name] = tensor
        self.total += tensor.nbytes

    def flush(self) -> None:
        from safetensors.torch import save_file

        if self.shard:
            name = f"model-{len(self.files) + 1:05d}.safetensors"
            save_file(self.shard, str(self.out / name), metadata={"format": "pt"})
            self.files.append(name)
            self.weight_map.update(dict.fromkeys(self.shard, name))
            self.shard = {}

    def finish(self, coded_names: set[str]) -> int:
        """The last shard written, every shard named "-of-" their count, the index written. Returns the tensors."""
        self.flush()
        twice = sorted(coded_names & set(self.weight_map))
        if twice:
            raise ModelLoadError(
                f"{self.gguf}: two GGUF tensors map to {twice[0]}; prepare it with transformers instead"
            )
        count = len(self.files)
        renamed = {name: f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i, name in enumerate(self.files)}
        for old, new in renamed.items():
            os.replace(self.out / old, self.out / new)
        index = {
            "metadata": {"total_size": self.total},
            "weight_map": {k: renamed[v] for k, v in sorted(self.weight_map.items())},
        }
        (self.out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
        return len(self.weight_map)


CHECK_ELEMENTS = 8 << 20  # weights compared at a time when a coded tensor is checked (32 MiB in float32, twice)


def _coded_entry(module, tensor, skeleton, processor, name_map):
    """The tensor's coded.json entry, None where it is not held as codes (a type the kernel does not rebuild, not the
    weight of a linear layer or an embedding, a processor that changes more than the rows' order), or "inexact"
    where the kernel's rebuild differs from gguf's reference dequantization in any weight (a bug: said, not used).
    The check runs over slices of rows, so its memory stays CHECK_ELEMENTS whatever the tensor."""
    import numpy as np
    import torch
    from gguf import dequantize

    from offline_sumscore.engine.cpu.gguf_codes import CODED_TYPES, CodedTensor
    from offline_sumscore.engine.cpu.gguf_codes import dequantize as rebuild

    if int(tensor.tensor_type) not in CODED_TYPES or len(tensor.shape) != 2:
        return None
    rows, columns = int(tensor.shape[1]), int(tensor.shape[0])
    order = _row_order(processor, tensor, name_map, rows)
    if order is None:
        return None
    hf_name, order = order
    try:
        owner = skeleton.get_submodule(hf_name.rsplit(".", 1)[0])
    except AttributeError:
        return None
    if not (
        hf_name.endswith(".weight")
        and isinstance(owner, (torch.nn.Linear, torch.nn.Embedding))
        and tuple(owner.weight.shape) == (rows, columns)
    ):
        return None
    entry = CodedTensor(hf_name, int(tensor.tensor_type), rows, columns, int(tensor.data_offset), order)
    codes = torch.from_numpy(tensor.data)  # the reader's copy-on-write mapping: the file's pages, mapped once
    file_rows = np.asarray(order) if order is not None else None
    if order is not None:  # in the processor's row order, as the model will read them
        codes = codes[torch.from_numpy(file_rows)]
    step = max(1, CHECK_ELEMENTS // columns)
    for start in range(0, rows, step):
        end = min(start + step, rows)
        raw = tensor.data[start:end] if file_rows is None else tensor.data[file_rows[start:end]]
        reference = torch.from_numpy(np.ascontiguousarray(dequantize(raw, tensor.tensor_type), dtype=np.float32))
        ours = rebuild(module, codes[start:end], entry.type, columns)
        if not torch.equal(ours.view(torch.int32), reference.view(torch.int32)):
            return "inexact"
    return {
        "name": hf_name,
        "type": entry.type,
        "rows": rows,
        "columns": columns,
        "offset": entry.offset,
        "permutation": None if order is None else list(order),
    }


def _row_order(processor, tensor, name_map, rows):
    """(the tensor's model name, None or the order its rows take) where transformers' processor does no more than
    reorder them (Llama's q and k un-permutation); None otherwise. Told from what the processor does to a column of
    distinct values and to a column of row numbers: it acts on each column alike."""
    import numpy as np

    probe = np.random.default_rng(0).permutation(rows).astype(np.float32)[:, None] + 0.5
    try:
        moved = processor.process(
            weights=probe.copy(), name=tensor.name, tensor_key_mapping=name_map, parsed_parameters={}
        )
        numbers = processor.process(
            weights=np.arange(rows, dtype=np.float32)[:, None],
            name=tensor.name,
            tensor_key_mapping=name_map,
            parsed_parameters={},
        )
    except Exception:  # a processor that needs the real weights (shapes, merges): the full path decides
        return None
    if moved.name is None or moved.name not in name_map:
        return None
    values = np.asarray(moved.weights, dtype=np.float32).reshape(-1)
    if values.shape != (rows,):
        return None
    if np.array_equal(values, probe[:, 0]):
        return name_map[moved.name], None
    order = np.asarray(numbers.weights, dtype=np.float32).reshape(-1).astype(np.int64)
    if sorted(order.tolist()) != list(range(rows)) or not np.array_equal(values, probe[order, 0]):
        return None
    return name_map[moved.name], tuple(order.tolist())


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
        reader = GGUFReader(str(gguf), "c")  # copy on write, never written: torch may view its tensors
        architecture = read_field(reader, "general.architecture")[0]
        _refuse_new_loader(gguf, architecture)
        with _reader_shared(gguf, reader):
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
    return config, tokenizer, reader, processor, name_map, skeleton


@contextmanager
def _reader_shared(gguf: Path, reader):
    """transformers' config and tokenizer loads each open the file again (load_gguf_checkpoint imports gguf's
    GGUFReader at the call), and a new reader parses every metadata field: for a 151,936-token vocabulary about 15 s
    each on 2 cores. Inside this block they are handed the reader already open on the same file."""
    import gguf as gguf_package

    opened = gguf_package.GGUFReader

    def shared(path, *args, **kwargs):
        if not args and not kwargs and os.path.samefile(path, gguf):
            return reader
        return opened(path, *args, **kwargs)

    gguf_package.GGUFReader = shared
    try:
        yield
    finally:
        gguf_package.GGUFReader = opened


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
