"""The HTML report rendered by a real headless browser (Debian's chromium): the plots and the table must show.

Marked `browser`; `.ci/run` installs chromium so CI runs it. Without chromium on PATH it is skipped, loudly.
"""

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from offline_sumscore.cli import main

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
BLUE = (0x1F, 0x77, 0xB4)  # the report's plot colour


def rows():
    out = []
    for i in range(12):
        a, c = (i % 4 + 1) / 4, (i % 3 + 1) / 3
        out.append(
            {
                "id": f"doc{i}",
                "metric": "two-axis",
                "score": round(min(a, c), 2),
                "alignment": a,
                "coverage": c,
                "reason": f"The score is {round(min(a, c), 2)} because of row {i}.",
                "passed": min(a, c) >= 0.5,
                "limiting_axis": "alignment" if a < c else "coverage",
                "claims": [{"claim": f"Claim {i}", "supported": a == 1, "reason": "r"}],
                "questions": [f"Question {i}?"],
                "coverage_verdicts": [{"answered": c == 1, "reason": "r"}],
                "settings": {"scale": 1.0},
                "judge": {"name": "scripted", "device": "cpu", "dtype": "float32"},
                "stages": {"claims": {"tokens_in": 100, "tokens_out": 20, "seconds": 0.5}},
            }
        )
    out.append(
        {
            "id": "bad",
            "metric": "two-axis",
            "score": None,
            "stages": {},
            "error": {"stage": "input", "cause": "input:empty_text", "message": "in.jsonl:13: empty"},
        }
    )
    return out


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium); .ci/run installs it"
)
def test_report_renders_plots_and_table_in_headless_chromium(tmp_path):
    from PIL import Image

    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(results), "-o", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text
    assert "<script" not in text  # self-contained and static
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,1800"]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count("<circle") == 12 and "<table" in dom and "doc0" in dom and "input:empty_text" in dom
    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 1800)
    width, height = image.size
    pixels = image.load()

    def blue_in(top, bottom):
        return sum(
            1
            for y in range(top, bottom, 2)
            for x in range(0, width, 2)
            if all(abs(pixels[x, y][k] - BLUE[k]) < 40 for k in range(3))
        )

    def dark_in(top, bottom):
        return sum(1 for y in range(top, bottom, 2) for x in range(0, width, 2) if sum(pixels[x, y]) < 200)

    def red_in(top, bottom):  # the report's "unsupported" / "missed" marks
        return sum(
            1
            for y in range(top, bottom, 2)
            for x in range(0, width, 2)
            if pixels[x, y][0] > 140 and pixels[x, y][1] < 60 and pixels[x, y][2] < 80
        )

    assert blue_in(0, height // 2) > 500  # histogram bars, scatter dots and share bars were painted
    assert dark_in(height // 2, height) > 1000  # the table's text was painted below the plots
    assert red_in(height // 2, height) > 50  # with its verdict marks


@pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install chromium); .ci/run installs it"
)
def test_compare_page_renders_its_forest_plot_scatter_and_tables_in_headless_chromium(tmp_path):
    from PIL import Image

    from offline_sumscore.io.outputs import write_rows
    from tests.pipeline.test_compare_cli import system_rows

    a, b = tmp_path / "better.jsonl", tmp_path / "worse.jsonl"
    write_rows(system_rows(0.2), a)
    write_rows(system_rows(0.0), b)
    page = tmp_path / "compare.html"
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "-o", str(page), "--resamples", "500"])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "<script" not in text and "https://" not in text
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,1400"]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    fields = 5  # score, alignment, coverage and their soft forms
    assert dom.count('class="dot strong"') + dom.count('class="dot"') == fields + 20  # forest dots + documents
    assert 'id="pairs"' in dom and 'id="drill"' in dom and "better better" in dom
    shot = tmp_path / "compare.png"
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    image = Image.open(shot).convert("RGB")
    pixels, (width, height) = image.load(), image.size
    blue = sum(
        1
        for y in range(0, height, 2)
        for x in range(0, width, 2)
        if all(abs(pixels[x, y][k] - BLUE[k]) < 40 for k in range(3))
    )
    red = sum(
        1
        for y in range(0, height, 2)
        for x in range(0, width, 2)
        if pixels[x, y][0] > 140 and pixels[x, y][1] < 60 and pixels[x, y][2] < 80
    )
    assert blue > 20 and red > 20  # the scatter dots; the significant differences' dots
