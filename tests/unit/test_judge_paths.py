"""A model path that cannot be a judge gets a one-line ModelLoadError that says what to do (no model loaded)."""
import pytest

from offline_sumscore import ModelLoadError
from offline_sumscore.judge import resolve_model_path


def test_missing_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist; pass a Hugging Face model directory or a .gguf file"):
        resolve_model_path(tmp_path / "absent")


def test_directory_that_is_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match=r"is not a model directory \(no config.json\)"):
        resolve_model_path(tmp_path)


def test_model_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"has no weights \(\*.safetensors or \*.bin\)"):
        resolve_model_path(tmp_path)


def test_file_that_is_not_gguf(tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file but not a .gguf"):
        resolve_model_path(tmp_path / "weights.pt")


def test_messages_are_one_line(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        resolve_model_path(tmp_path / "absent")
    assert "\n" not in str(info.value)
