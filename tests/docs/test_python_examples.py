"""Every Python block in README.md and docs/ runs, as written, so no page can drift from the code.

Each block runs in a fresh namespace holding the few names the pages use without defining them (a source and its
summary, a DataFrame, an OUTPUT line), in a folder holding the files they name (data.jsonl, in.parquet). A judge
the pages load from a path under /models/ (a 7-8B model a user brings, which this machine does not have) is stood in
for by a scripted judge that answers every stage with a valid reply, through engine/build.local_engine, the one
place engines are made; load_judge() alone loads the real embedded judge. The blocks' own asserts are tests too.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from offline_sumscore.core.stages import StageRequest
from offline_sumscore.engine.scripted import ScriptedEngine
from tests.conftest import SOURCE, SUMMARY, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)
# What each stage answers when the pages' scripts give it nothing: valid, fixed, and enough to score.
ANSWERS = {
    "claims": {"claims": ["Lindford will build a library.", "It costs 4 million pounds."]},
    "questions": {"questions": ["Did the council vote to build a library?"]},
    "keyphrases": {"keyphrases": ["library", "Mill Street"]},
    "ragas_questions": {"questions": ["Is a library being built?"]},
    "ragas_answers": {"answer": "1"},
}


class StandInJudge(ScriptedEngine):
    """A scripted judge that answers any stage: its queued replies first, then ANSWERS, and "Yes" to a verdict."""

    def run(self, requests: list[StageRequest]):
        wanted = Counter(request.stage for request in requests)
        for stage, n in wanted.items():
            missing = n - len(self.queues[stage])
            if missing > 0:
                self.enqueue(stage, *[ANSWERS.get(stage, "Yes\nReason: the text says so.")] * missing)
        return super().run(requests)

    def describe(self) -> dict:
        return {"engine": "scripted", "judge": {"name": "stand-in for a brought judge", "identity": "stand-in"}}


class BroughtJudge:
    """What load_judge("/models/...") gives in these runs: a judge this machine does not have, stood in for."""

    def __init__(self, path: str):
        self.path = path


def blocks() -> list[tuple[str, int, str]]:
    return [(page.name, k, code) for page in PAGES for k, code in enumerate(BLOCK.findall(page.read_text()))]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    import pandas as pd

    rows = [{"id": "d1", "source": SOURCE, "summary": SUMMARY}, {"id": "d2", "source": SOURCE, "summary": "Short."}]
    write_jsonl(tmp_path / "data.jsonl", rows)
    write_jsonl(tmp_path / "in.jsonl", rows)
    pd.DataFrame(rows).rename(columns={"source": "article", "summary": "highlights"}).to_parquet(
        tmp_path / "in.parquet"
    )
    pd.DataFrame(
        [{"article_id": k, "article": SOURCE, "summary_gpt": SUMMARY, "summary_llama": "Short."} for k in (1, 2)]
    ).to_csv(tmp_path / "wide.csv", index=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def stand_in(monkeypatch):
    """/models/... paths load a stand-in judge; load_judge() alone the real embedded judge."""
    import offline_sumscore
    from offline_sumscore.engine import build, judge

    real_load, real_engine = judge.load_judge, build.local_engine

    def load(model=None, **kwargs):
        return BroughtJudge(str(model)) if str(model or "").startswith("/models/") else real_load(model, **kwargs)

    def engine(model=None, **kwargs):
        if isinstance(model, BroughtJudge) or str(model or "").startswith("/models/"):
            return StandInJudge()
        return real_engine(model, **kwargs)

    for module in (offline_sumscore, judge):
        monkeypatch.setattr(module, "load_judge", load)
    monkeypatch.setattr(build, "local_engine", engine)


def names(workdir: Path) -> dict:
    """The names the pages use without defining them."""
    import pandas as pd

    row = {"id": "d1", "source": SOURCE, "summary": SUMMARY}
    two_axis_line = json.dumps(
        {
            "claims": [{"claim": "Lindford will build a library.", "supported": True}],
            "questions": ["Did the council vote?"],
            "coverage_verdicts": [{"answered": True}],
        }
    )
    return dict(
        source=SOURCE,
        summary=SUMMARY,
        document=SOURCE,
        my_summarizer=lambda text: SUMMARY,
        chunk1=SOURCE.split(". ")[0] + ".",
        chunk2=SOURCE.split(". ")[1],
        src1=SOURCE,
        sum1=SUMMARY,
        src2=SOURCE,
        sum2="Lindford plans a library.",
        rows=[row],
        df=pd.DataFrame([{"article": SOURCE, "highlights": SUMMARY}]),
        line=two_axis_line,
        ragas_row={"answers": ["1", "0"]},
        source_text=SOURCE,
        summary_text=SUMMARY,
    )


@pytest.mark.model
@pytest.mark.parametrize("page,k,code", blocks(), ids=[f"{p}-{k}" for p, k, _ in blocks()])
def test_every_python_block_in_the_readme_and_docs_runs(page, k, code, workdir, stand_in):
    namespace = names(workdir)
    exec(compile(code, f"{page} (python block {k + 1})", "exec"), namespace)  # its asserts, where it has some, too


def test_the_pages_hold_the_blocks_this_test_runs():
    found = {page for page, _, _ in blocks()}
    assert {"README.md", "getting-started.md", "judges.md", "scoring.md", "testing.md"} <= found
