"""offline_sumscore: summarization scores from a local LLM judge. No network, no hosted API.

Re-exports only. Importing this package imports no torch: models load on first use.
"""

from offline_sumscore.core.arithmetic import summary_score, two_axis_score
from offline_sumscore.core.errors import InputError, JudgeOutputError, ModelLoadError, SumscoreError, UsageError
from offline_sumscore.core.results import FailedRow, SummarizationResult, SummaryScoreResult
from offline_sumscore.core.version import VERSION
from offline_sumscore.runs.files import compare_files, score_file
from offline_sumscore.runs.frame import score_frame
from offline_sumscore.scorers import SummarizationScorer, SummaryScore


def load_judge(model=None, *, device: str = "auto", dtype: str = "auto"):
    """Load a judge once to share it between scorers: SummarizationScorer(model=judge), SummaryScore(model=judge)."""
    from offline_sumscore.engine.judge import load_judge as _load

    return _load(model, device=device, dtype=dtype)


__all__ = [
    "SummarizationScorer",
    "SummaryScore",
    "two_axis_score",
    "summary_score",
    "load_judge",
    "score_file",
    "score_frame",
    "compare_files",
    "SummarizationResult",
    "SummaryScoreResult",
    "FailedRow",
    "SumscoreError",
    "InputError",
    "JudgeOutputError",
    "ModelLoadError",
    "UsageError",
]
__version__ = VERSION
