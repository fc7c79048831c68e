"""A stage's JSON schema as GBNF, llama.cpp's grammar syntax, in the layout our own grammar fixes (", " between items,
": " after a key, nothing else), for llama-server's `grammar` field.

Why not its response_format: llama.cpp's own converter drops a string's maxLength where the string also has a pattern
(a drawn question came back 113 characters long against a bound of 80, and the whole run fell back to the prompt),
and it lets the judge lay the JSON out as it likes, so the same judge wrote other questions there than here. Written
here, every bound our validation checks is enforced, and the judge writes the JSON ours does, token for token.

The subset our stages use: objects whose properties are all required (in the schema's order, no others); arrays with
min/max items; strings with min/max length, an enum of strings, or a pattern made of fixed text around one repeated
character class, with at most one group of literal alternatives (the length bound then holds for each alternative).
Anything else raises Unsupported, and the caller asks with response_format instead.
"""

from __future__ import annotations

import json
import re
from functools import cache

# One character of a JSON string, as decoded: anything but a quote, a backslash or a control character, or an escape.
CHAR = r'char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'
_PATTERN_PART = re.compile(
    r"\((?P<alts>[^()]*)\)|\[\^(?P<cls>[^\]]*)\](?P<rep>[+*])|\\(?P<esc>.)|(?P<lit>[^\\()\[\]+*?{}|.^$])"
)


class Unsupported(ValueError):
    """A schema (or pattern) outside the subset written here."""


@cache
def schema_gbnf(schema_json: str) -> str:
    """The GBNF grammar that admits exactly the compact JSON documents valid under schema (the subset above)."""
    rules: list[str] = []
    rules.insert(0, f"root ::= {_value(json.loads(schema_json), rules)}")
    return "\n".join([*rules, CHAR])


def _lit(text: str) -> str:
    return json.dumps(text)  # a GBNF literal is written as a JSON string is


def _value(schema: dict, rules: list[str]) -> str:
    kind = schema.get("type")
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return "(" + " | ".join(_lit(json.dumps(v)) for v in schema["enum"]) + ")"
    if kind == "object":
        props = schema.get("properties", {})
        if set(schema.get("required", [])) != set(props) or schema.get("additionalProperties", False) is not False:
            raise Unsupported("an object with optional or extra properties")
        parts = [f"{_lit(json.dumps(key) + ': ')} {_value(sub, rules)}" for key, sub in props.items()]
        return '"{" ' + ' ", " '.join(parts) + ' "}"'
    if kind == "array":
        item = f"item{len(rules)}"
        rules.append(f"{item} ::= {_value(schema.get('items', {}), rules)}")
        least, most = schema.get("minItems", 0), schema.get("maxItems")
        more = f"{{{max(least - 1, 0)},{'' if most is None else most - 1}}}"
        listed = f'{item} (", " {item}){more}'
        return f'"[" {listed} "]"' if least >= 1 else f'"[" ({listed})? "]"'
    if kind == "string":
        least, most = schema.get("minLength", 0), schema.get("maxLength")
        if "pattern" in schema:
            return '"\\"" ' + _pattern(schema["pattern"], least, most) + ' "\\""'
        return f'"\\"" char{{{least},{"" if most is None else most}}} "\\""'
    raise Unsupported(f"a schema of type {kind!r}")


def _pattern(pattern: str, least: int, most: int | None) -> str:
    """A pattern ^...$ of literals, at most one group of literal alternatives and one repeated negated class, as
    GBNF, each alternative's repetition bounded so that the whole string stays within [least, most] characters."""
    if not (pattern.startswith("^") and pattern.endswith("$")):
        raise Unsupported(f"a pattern not anchored at both ends: {pattern}")
    body, at, parts = pattern[1:-1], 0, []
    while at < len(body):
        m = _PATTERN_PART.match(body, at)
        if m is None:
            raise Unsupported(f"a pattern construct at {body[at:]!r}")
        at = m.end()
        if m["alts"] is not None:
            alts = m["alts"].split("|")
            if any(re.search(r"[\\()\[\]+*?{}.^$\"]", a) for a in alts):
                raise Unsupported(f"alternatives that are not plain text: {m['alts']}")
            parts.append(("alts", alts))
        elif m["cls"] is not None:
            parts.append(("class", m["cls"], 1 if m["rep"] == "+" else 0))
        else:
            text = m["esc"] if m["esc"] is not None else m["lit"]
            if text in '"\\':
                raise Unsupported("a quote or backslash in a pattern's text")
            parts.append(("lit", text))
    groups = [p for p in parts if p[0] == "alts"]
    classes = [p for p in parts if p[0] == "class"]
    if len(groups) > 1 or len(classes) != 1:
        raise Unsupported(f"a pattern with {len(groups)} groups and {len(classes)} repeated classes")
    excluded = classes[0][1].replace('"', "")
    char_class = f'[^{excluded}"\\\\\\x00-\\x1F]'
    choices = []
    for alt in groups[0][1] if groups else [""]:
        fixed = sum(len(alt if p[0] == "alts" else p[1]) for p in parts if p[0] != "class")
        low = max(classes[0][2], least - fixed)
        high = None if most is None else most - fixed
        if high is not None and high < low:
            continue  # this alternative cannot fit the bound
        seq = []
        for p in parts:
            if p[0] == "lit":
                seq.append(_lit(p[1]))
            elif p[0] == "alts":
                seq.append(_lit(alt))
            else:
                seq.append(f"{char_class}{{{low},{'' if high is None else high}}}")
        choices.append(" ".join(seq))
    if not choices:
        raise Unsupported("no alternative of the pattern fits the length bound")
    return "(" + " | ".join(f"({c})" for c in choices) + ")"
