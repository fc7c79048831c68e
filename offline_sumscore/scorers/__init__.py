"""The two scorers. Both share one door to the engine (scorers.base)."""

from offline_sumscore.scorers.summary_score import SummaryScore
from offline_sumscore.scorers.two_axis import SummarizationScorer

METRICS = {"two-axis": SummarizationScorer, "summary-score": SummaryScore}  # the metric names rows and flags use

__all__ = ["METRICS", "SummarizationScorer", "SummaryScore"]
