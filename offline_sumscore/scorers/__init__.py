"""The two scorers. Both share one door to the engine (scorers.base)."""
from .summary_score import SummaryScore
from .two_axis import SummarizationScorer

__all__ = ["SummarizationScorer", "SummaryScore"]
