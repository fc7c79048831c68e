"""Every judge family people bring, on the engine: tiny random-weight models built here from each family's own
config class (no weights to download), with the embedded judge's tokenizer and chat template.

For each family the engine's likelihoods and greedy text equal transformers' own forward pass and generate (eager
attention, computed before the engine takes the model), on prompts several times longer than the sliding window,
so windows, softcapped scores and softcapped logits all bite. Weights are drawn wider than a fresh model's so that
scores are large enough for a softcap to change them; a check per family shows that dropping the window or the caps
changes the reference, so agreement means something.
"""

from __future__ import annotations

import pytest
import torch

from offline_sumscore.core import schemas
from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.cpu.layer_ops import fuse_layer_ops
from offline_sumscore.engine.judge import Judge
from offline_sumscore.engine.local import TransformersEngine
from offline_sumscore.scorers.stages.questions import questions_list, questions_prompt
from offline_sumscore.scorers.stages.verdict import likelihood_prompt
from tests.conftest import SOURCE, SUMMARY, embedded_tokenizer, judge_around

pytestmark = pytest.mark.model

WINDOW = 8  # tokens: the prompts below run to about 100
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=1024,
)


def families() -> dict[str, tuple]:
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    layers = ["sliding_attention", "full_attention"]
    return {
        "llama-3.1": (LlamaConfig, {}),
        "qwen2.5": (Qwen2Config, {}),
        "qwen3": (Qwen3Config, dict(use_sliding_window=True, sliding_window=WINDOW, layer_types=layers)),
        "mistral-v0.1": (MistralConfig, dict(sliding_window=WINDOW)),
        "gemma-2": (
            Gemma2Config,
            dict(
                sliding_window=WINDOW,
                layer_types=layers,
                attn_logit_softcapping=2.0,
                final_logit_softcapping=3.0,
                query_pre_attn_scalar=16,
            ),
        ),
        "gemma-3": (
            Gemma3TextConfig,
            dict(sliding_window=WINDOW, layer_types=layers, final_logit_softcapping=3.0, query_pre_attn_scalar=16),
        ),
        "phi-3": (Phi3Config, dict(sliding_window=WINDOW, pad_token_id=None)),
    }


@pytest.fixture(scope="module")
def tokenizer():
    return embedded_tokenizer()


def tiny_model(family: str, tokenizer, **overrides):
    from transformers import AutoModelForCausalLM

    cls, extra = families()[family]
    config = cls(
        **TINY,
        **dict(extra, **overrides),
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.25 if "embed" not in name else 1.0)  # wide: scores of several units
    return model


def requests() -> list[StageRequest]:
    likelihood = StageRequest(
        "a", "support", tuple(likelihood_prompt(SOURCE, style="bare")), schemas.Likelihood, continuation=SUMMARY
    )
    questions = StageRequest("a", "questions", tuple(questions_prompt(SOURCE, n=2)), questions_list(2, 24))
    return [likelihood, questions]


def reference(model, tokenizer, judge: Judge, reqs: list[StageRequest]) -> tuple[float, str]:
    """transformers' own answers: the continuation's mean log-probability from one forward pass, and greedy
    generate under the same grammar."""
    from offline_sumscore.engine.grammar import GrammarCompiler

    likelihood, questions = reqs
    ids = tokenizer(judge.render(likelihood.messages), add_special_tokens=False)["input_ids"]
    cont = tokenizer(likelihood.continuation, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logp = model(input_ids=torch.tensor([ids + cont])).logits[0].float().log_softmax(-1)
    mean = sum(logp[len(ids) - 1 + k, cont[k]].item() for k in range(len(cont))) / len(cont)
    enc = tokenizer([judge.render(questions.messages)], return_tensors="pt", add_special_tokens=False)
    grammars = GrammarCompiler(model, tokenizer)
    with torch.inference_mode():
        out = model.generate(
            **enc,
            logits_processor=[grammars.processor(questions.grammar)],
            max_new_tokens=80,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            pad_token_id=tokenizer.eos_token_id,
        )
    text = tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert len(ids) > 4 * WINDOW
    return mean, text


def as_judge(model, tokenizer) -> Judge:
    return judge_around(tokenizer, model, context_length=1024)


FUSED = {  # what fuse_layer_ops replaces in each tiny model (2 layers)
    "llama-3.1": "5 RMSNorms, 2 SiLU MLPs, rotary embedding (llama)",
    "qwen2.5": "5 RMSNorms, 2 SiLU MLPs, rotary embedding (qwen2)",
    "qwen3": "9 RMSNorms, 2 SiLU MLPs, rotary embedding (qwen3)",  # and the query and key norms
    "mistral-v0.1": "5 RMSNorms, 2 SiLU MLPs, rotary embedding (mistral)",
    "gemma-2": "0 RMSNorms, 0 SiLU MLPs, rotary embedding (gemma2)",  # norms of 1 + weight, GELU
    "gemma-3": "0 RMSNorms, 0 SiLU MLPs, rotary embedding (gemma3)",
    "phi-3": "5 RMSNorms, 0 SiLU MLPs, rotary embedding (none)",  # gate and up in one projection, partial rotary
}
FUSED = {k: f"one-pass kernels (layer_ops.cpp, AVX-512): {v}" for k, v in FUSED.items()}


@pytest.mark.parametrize("family", list(families()))
def test_the_engine_equals_transformers_forward_pass_on_every_family(family, tokenizer):
    model = tiny_model(family, tokenizer)
    judge = as_judge(model, tokenizer)
    reqs = requests()
    mean, text = reference(model, tokenizer, judge, reqs)
    # As load_judge does on a CPU: Llama-style norms, MLPs and rotary embedding on one-pass kernels, the rest as is.
    # (The rotary function is patched in its modeling module, to the same bits: a later reference computes the same.)
    said = fuse_layer_ops(model)
    if "AVX512" in torch.backends.cpu.get_cpu_capability():
        assert said == FUSED[family], said
    engine = TransformersEngine(judge)
    how = engine.describe()["attention_kernel"]
    if getattr(model.config, "attn_logit_softcapping", None):  # Gemma-2: SDPA's calls, which compute the softcap
        assert how.startswith("sdpa (the judge softcaps its scores"), how
    elif "AVX512" in torch.backends.cpu.get_cpu_capability():  # every pass attends through the kernel here
        assert how.startswith("kernel"), how
    likelihood, questions = engine.run(reqs)
    assert likelihood.ok and questions.error_kind in (None, "cap"), questions.error
    assert abs(likelihood.value.mean_logprob - mean) < 1e-4, (likelihood.value.mean_logprob, mean)
    assert questions.raw_output == text


@pytest.mark.parametrize("family", ["qwen3", "mistral-v0.1", "gemma-2", "gemma-3", "phi-3"])
def test_windows_and_caps_change_these_models_so_agreement_above_means_something(family, tokenizer):
    cls, extra = families()[family]
    plain = {"sliding_window": 4096}  # wider than any prompt here: as if there were none
    plain.update({k: None for k in ("attn_logit_softcapping", "final_logit_softcapping") if k in extra})
    reqs = requests()
    with_them = reference(tiny_model(family, tokenizer), tokenizer, as_judge(None, tokenizer), reqs)[0]
    without = reference(tiny_model(family, tokenizer, **plain), tokenizer, as_judge(None, tokenizer), reqs)[0]
    assert abs(with_them - without) > 1e-3


def test_a_model_the_engine_cannot_attend_like_is_refused_before_its_weights_load(tmp_path):
    from transformers import LlamaConfig

    from offline_sumscore.core.errors import ModelLoadError
    from offline_sumscore.engine.judge import load_judge

    LlamaConfig(**TINY, vocab_size=64, use_bidirectional_attention=True).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"never read")  # the config alone refuses it
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")  # a chat model in every other respect
    with pytest.raises(ModelLoadError, match="attends both ways") as info:
        load_judge(tmp_path)
    assert "\n" not in str(info.value)
