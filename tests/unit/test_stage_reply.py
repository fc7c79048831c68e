"""One reading of a judge's reply (StageResult.read_reply), which every engine calls: the raw text kept, the value
parsed under the request's schema, a failure told as "cap" or "schema" in one wording whichever engine read it."""

from __future__ import annotations

import ast
from pathlib import Path

from offline_sumscore.core.errors import Failure
from offline_sumscore.core.stages import StageRequest, StageResult, cap_error
from offline_sumscore.engine.scripted import ScriptedEngine, Truncated
from offline_sumscore.scorers.stages.claims import claims_list

ENGINE = Path(__file__).parents[2] / "offline_sumscore" / "engine"
ENGINES = ["local/engine.py", "vllm_engine.py", "openai_compatible.py", "scripted.py"]


def request() -> StageRequest:
    return StageRequest("s1", "claims", ({"role": "user", "content": "x"},), claims_list(8, 200))


def test_a_reply_that_parses_is_the_value_and_its_text_is_kept():
    result = StageResult(request(), None, "").read_reply('{"claims": ["A fact."]}')
    assert result.ok and result.value.claims == ["A fact."] and result.raw_output == '{"claims": ["A fact."]}'


def test_a_reply_that_does_not_parse_fails_as_schema_or_as_cap_keeping_its_text():
    bad = '{"claims": ["A fact."'
    result = StageResult(request(), None, "", cap=12).read_reply(bad)
    assert result.error_kind == Failure.SCHEMA and result.error.startswith("output does not match the schema: ")
    assert result.error.endswith("; raw output kept") and result.raw_output == bad and result.value is None
    capped = StageResult(request(), None, "", cap=12).read_reply(bad, capped=True)
    assert capped.error_kind == Failure.CAP and capped.error == cap_error(12) == (
        "hit the 12-token cap before the output closed; raw output kept"
    )


def test_a_server_wrapping_is_undone_for_parsing_while_the_text_kept_is_the_servers():
    fenced = '```json\n{"claims": []}\n```'
    result = StageResult(request(), None, "").read_reply(fenced, parse='{"claims": []}')
    assert result.ok and result.raw_output == fenced


def test_the_scripted_engine_reads_as_every_engine_reads():
    engine = ScriptedEngine({"claims": ['{"claims": [1]}', Truncated('{"claims": ["A')]})
    bad, cut = engine.run([request(), request()])
    expected = StageResult(request(), None, "", cap=bad.cap).read_reply('{"claims": [1]}')
    assert (bad.error_kind, bad.error) == (expected.error_kind, expected.error)
    assert cut.error_kind == Failure.CAP and cut.error == cap_error(cut.cap)


def test_every_engine_reads_its_replies_with_read_reply_and_none_parses_on_its_own():
    for name in ENGINES:
        tree = ast.parse((ENGINE / name).read_text())
        calls = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        }
        assert "read_reply" in calls, f"{name} does not read its replies with StageResult.read_reply"
        assert not calls & {"parse_output", "model_validate_json"}, f"{name} parses a reply on its own"
