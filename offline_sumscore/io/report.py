"""`sumscore report`: one self-contained HTML page from an OUTPUT file. No network, no CDN, no script: inline CSS and
inline SVG plots, so the page opens anywhere, offline, and can be mailed as one file.

Sections: the run (judge, settings, rows, failures by cause, tokens and time), the score distribution, alignment
against coverage (two-axis) or QA against conciseness (summary-score), the share of unsupported claims and of
missed coverage items, and the worst summaries with their verdicts and reasons.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from collections.abc import Iterable

from offline_sumscore.analysis.calibration import one_sided_run
from offline_sumscore.analysis.comparison import left_out, verdict_label
from offline_sumscore.core.results import embedded_judge_note, row_label

W, H, PAD = 420, 260, 40  # plot size and margin, in SVG user units


def _axes(x_label: str, y_label: str, y_max: float = 1) -> list[str]:
    parts = [
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" class="axis"/>',
        f'<line x1="{PAD}" y1="10" x2="{PAD}" y2="{H - PAD}" class="axis"/>',
        f'<text x="{(W + PAD) / 2}" y="{H - 6}" class="label">{html.escape(x_label)}</text>',
        f'<text x="12" y="{(H - PAD) / 2}" class="label" transform="rotate(-90 12 {(H - PAD) / 2})">'
        f"{html.escape(y_label)}</text>",
    ]
    for t in (0, 0.5, 1):
        x, y = _x(t), _y(t)
        parts += [
            f'<text x="{x}" y="{H - PAD + 14}" class="tick">{t:g}</text>',
            f'<text x="{PAD - 6}" y="{y + 4}" class="tick" text-anchor="end">'
            f"{round(t * y_max) if y_max > 1 else round(t * y_max, 1):g}</text>",
        ]
    return parts


def _x(v: float) -> float:
    return round(PAD + v * (W - PAD - 10), 1)


def _y(v: float) -> float:
    return round(H - PAD - v * (H - PAD - 10), 1)


def histogram_svg(values: list[float], label: str, bins: int = 10) -> str:
    counts = [0] * bins
    for v in values:
        counts[min(int(max(0.0, min(1.0, v)) * bins), bins - 1)] += 1
    top = max(counts) or 1
    bar_w = (W - PAD - 10) / bins
    parts = _axes(label, "summaries", y_max=top)
    for i, c in enumerate(counts):
        h = c / top * (H - PAD - 10)
        parts.append(
            f'<rect class="bar" x="{round(PAD + i * bar_w + 1, 1)}" y="{round(H - PAD - h, 1)}" '
            f'width="{round(bar_w - 2, 1)}" height="{round(h, 1)}"><title>{i / bins:.1f}-{(i + 1) / bins:.1f}: '
            f"{c}</title></rect>"
        )
    return _svg("histogram", parts)


def scatter_svg(points: Iterable[tuple[float, float, str]], x_label: str, y_label: str) -> str:
    parts = _axes(x_label, y_label)
    parts.append(f'<line x1="{_x(0)}" y1="{_y(0)}" x2="{_x(1)}" y2="{_y(1)}" class="diag"/>')
    for x, y, title in points:
        parts.append(
            f'<circle class="dot" cx="{_x(x)}" cy="{_y(y)}" r="4"><title>{html.escape(title)}</title></circle>'
        )
    return _svg("scatter", parts)


def bars_svg(items: list[tuple[str, float]]) -> str:
    """Horizontal bars of shares (0..1)."""
    height = 30 * len(items) + 20
    parts = []
    for i, (name, share) in enumerate(items):
        y = 10 + 30 * i
        parts += [
            f'<text x="0" y="{y + 15}" class="label-left">{html.escape(name)}</text>',
            f'<rect class="bar" x="190" y="{y}" width="{round(share * 200, 1)}" height="20"/>',
            f'<text x="{round(195 + share * 200, 1)}" y="{y + 15}" class="tick-left">{100 * share:.0f}%</text>',
        ]
    return _svg("bars", parts, height=height)


def _svg(kind: str, parts: list[str], height: int = H) -> str:
    return (
        f'<svg class="plot {kind}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" '
        f'height="{height}" role="img">' + "".join(parts) + "</svg>"
    )


CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:2rem auto;max-width:1100px;color:#222;
padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
.grid{display:flex;flex-wrap:wrap;gap:1.5rem}.card{border:1px solid #ddd;border-radius:6px;padding:.75rem}
table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #eee;padding:.35rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f6f6}.num{text-align:right;font-variant-numeric:tabular-nums}.bad{color:#b00020}.ok{color:#1b5e20}
.banner{background:#fff4d6;border:1px solid #e0b84a;border-radius:6px;padding:.6rem .8rem}
mark.conflict{background:#ffd6d6;border-bottom:2px solid #b00020}
mark.weakest{background:none;border-bottom:2px dotted #b00020}
.axis{stroke:#444;stroke-width:1}.diag{stroke:#bbb;stroke-dasharray:4 3}.dot{fill:#1f77b4;fill-opacity:.65}
.bar{fill:#1f77b4}.label,.label-left{font-size:12px;fill:#333}.label{text-anchor:middle}.tick,.tick-left{font-size:10px;fill:#555}
.tick{text-anchor:middle}dl{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem}dt{font-weight:600}
small{color:#666}
"""


def _cell(v) -> str:
    return "-" if v is None else (f"{v:.3f}" if isinstance(v, float) else html.escape(str(v)))


def _p(value) -> str:
    """The judge's P(yes) beside a verdict, where it was read."""
    return "" if value is None else f" <small>P={value:.2f}</small>"


def _marked(text: str, entry: dict, failed: bool) -> str:
    """The statement, escaped, with the word behind its likelihood verdict marked: a fact conflict, where the text
    made the judge expect another word (its title says which), and a note after it. A failed verdict without a
    conflict (its mean PMI fell short) gets its weakest word marked more lightly: no single word set that verdict,
    but it is where the text explains the statement least."""
    shown, c, e = html.escape(text), entry.get("conflict"), entry.get("evidence")
    if c:
        word, kind = html.escape(c["word"]), "conflict"
        note = (
            f"the text makes the judge expect &#39;{html.escape(c['expected_word'])}&#39; (p {c['p_expected']:.2f})"
            if c.get("expected_word")
            else f"the text makes the judge expect another word here (p {c['p_expected']:.2f})"
        )
    elif failed and e and e.get("word"):
        word, kind = html.escape(e["word"]), "weakest"
        note = f"the word the text explains least (PMI {e['pmi']:+.1f} nats)"
        # A whole word of the text, or nothing: never a token's piece (a row written before the word was kept: its
        # token, where it is a word of its own)
        expected = e["expected_word"] if "expected_word" in e else e["expected"].strip()
        if expected and expected != e["word"]:
            note += f"; the judge expected &#39;{html.escape(expected)}&#39; (p {e['p_expected']:.2f})"
    else:
        return shown
    mark = f'<mark class="{kind}" title="{note}">{word}</mark>'
    shown = re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", lambda _: mark, shown, count=1)
    return shown + f" <small>(&#39;{word}&#39;: {note})</small>"


def _verdicts(row: dict) -> str:
    out = []
    for c in row.get("claims") or []:
        mark = '<span class="ok">supported</span>' if c.get("supported") else '<span class="bad">unsupported</span>'
        out.append(
            f"<li>{mark}{_p(c.get('p_supported'))}: {_marked(c.get('claim', ''), c, not c.get('supported'))}"
            + (f" <small>({html.escape(c['reason'])})</small>" if c.get("reason") else "")
            + "</li>"
        )
    for q, v in zip(row.get("questions") or [], row.get("coverage_verdicts") or []):
        mark = '<span class="ok">answered</span>' if v.get("answered") else '<span class="bad">missed</span>'
        out.append(f"<li>{mark}{_p(v.get('p_answered'))}: {_marked(q, v, not v.get('answered'))}</li>")
    for q, a in zip(row.get("questions") or [], row.get("answers") or []):
        if "coverage_verdicts" not in row:
            mark = '<span class="ok">answered</span>' if a == "1" else '<span class="bad">missed</span>'
            out.append(f"<li>{mark}: {html.escape(q)}</li>")
    return "<ul>" + "".join(out) + "</ul>" if out else ""


def render(rows: list[dict], *, title: str = "offline_sumscore report", worst: int = 10) -> str:
    ok = [r for r in rows if not r.get("error") and r.get("score") is not None]
    failed = [r for r in rows if r.get("error")]
    metric = next((r.get("metric") for r in rows if r.get("metric")), "?")
    settings = next((r.get("settings") for r in ok if r.get("settings")), {})
    scale = float(settings.get("scale", 1) or 1)
    scores = [r["score"] / scale for r in ok]
    warning = one_sided_run(ok)
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p class=bad id=one-sided>Warning: {html.escape(warning)}</p>" if warning else "",
        f"<p class=banner id=embedded-judge>Note: {html.escape(note)}</p>"
        if (note := embedded_judge_note(rows))
        else "",
        _the_run(rows, ok, failed, metric, settings, scores, scale),
        _score_plots(ok, scores, metric == "two-axis"),
        _lowest(ok, worst, metric == "two-axis"),
    ]
    if failed:
        sections.append(
            "<h2>Failed rows</h2><table><tr><th>id</th><th>cause</th><th>message</th></tr>"
            + "".join(
                f"<tr><td>{_cell(row_label(r))}</td><td>{_cell(r['error'].get('cause'))}</td>"
                f"<td>{_cell(r['error'].get('message'))}</td></tr>"
                for r in failed
            )
            + "</table>"
        )
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{CSS}</style></head><body>"
        + "".join(sections)
        + "</body></html>\n"
    )


def wall_seconds(rows: list[dict]) -> tuple[float | None, int]:
    """The wall time the rows took to score, and over how many runs: each run's span from its start to the last row
    it wrote, added up (a resumed run is a second run). None where the rows carry no timing (an older OUTPUT)."""
    last: dict[float, float] = {}
    for r in rows:
        t = r.get("timing") or {}
        if "run_started" in t and "written" in t:
            last[t["run_started"]] = max(last.get(t["run_started"], t["written"]), t["written"])
    return (sum(end - start for start, end in last.items()) if last else None), len(last)


def _the_run(rows, ok, failed, metric: str, settings: dict, scores: list[float], scale: float) -> str:
    """The run's facts: metric, judge, rows, mean score, tokens, judge time, settings."""
    judge = next((r.get("judge") for r in ok if r.get("judge")), {})
    stages = [s for r in rows for s in (r.get("stages") or {}).values()]
    tokens_in, tokens_out = sum(s.get("tokens_in", 0) for s in stages), sum(s.get("tokens_out", 0) for s in stages)
    wall, runs = wall_seconds(rows)
    cached = sum(1 for s in stages if s.get("cached"))
    # A run answered from the stage cache took little time because the judge did little: said beside its time.
    from_cache = f"; {cached} of {len(stages)} stage answers came from the stage cache, not the judge" if cached else ""
    causes = Counter((r["error"] or {}).get("cause", "?") for r in failed)
    mean = sum(scores) / len(scores) if scores else None
    return (
        "<h2>The run</h2><dl>"
        f"<dt>metric</dt><dd>{html.escape(metric)}</dd>"
        f"<dt>judge</dt><dd>{html.escape(str(judge.get('name', '?')))} ({html.escape(str(judge.get('device', '?')))}, "
        f"{html.escape(str(judge.get('dtype', '?')))}), identity {html.escape(str(judge.get('identity', '?')))}</dd>"
        f"<dt>rows</dt><dd>{len(rows)} ({len(ok)} scored, {len(failed)} failed"
        + ("".join(f"; {html.escape(c)}: {n}" for c, n in causes.most_common()))
        + ")</dd>"
        f"<dt>mean score</dt><dd>{_cell(mean)}{' (on 0..1)' if scale != 1 else ''}</dd>"
        f"<dt>tokens</dt><dd>{tokens_in} in, {tokens_out} out</dd>"
        f"<dt>wall time</dt><dd>{'-' if wall is None else f'{wall:.1f} s'} scoring"
        + (f", over {runs} runs (resumed)" if runs > 1 else "")
        + f" (from the run's start to its last row written; the judge's loading aside{from_cache})</dd>"
        f"<dt>settings</dt><dd><code>{html.escape(json.dumps(settings))}</code></dd></dl>"
    )


def _score_plots(ok: list[dict], scores: list[float], two_axis: bool) -> str:
    """The score histogram, the two parts of the score against each other, and the shares of misses."""
    plots = [f'<div class="card"><b>Score distribution</b><br>{histogram_svg(scores, "score (0..1)")}</div>']
    if two_axis:
        pts = [(r["alignment"], r["coverage"], f"{row_label(r)}: score {r['score']}") for r in ok]
        plots.append(
            '<div class="card"><b>Alignment against coverage</b> <small>one point per summary</small><br>'
            + scatter_svg(pts, "alignment", "coverage")
            + "</div>"
        )
        claims = [c for r in ok for c in r.get("claims") or []]
        verdicts = [v for r in ok for v in r.get("coverage_verdicts") or []]
        shares = [
            ("unsupported claims", sum(not c.get("supported") for c in claims) / len(claims) if claims else 0),
            ("missed coverage items", sum(not v.get("answered") for v in verdicts) / len(verdicts) if verdicts else 0),
            ("summaries below threshold", sum(not r.get("passed") for r in ok) / len(ok) if ok else 0),
        ]
    else:
        pts = [
            (
                r["qa"],
                r["conciseness"] if r.get("conciseness") is not None else 0,
                f"{row_label(r)}: score {r['score']:.3f}",
            )
            for r in ok
        ]
        plots.append(
            '<div class="card"><b>QA against conciseness</b> <small>one point per summary</small><br>'
            + scatter_svg(pts, "QA", "conciseness")
            + "</div>"
        )
        answers = [a for r in ok for a in r.get("answers") or []]
        shares = [("missed questions", sum(a != "1" for a in answers) / len(answers) if answers else 0)]
    plots.append(f'<div class="card"><b>Shares</b><br>{bars_svg(shares)}</div>')
    return '<h2>Scores</h2><div class="grid">' + "".join(plots) + "</div>"


def _lowest(ok: list[dict], worst: int, two_axis: bool) -> str:
    """The lowest scores, each with its reason and every verdict."""
    lowest = sorted(ok, key=lambda r: (r["score"], str(r["id"])))[:worst]
    table = [
        "<table><tr><th>id</th><th class=num>score</th>"
        + (
            "<th class=num>alignment</th><th class=num>coverage</th>"
            if two_axis
            else "<th class=num>QA</th><th class=num>conciseness</th>"
        )
        + "<th>reason and verdicts</th></tr>"
    ]
    for r in lowest:
        a, b = (r.get("alignment"), r.get("coverage")) if two_axis else (r.get("qa"), r.get("conciseness"))
        table.append(
            f"<tr><td>{_cell(row_label(r))}</td><td class=num>{_cell(float(r['score']))}</td><td class=num>"
            f"{_cell(a)}</td><td class=num>{_cell(b)}</td><td>{html.escape(r.get('reason') or '')}"
            f"{_verdicts(r)}</td></tr>"
        )
    table.append("</table>")
    return f"<h2>The {len(lowest)} lowest scores</h2>" + "".join(table)


# -- `sumscore compare` -------------------------------------------------------------------------------------------
def forest_svg(items: list[tuple[str, float, float, float, str]]) -> str:
    """One line per comparison: its label, the 95% interval as a bar and the mean difference as a dot, around a
    line at zero; items are (label, mean, low, high, verdict)."""
    span = max([abs(v) for _, m, lo, hi, _ in items for v in (m, lo, hi) if v == v] + [0.05])
    left, width, height = 230, W + 130 - 230 - 40, 26 * len(items) + 40  # 40: room for the right-hand tick

    def x(v: float) -> float:
        return round(left + (v + span) / (2 * span) * width, 1)

    parts = [
        f'<line x1="{x(0)}" y1="8" x2="{x(0)}" y2="{height - 26}" class="diag"/>',
        f'<text x="{x(-span)}" y="{height - 10}" class="tick">{-span:+.2f}</text>',
        f'<text x="{x(0)}" y="{height - 10}" class="tick">0</text>',
        f'<text x="{x(span)}" y="{height - 10}" class="tick">{span:+.2f}</text>',
    ]
    for i, (label, mean, lo, hi, verdict) in enumerate(items):
        y = 20 + 26 * i
        cls = "dot" if verdict == "no difference" else "dot strong"
        parts += [
            f'<text x="0" y="{y + 4}" class="label-left">{html.escape(label)}</text>',
            f'<line x1="{x(lo)}" y1="{y}" x2="{x(hi)}" y2="{y}" class="ci"/>',
            f'<circle class="{cls}" cx="{x(mean)}" cy="{y}" r="5"><title>{html.escape(label)}: '
            f"{mean:+.3f} [{lo:+.3f}, {hi:+.3f}], {html.escape(verdict)}</title></circle>",
        ]
    return (
        f'<svg class="plot forest" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W + 130} {height}" '
        f'width="{W + 130}" height="{height}" role="img">' + "".join(parts) + "</svg>"
    )


def render_comparison(
    report: dict, systems_rows: dict[str, dict[str, dict]], *, title: str = "offline_sumscore: compare"
) -> str:
    """The comparison as one self-contained page: the table, a forest plot of every pair's difference per field, a
    paired scatter of the first pair's scores per document, the ranking, and the drill-down."""
    pairs = report["pairs"]
    fields = report["fields"]
    forest = [
        (f"{p['a']} - {p['b']}: {f}", s["mean_diff"], s["ci_low"], s["ci_high"], verdict_label(p, s))
        for f in fields
        for p in pairs
        for s in [p["fields"][f]]
    ]
    first = pairs[0]
    a_rows, b_rows = systems_rows[first["a"]], systems_rows[first["b"]]
    common = sorted(set(a_rows) & set(b_rows))
    points = [
        (a_rows[d]["score"], b_rows[d]["score"], f"{d}: {a_rows[d]['score']:.2f} vs {b_rows[d]['score']:.2f}")
        for d in common
        if d in a_rows and d in b_rows
    ]
    rows_html = []
    for p in pairs:
        for f, s in p["fields"].items():
            better = verdict_label(p, s)
            rows_html.append(
                f"<tr><td>{html.escape(p['a'])}</td><td>{html.escape(p['b'])}</td><td>{f}</td>"
                f"<td class=num>{s['mean_a']:.3f}</td><td class=num>{s['mean_b']:.3f}</td>"
                f"<td class=num>{s['mean_diff']:+.3f}</td><td class=num>[{s['ci_low']:+.3f}, {s['ci_high']:+.3f}]</td>"
                f"<td class=num>{s['p']:.4f}</td><td class=num>{s['p_holm']:.4f}</td>"
                f"<td class=num>{s['wins']}/{s['ties']}/{s['losses']}</td><td>{html.escape(better)}</td></tr>"
            )
    dropped = "".join(
        f"<li>{html.escape(s['name'])}: {s['scored']} scored; left out: {html.escape(left_out(s))}</li>"
        for s in report["systems"]
    )
    ranking = _ranking(report)
    drill = _drill_down(pairs)
    css = CSS + ".ci{stroke:#1f77b4;stroke-width:3}.strong{fill:#b00020;fill-opacity:1}"
    mixed = (
        (
            "<p class=bad>Settings differ (compared with --allow-mixed): "
            + html.escape(", ".join(report["settings_differ"]))
            + "</p>"
        )
        if report["settings_differ"]
        else ""
    )
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
        f"<style>{css}</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p>{report['documents']} documents scored by every system ({html.escape(report['metric'])}). Paired "
        f"bootstrap 95% intervals resampling documents ({report['resamples']} resamples, seed {report['seed']}); "
        f"sign-flip permutation p-values, Holm-adjusted over the {len(pairs)} pair(s) per field; a verdict "
        f"where the adjusted p is below {report['alpha']}.</p>{mixed}<ul>{dropped}</ul>"
        f"<h2>Differences</h2><table id=pairs><tr><th>1st system</th><th>2nd system</th><th>field</th>"
        f"<th>mean, 1st</th><th>mean, 2nd</th><th>1st - 2nd</th><th>95% CI</th><th>p</th><th>p (Holm)</th>"
        f"<th>W/T/L</th>"
        f"<th>verdict</th></tr>{''.join(rows_html)}</table>"
        f"<div class=grid><div class=card><h3>Mean difference with its 95% interval</h3>{forest_svg(forest)}"
        f"</div><div class=card><h3>Score per document: {html.escape(first['a'])} (x) against "
        f"{html.escape(first['b'])} (y)</h3>{scatter_svg(points, first['a'], first['b'])}</div></div>{ranking}"
        f"<h2>Where they differ most</h2><table id=drill><tr><th>document</th><th>A</th><th>B</th></tr>"
        f"{''.join(drill)}</table></body></html>"
    )


def _ranking(report: dict) -> str:
    """With more than two systems: the systems by mean score, each with its interval."""
    ranking = ""
    if len(report["systems"]) > 2 and "score" in report["fields"]:
        ranking = (
            "<h2>Ranking by mean score</h2><ol>"
            + "".join(
                f"<li>{html.escape(n)}: {report['means'][n]['score']['mean']:.3f} "
                f"[{report['means'][n]['score']['ci_low']:.3f}, {report['means'][n]['score']['ci_high']:.3f}]</li>"
                for n in report["ranking"]
            )
            + (
                "</ol><p><small>Per-system intervals do not test differences; the pairs "
                "above do, with Holm's adjustment for multiple comparisons.</small></p>"
            )
        )
    return ranking


def _drill_down(pairs: list[dict]) -> list[str]:
    """The documents where the first pairs differ most, with what each side missed."""
    drill = []
    for p in pairs[:3]:
        for d in p["drill_down"]:

            def misses(side):
                items = [
                    f'<li><span class="bad">unsupported</span>: {html.escape(str(c))}</li>' for c in side["unsupported"]
                ]
                items += [f'<li><span class="bad">missed</span>: {html.escape(str(q))}</li>' for q in side["missed"]]
                return "<ul>" + "".join(items) + "</ul>" if items else "<small>nothing missed</small>"

            drill.append(
                f"<tr><td>{html.escape(str(d['document']))}</td>"
                f"<td>{html.escape(p['a'])} <b>{d['score_a']:.3f}</b>{misses(d['a'])}</td>"
                f"<td>{html.escape(p['b'])} <b>{d['score_b']:.3f}</b>{misses(d['b'])}</td></tr>"
            )
    return drill
