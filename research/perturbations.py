"""A perturbation set for likelihood verdicts: sentences copied from development sources, each beside a changed copy
that the source contradicts (a swapped number, date, name, place, negation, antonym or role) and a faithful
paraphrase control that the source supports.

    python -m research.perturbations                       # writes research/data/perturbations.jsonl
    python -m research.perturbations --seed 0 --per-type 110

Sources: SummEval dev (summeval_dev.jsonl in --data-dir, "summeval" part: where verdict rules are chosen)
and FRANK (frank_finesure_gpt4o.jsonl, "frank" part: held out, reported on). Every row: id, part, type, source (cut at
a sentence end near --source-chars), original (a sentence of that source, copied), perturbed (the changed copy: the
source contradicts it), paraphrase (the control: a faithful rewording of the original, which the source supports),
and the edit made. Rules only, no model: what changes is known exactly. Deterministic for a seed; the counts per
type and part are printed and written beside the set (perturbations.counts.json).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path

DATA: Path | None = None  # the folder of the agreement files, from --data-dir
OUT = Path(__file__).resolve().parent / "data" / "perturbations.jsonl"
MONTHS = "January February March April May June July August September October November December".split()
DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
PLACES = (
    "London Paris Manchester Liverpool Glasgow Edinburgh Cardiff Dublin Belfast Birmingham Leeds Chelsea Madrid "
    "Barcelona Rome Milan Berlin Munich Moscow Beijing Tokyo Sydney Melbourne Toronto Chicago Boston Texas Florida "
    "California Ohio Virginia Georgia Arizona Iraq Iran Syria Israel Egypt Libya Yemen Afghanistan Pakistan India "
    "China Japan Russia Ukraine France Germany Spain Italy Scotland Wales England Ireland Canada Mexico Brazil "
    "Australia Nigeria Kenya America Britain Europe Africa Asia Washington York Atlanta Denver Seattle Houston Dallas"
).split()
ANTONYMS = dict(
    pair.split(":")
    for pair in (
        "won:lost lost:won win:lose wins:loses increase:decrease increased:decreased decrease:increase "
        "decreased:increased rose:fell fell:rose before:after after:before more:fewer higher:lower lower:higher "
        "first:last last:first allowed:banned banned:allowed accepted:rejected rejected:accepted arrested:released "
        "released:arrested guilty:innocent innocent:guilty alive:dead dead:alive open:closed closed:opened "
        "opened:closed largest:smallest biggest:smallest best:worst worst:best older:younger younger:older "
        "oldest:youngest youngest:oldest early:late late:early started:ended ended:started male:female "
        "female:male husband:wife wife:husband father:mother mother:father son:daughter daughter:son "
        "north:south south:north east:west west:east above:below below:above approved:rejected "
        "support:oppose supported:opposed agreed:refused survived:died died:survived"
    ).split()
)
NEGATABLE = ("is", "was", "are", "were", "has", "have", "had", "will", "would", "can", "could", "should", "did")
SYNONYMS = dict(
    pair.split(":")
    for pair in (
        "said:stated says:states told:informed bought:purchased buy:purchase began:started begin:start "
        "started:began big:large large:big help:assist helped:assisted show:reveal shows:reveals showed:revealed "
        "nearly:almost almost:nearly children:kids kids:children job:position jobs:positions quickly:rapidly "
        "happy:pleased"
    ).split()
)
STOP_CAPS = set(MONTHS + DAYS) | {"The", "A", "An", "He", "She", "It", "They", "We", "I", "In", "On", "At", "But"}
NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?)(?![\w])")
YEAR = re.compile(r"^(19|20)\d\d$")
CAP = re.compile(r"(?<=\s)([A-Z][a-z]+(?:\s[A-Z][a-z]+)*)")


def sentences(source: str) -> list[str]:
    """The source's sentences of 8 to 40 words, split at sentence ends."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'])", source)
    return [p.strip() for p in parts if 8 <= len(p.split()) <= 40 and not p.strip().startswith(("(", "--"))]


# -- the edits: each returns (changed sentence, what changed) or None where it does not apply -------------------
def change_number(s: str, rng: random.Random):
    found = [m for m in NUMBER.finditer(s) if not YEAR.match(m.group(1))]
    if not found:
        return None
    m = rng.choice(found)
    text = m.group(1).replace(",", "")
    value = float(text)
    new = value + rng.choice([-1, 1]) * max(1, round(value * rng.uniform(0.2, 0.6)))
    if new <= 0 or new == value:
        new = value + max(1, round(value * 0.5))
    shown = f"{new:,.0f}" if "," in m.group(1) else (f"{new:.1f}" if "." in text else f"{new:.0f}")
    return s[: m.start(1)] + shown + s[m.end(1) :], f"{m.group(1)} -> {shown}"


def change_date(s: str, rng: random.Random):
    words = [(w, MONTHS) for w in MONTHS if re.search(rf"\b{w}\b", s)] + [
        (w, DAYS) for w in DAYS if re.search(rf"\b{w}\b", s)
    ]
    years = [m for m in NUMBER.finditer(s) if YEAR.match(m.group(1))]
    if words and (not years or rng.random() < 0.5):
        word, pool = rng.choice(words)
        other = rng.choice([w for w in pool if w != word])
        return re.sub(rf"\b{word}\b", other, s, count=1), f"{word} -> {other}"
    if years:
        m = rng.choice(years)
        other = str(int(m.group(1)) + rng.choice([-3, -2, -1, 1, 2, 3]))
        return s[: m.start(1)] + other + s[m.end(1) :], f"{m.group(1)} -> {other}"
    return None


def entities(text: str) -> list[str]:
    """Capitalized word runs after a space (not a sentence's first word), without months, days, pronouns or places."""
    found = []
    for m in CAP.finditer(text):
        words = [w for w in m.group(1).split() if w not in STOP_CAPS and w not in PLACES]
        if words:
            found.append(" ".join(words))
    return list(dict.fromkeys(found))


def change_name(s: str, rng: random.Random, source: str):
    mine = entities(s)
    others = [e for e in entities(source) if e not in mine and not any(w in e.split() for w in " ".join(mine).split())]
    if not mine or not others:
        return None
    old, new = rng.choice(mine), rng.choice(others)
    return re.sub(rf"\b{re.escape(old)}\b", new, s, count=1), f"{old} -> {new}"


def change_place(s: str, rng: random.Random):
    mine = [p for p in PLACES if re.search(rf"\b{p}\b", s)]
    if not mine:
        return None
    old = rng.choice(mine)
    new = rng.choice([p for p in PLACES if p not in mine])
    return re.sub(rf"\b{old}\b", new, s, count=1), f"{old} -> {new}"


def change_negation(s: str, rng: random.Random):
    if re.search(r"\b(not|n't|never)\b", s):
        changed = re.sub(r"\s(not|never)\b", "", s, count=1) if re.search(r"\s(not|never)\b", s) else None
        return (changed, "negation removed") if changed and changed != s else None
    found = [m for m in re.finditer(r"\b(" + "|".join(NEGATABLE) + r")\b", s)]
    if not found:
        return None
    m = rng.choice(found)
    return s[: m.end()] + " not" + s[m.end() :], f"{m.group(1)} -> {m.group(1)} not"


def change_antonym(s: str, rng: random.Random):
    found = [m for m in re.finditer(r"\b(" + "|".join(ANTONYMS) + r")\b", s)]
    if not found:
        return None
    m = rng.choice(found)
    return s[: m.start()] + ANTONYMS[m.group(1)] + s[m.end() :], f"{m.group(1)} -> {ANTONYMS[m.group(1)]}"


def swap_roles(s: str, rng: random.Random):
    """The first two different entities (people, teams, places) of the sentence change places: who did what to whom."""
    mine = [e for e in entities(s) + [p for p in PLACES if re.search(rf"\b{p}\b", s)]]
    mine = [e for e in dict.fromkeys(mine) if not any(e != o and e in o for o in mine)]
    if len(mine) < 2:
        return None
    a, b = mine[0], mine[1]
    swapped = re.sub(rf"\b({re.escape(a)}|{re.escape(b)})\b", lambda m: b if m.group(1) == a else a, s)
    return (swapped, f"{a} <-> {b}") if swapped != s else None


def paraphrase(s: str, rng: random.Random):
    """A faithful rewording: a synonym for a common word, else the clause after the last comma dropped (an omission,
    which a summary may make)."""
    found = [m for m in re.finditer(r"\b(" + "|".join(SYNONYMS) + r")\b", s)]
    if found:
        m = rng.choice(found)
        return s[: m.start()] + SYNONYMS[m.group(1)] + s[m.end() :], f"{m.group(1)} -> {SYNONYMS[m.group(1)]}"
    cut = s.rfind(", ")
    if cut > len(s) // 2:
        return s[:cut].rstrip() + ".", "last clause dropped"
    return None


EDITS = {
    "number": lambda s, rng, src: change_number(s, rng),
    "date": lambda s, rng, src: change_date(s, rng),
    "name": change_name,
    "place": lambda s, rng, src: change_place(s, rng),
    "negation": lambda s, rng, src: change_negation(s, rng),
    "antonym": lambda s, rng, src: change_antonym(s, rng),
    "role": lambda s, rng, src: swap_roles(s, rng),
}


def documents(source_chars: int) -> list[tuple[str, str, str]]:
    """(part, document id, source cut near source_chars) for each distinct source of the two development sets."""
    docs = []
    for part, name in (("summeval", "summeval_dev.jsonl"), ("frank", "frank_finesure_gpt4o.jsonl")):
        seen = set()
        for line in (DATA / name).open():
            row = json.loads(line)
            if row["source"] in seen:
                continue
            seen.add(row["source"])
            source = row["source"]
            if len(source) > source_chars:
                cut = source.rfind(". ", 0, source_chars)
                source = source[: cut + 1] if cut > 0 else source[:source_chars]
            docs.append((part, str(row.get("doc_id") or row["id"]), source))
    return docs


def generate(seed: int, per_type: int, source_chars: int) -> list[dict]:
    rng = random.Random(seed)
    candidates = [(part, doc, src, s) for part, doc, src in documents(source_chars) for s in sentences(src)]
    rng.shuffle(candidates)
    rows, used, counts = [], set(), Counter()
    for kind, edit in EDITS.items():
        for part, doc, source, sentence in candidates:
            if counts[(kind, part)] >= per_type // 2 or (kind, sentence) in used:
                continue
            changed, control = edit(sentence, rng, source), paraphrase(sentence, rng)
            if not changed or not control or changed[0] == sentence or control[0] == sentence:
                continue
            used.add((kind, sentence))
            counts[(kind, part)] += 1
            rows.append(
                {
                    "id": f"{kind}-{part}-{counts[(kind, part)]}",
                    "part": part,
                    "type": kind,
                    "doc_id": doc,
                    "source": source,
                    "original": sentence,
                    "perturbed": changed[0],
                    "edit": changed[1],
                    "paraphrase": control[0],
                    "paraphrase_edit": control[1],
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--data-dir",
        type=Path,
        required=True,
        help="the folder holding summeval_dev.jsonl and the other agreement files",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-type", type=int, default=120, help="pairs per type, half from each part where they exist")
    ap.add_argument("--source-chars", type=int, default=1500)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="write nothing: exit 1 unless --out holds what this writes")
    args = ap.parse_args()
    global DATA
    DATA = args.data_dir
    if args.check:  # the committed set is what its recorded seed and counts generate again
        recorded = json.loads(args.out.with_suffix(".counts.json").read_text())
        rows = generate(recorded["seed"], recorded["per_type"], recorded["source_chars"])
        same = [json.dumps(r, ensure_ascii=False) for r in rows] == args.out.read_text().splitlines()
        print(f"{args.out}: {'generated again, identical' if same else 'DIFFERS from what the generator writes'}")
        raise SystemExit(0 if same else 1)
    rows = generate(args.seed, args.per_type, args.source_chars)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    counts = Counter(f"{r['type']}/{r['part']}" for r in rows)
    record = {"seed": args.seed, "per_type": args.per_type, "source_chars": args.source_chars, "pairs": len(rows)}
    record["counts"] = dict(sorted(counts.items()))
    args.out.with_suffix(".counts.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
