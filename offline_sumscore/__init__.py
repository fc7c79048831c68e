"""offline_sumscore: summarization scores from a local LLM judge. No network, no hosted API.

Re-exports only. Importing this package imports no torch: models load on first use.
"""

from offline_sumscore.core.arithmetic import summary_score, two_axis_score
from offline_sumscore.core.errors import InputError, JudgeOutputError, ModelLoadError, SumscoreError, UsageError
from offline_sumscore.core.results import FailedRow, SummarizationResult, SummaryScoreResult
from offline_sumscore.core.version import VERSION
from offline_sumscore.engine.build import EngineSpec
from offline_sumscore.runs.files import compare_files, score_file
from offline_sumscore.runs.frame import score_frame
from offline_sumscore.scorers import SummarizationScorer, SummaryScore


def load_judge(model=None, *, device: str = "auto", dtype: str = "auto"):
    """Load a judge once to share it between scorers: SummarizationScorer(model=judge), SummaryScore(model=judge).
    model may be an EngineSpec, whose model, device and dtype are loaded (for our engine: a loaded judge is ours)."""
    from offline_sumscore.engine.judge import load_judge as _load

    if isinstance(model, EngineSpec):
        if model.kind not in ("auto", "local"):
            raise UsageError(f"load_judge loads a judge for our engine; a {model.kind} engine loads its own")
        model, device, dtype = model.model, model.device, model.dtype
    return _load(model, device=device, dtype=dtype)


__all__ = [
    "SummarizationScorer",
    "SummaryScore",
    "two_axis_score",
    "summary_score",
    "load_judge",
    "EngineSpec",
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
