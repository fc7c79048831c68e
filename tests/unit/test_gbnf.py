"""The stages' JSON schemas written as GBNF for llama-server (engine/gbnf.py): our layout, every bound kept, and what is
outside the subset refused rather than written loosely. That llama-server accepts these grammars and its judge writes
under them is tested on the real server (tests/llamacpp)."""

import json
import re

import pytest

from offline_sumscore.engine.gbnf import Unsupported, schema_gbnf
from offline_sumscore.scorers.stages.answers import ragas_answer
from offline_sumscore.scorers.stages.claims import claims_list
from offline_sumscore.scorers.stages.questions import AUXILIARIES, questions_list


def gbnf(model) -> str:
    return schema_gbnf(json.dumps(model.model_json_schema()))


def test_a_list_is_laid_out_as_our_grammar_lays_it_out_with_its_bounds():
    rules = gbnf(claims_list(8, 100)).splitlines()
    assert rules[0] == 'root ::= "{" "\\"claims\\": " "[" (item0 (", " item0){0,7})? "]" "}"'
    assert rules[1] == 'item0 ::= "\\"" char{1,100} "\\""'


def test_every_closed_question_alternative_stays_within_the_length_bound():
    item = gbnf(questions_list(3, 80)).splitlines()[1]
    found = re.findall(r'\("(\w+)" " " \[\^\?\\n"\\\\\\x00-\\x1F\]\{1,(\d+)\} "\?"\)', item)
    assert [aux for aux, _ in found] == AUXILIARIES
    assert all(len(aux) + 1 + int(most) + 1 == 80 for aux, most in found)  # the auxiliary, a space, text, "?"
    assert gbnf(questions_list(3, 80)).splitlines()[0].endswith('"[" item0 (", " item0){0,2} "]" "}"')  # 1 to 3


def test_an_enum_of_strings_is_its_quoted_values():
    assert gbnf(ragas_answer()).splitlines()[0] == 'root ::= "{" "\\"answer\\": " ("\\"1\\"" | "\\"0\\"") "}"'


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": []},  # optional property
        {"type": "number"},
        {"type": "string", "pattern": "^[^a]+ [^b]+$"},  # two repeated classes
        {"type": "string", "pattern": "[^a]+"},  # not anchored
        {"type": "string", "pattern": "^(Is|Are) [^?]+\\?$", "maxLength": 3},  # no alternative fits
    ],
)
def test_what_is_outside_the_subset_is_refused(schema):
    with pytest.raises(Unsupported):
        schema_gbnf(json.dumps(schema))
