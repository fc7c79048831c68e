"""The soak's rows: as many distinct council-news rows as a long run needs, made without any data (the soak
benchmark's, and the memory probe's in research/)."""

from __future__ import annotations

TOWNS = "Lindford Ostby Harlow Brenmouth Calder Dunmore Eastfield Farrow Glenholt Inverby".split()
PROJECTS = ["library", "bridge", "school", "swimming pool", "bus station", "clinic", "sports hall", "park"]
MONTHS = "January February March April May June July August September October November December".split()
CURRENCY = ["pounds", "euros"]


def make_rows(n: int) -> list[dict]:
    """n distinct rows of three-sentence council news, each with a one-sentence summary (every third one with a
    changed amount)."""
    rows = []
    for k in range(n):
        town, project = TOWNS[k % len(TOWNS)], PROJECTS[(k // len(TOWNS)) % len(PROJECTS)]
        month, amount = MONTHS[(k // 7) % 12], 2 + (k * 7919) % 97
        money = CURRENCY[k % 2]
        source = (
            f"The council of {town} voted on Tuesday to build a new {project}. Work will begin in {month} and cost "
            f"{amount} million {money}. Residents welcomed the plan at a public meeting, item {k}."
        )
        said = amount + 3 if k % 3 == 2 else amount
        summary = f"{town} will build a {project} for {said} million {money}, starting in {month}."
        rows.append({"id": f"soak-{k}", "source": source, "summary": summary})
    return rows
