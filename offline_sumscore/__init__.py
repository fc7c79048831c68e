"""offline_sumscore: summarization scores from a local LLM judge. No network, no hosted API.

Re-exports only. Importing this package imports no torch: models load on first use.
"""
from .arithmetic import summary_score, two_axis_score
from .errors import InputError, JudgeOutputError, ModelLoadError, SumscoreError, UsageError
from .results import FailedRow, SummarizationResult, SummaryScoreResult
from .scorers import SummarizationScorer, SummaryScore


def load_judge(model=None, *, device: str = "auto", dtype: str = "auto"):
    """Load a judge once to share it between scorers: SummarizationScorer(model=judge), SummaryScore(model=judge)."""
    from .judge import load_judge as _load

    return _load(model, device=device, dtype=dtype)


__all__ = ["SummarizationScorer", "SummaryScore", "two_axis_score", "summary_score", "load_judge",
           "SummarizationResult", "SummaryScoreResult", "FailedRow", "SumscoreError", "InputError",
           "JudgeOutputError", "ModelLoadError", "UsageError"]
__version__ = "0.1.0"
