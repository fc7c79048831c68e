"""A prepared GGUF judge loaded (gguf_weights.py prepares it): on a CPU, its coded tensors stay views of the file's
mapping, multiplied by cpu/gguf_codes.py; elsewhere they are rebuilt once, at load, in the model's dtype."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from offline_sumscore.core.errors import ModelLoadError
from offline_sumscore.engine.gguf_weights import CODED


def load_prepared(folder: Path, gguf: Path, dtype, device: str, codes_in_place: bool):
    """(model, tokenizer, what was done in words) from a prepared folder and its GGUF. codes_in_place: a CPU run of
    the engine's own kernels (not an emulated GPU): the coded tensors stay views of the file's mapping, multiplied
    by gguf_codes. Otherwise they are rebuilt into `dtype` at load, by the kernel where it is built, else by gguf's
    dequantization (the same bits). A folder without coded tensors loads as any model directory does."""
    import torch
    from accelerate import init_empty_weights
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from offline_sumscore.engine.cpu import gguf_codes

    folder, gguf = Path(folder), Path(gguf)
    coded = [
        gguf_codes.CodedTensor(**{**c, "permutation": _order(c)}) for c in json.loads((folder / CODED).read_text())
    ]
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    if not coded:
        model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=dtype)
        return model, tokenizer, f"prepared once from the GGUF into {folder} (bfloat16 safetensors, by file content)"
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    with init_empty_weights(include_buffers=False):  # parameters on the meta device, buffers (rotary tables) real
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    dense = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        dense.update(load_file(str(shard)))
    model.load_state_dict({k: v.to(dtype) for k, v in dense.items()}, strict=False, assign=True)
    mapping = gguf_codes.map_file(gguf)
    if mapping.size() < max(c.offset + c.rows * c.row_bytes for c in coded):
        raise ModelLoadError(f"{gguf}: shorter than the tensors its prepared folder {folder} lists (changed since?)")
    module = gguf_codes.kernel()[0] if codes_in_place or device == "cpu" else None
    if codes_in_place and module is None:
        codes_in_place = False  # the kernel's warning said why; its weights are rebuilt below instead
    scratch = gguf_codes.Scratch(gguf_codes.SCRATCH_ELEMENTS)
    compute = torch.float32
    if dtype == torch.bfloat16:
        from offline_sumscore.engine.cpu.bf16_linears import fast_bf16_matmul

        compute = torch.bfloat16 if fast_bf16_matmul()[0] else torch.float32
    for entry in coded:
        owner_name, _ = entry.name.rsplit(".", 1)
        owner = model.get_submodule(owner_name)
        if codes_in_place:
            codes = entry.codes(mapping)
            if isinstance(owner, torch.nn.Embedding):
                replacement = gguf_codes.CodedEmbedding(module, entry, codes, dtype)
            else:
                replacement = gguf_codes.CodedLinear(module, entry, codes, owner.bias, scratch, compute)
            parent_name, _, child = owner_name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)
        else:
            weight = _rebuilt(module, entry, mapping).to(dtype)
            owner.weight = torch.nn.Parameter(weight, requires_grad=False)
    if config.tie_word_embeddings:
        _tie(model, scratch, compute)
    missing = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.device.type == "meta"]
    if missing:
        raise ModelLoadError(f"{folder}: no weights for {', '.join(missing[:4])}; prepare the GGUF again (delete it)")
    if not codes_in_place:
        del mapping
        return model, tokenizer, f"rebuilt at load from the GGUF's codes ({len(coded)} tensors) into {dtype}"
    kinds = Counter(gguf_codes.CODED_TYPES[entry.type][0] for entry in coded)
    size = sum(e.rows * e.row_bytes for e in coded)
    types = ", ".join(f"{k} {v}" for k, v in kinds.items())
    small, bf16_rows = gguf_codes.small_passes(module, compute)  # as each CodedLinear decides
    how = " rounded to bfloat16 (AVX512_BF16)" if bf16_rows else ""
    said = (
        f"{len(coded)} tensors held as the file's own block codes ({types}; {size / 2**20:,.0f} MiB mapped from the "
        f"GGUF, each checked to the bit against gguf's dequantization when {folder} was prepared), {len(dense)} in "
        f"{dtype} (norms, biases); passes of up to {small} rows multiply the codes{how}, larger ones rebuild each "
        f"weight in {compute}"
    )
    return model, tokenizer, said


def _order(entry: dict):
    return None if entry.get("permutation") is None else tuple(entry["permutation"])


def _rebuilt(module, entry, mapping):
    """One coded tensor rebuilt into float32: by the kernel, else by gguf's dequantization (the same bits)."""
    import numpy as np
    import torch

    from offline_sumscore.engine.cpu import gguf_codes

    if module is not None:
        return gguf_codes.dequantize(module, entry.codes(mapping), entry.type, entry.columns)
    from gguf import GGMLQuantizationType, dequantize

    codes = entry.codes(mapping).numpy()
    weights = dequantize(codes, GGMLQuantizationType(entry.type))
    return torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float32)).reshape(entry.rows, entry.columns)


def _tie(model, scratch, compute) -> None:
    """A tied vocabulary projection: the embedding's codes again, or the embedding's rebuilt weight."""
    from offline_sumscore.engine.cpu import gguf_codes

    head = model.get_output_embeddings()
    if head is None or head.weight.device.type != "meta":
        return
    embedding = model.get_input_embeddings()
    if isinstance(embedding, gguf_codes.CodedEmbedding):
        coded = gguf_codes.CodedLinear(embedding.kernel, embedding.coded, embedding.codes, None, scratch, compute)
        model.set_output_embeddings(coded)
    else:
        head.weight = embedding.weight
