"""The ladder's judges: the embedded one (config cpu), or Llama-3.1-8B's geometry with random weights (config gpu),
whose throughput does not depend on the weights' values."""

from __future__ import annotations

import torch


def load(
    config: str,
    tokenizer_dir: str | None,
    model: str | None,
    layers: int = 32,
    allow_cpu: bool = False,
    vocab: int = 128256,
    dtype: str | None = None,
):
    from offline_sumscore.engine.judge import Judge, load_judge, models_root

    if config == "cpu":
        return load_judge(model or "smollm2-135m", dtype=dtype or "auto")
    # GPU: Llama-3.1-8B's geometry with random weights. Throughput does not depend on weight values.
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    device = "cuda" if torch.cuda.is_available() else None
    if device is None and not allow_cpu:
        raise SystemExit("--config gpu needs a CUDA device (--allow-cpu with --layers 2 checks the code path here)")
    device = device or "cpu"
    tok_dir = tokenizer_dir or str(models_root() / "SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    tokenizer.padding_side = "left"
    own = len(tokenizer)
    if vocab > own:
        # Llama-3's vocabulary is 128,256 tokens; SmolLM2's tokenizer has 49,152. Reserved tokens fill the rest, so
        # that every per-vocabulary cost (grammar masks, their transfer, the head, softmax) is paid at full width.
        tokenizer.add_tokens([f"<|reserved_{i}|>" for i in range(vocab - own)], special_tokens=True)
    cfg = LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=max(128256, len(tokenizer)) if vocab else len(tokenizer),  # --vocab 0: the tokenizer's own
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # bfloat16 as on the GPU; a CPU check runs float32 unless told otherwise: without bfloat16 units the CPU
    # emulates it, and one forward pass of the one-layer model took seconds.
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    torch.set_default_dtype(getattr(torch, dtype))
    with torch.device(device), _no_init_weights():
        hf_model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    random_weights(hf_model)
    hf_model.eval()
    hf_model.generation_config.eos_token_id = tokenizer.eos_token_id
    return Judge(
        model=hf_model,
        tokenizer=tokenizer,
        name=f"random-llama-3.1-8b-geometry-{layers}-layers",
        path="(random)",
        device=device,
        dtype=dtype,
        identity="random",
        context_length=8192,
        decisions={
            "weights": f"random, Llama-3.1-8B geometry ({layers} layers, 4096 hidden, GQA 8); "
            f"tokenizer SmolLM2's, {own} tokens, padded with reserved tokens to "
            f"{len(tokenizer)} (grammar masks span them all); a {cfg.vocab_size}-row head"
        },
    )


def _no_init_weights():
    """transformers' switch that leaves weights uninitialised (random_weights fills them): its home moved in 5.x."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:
        from transformers.modeling_utils import no_init_weights
    return no_init_weights()


def random_weights(model, std: float = 0.02, period: int = 65521) -> None:
    """Every matrix filled with one seeded block of normal(0, std) values, tiled (the block's length is prime, so
    rows do not repeat in step). Throughput does not depend on the values, only on their being finite; drawing
    a normal value for each of an 8B geometry's weights on a CPU took minutes (a one-layer model with Llama-3's
    128k-token embedding and head: over 3 minutes on the 2-core machine), a tiled copy takes about a second.
    Vectors (the norms' weights) keep the ones they were built with."""
    block = torch.randn(period, generator=torch.Generator().manual_seed(0)) * std
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() < 2:
                continue
            flat = param.view(-1)
            tile = block.to(device=param.device, dtype=param.dtype)
            whole = flat.numel() // period
            flat[: whole * period].view(whole, period).copy_(tile.expand(whole, period))
            flat[whole * period :] = tile[: flat.numel() - whole * period]
