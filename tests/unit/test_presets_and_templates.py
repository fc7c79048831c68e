"""Presets (`sumscore models`, --model NAME) and chat-template quirks, with the embedded tokenizer (no weights)."""

import pytest
from click.testing import CliRunner
from transformers import AutoTokenizer

from offline_sumscore import ModelLoadError
from offline_sumscore.cli import main
from offline_sumscore.engine.judge import Judge, models_root, presets, resolve_model_path
from offline_sumscore.scorers.stages.verdict import question_prompt

# Gemma-2's template refuses a system turn in the same way (raise_exception on role 'system').
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}<turn>{{ m['role'] }}\n{{ m['content'] }}</turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<turn>model\n{% endif %}"
)


def test_every_preset_names_what_a_user_needs():
    for name, p in presets().items():
        assert {
            "description",
            "path",
            "source",
            "context_length",
            "dtype",
            "chat_template",
            "batch_size_by_gpu_gib",
        } <= set(p), name
    assert {
        "qwen2.5-7b-instruct",
        "llama-3.1-8b-instruct",
        "mistral-7b-instruct-v0.3",
        "gemma-2-9b-it",
        "phi-3.5-mini-instruct",
        "smollm2-135m",
    } <= set(presets())


def test_models_command_lists_presets_and_what_is_present():
    result = CliRunner().invoke(main, ["models"])
    assert result.exit_code == 0
    assert "present  smollm2-135m" in result.output and "absent   gemma-2-9b-it" in result.output


def test_a_preset_name_resolves_to_its_path_and_an_absent_one_says_where_to_put_it():
    assert resolve_model_path("smollm2-135m") == models_root() / "SmolLM2-135M-Instruct"
    with pytest.raises(ModelLoadError, match="preset gemma-2-9b-it expects its files at .*gemma-2-9b-it; copy"):
        resolve_model_path("gemma-2-9b-it")


def test_a_template_that_refuses_a_system_turn_gets_it_folded_into_the_user_turn_on_record():
    tok = AutoTokenizer.from_pretrained(str(models_root() / "SmolLM2-135M-Instruct"), local_files_only=True)
    tok.chat_template = NO_SYSTEM_TEMPLATE
    judge = Judge(
        model=None, tokenizer=tok, name="t", path="", device="cpu", dtype="float32", identity="t", context_length=8192
    )
    text = judge.render(question_prompt("A summary.", "A question?"))
    assert text.startswith("<turn>user\nYou are a careful, literal judge") and "<turn>system" not in text
    assert judge.decisions["system_role"].startswith("folded into the first user turn")
    assert judge.render(question_prompt("B.", "Q?")).count("<turn>") == 2
