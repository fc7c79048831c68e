"""The metrics: the two scorers (two_axis, summary_score), each writing a plan of stage requests per sample in waves
(waves: each reply read by its request's identity), the stages both ask for (stages/: claims, questions, the verdict
and the likelihood verdict's rules), what the two-axis metric alone does with replies (two_axis_stages), the default
design per judge (design), the composed reason (reasons), and the driver both share (base), their one door to the
engine. May import core/ and engine/."""

from offline_sumscore.scorers.summary_score import SummaryScore
from offline_sumscore.scorers.two_axis import SummarizationScorer

METRICS = {"two-axis": SummarizationScorer, "summary-score": SummaryScore}  # the metric names rows and flags use

__all__ = ["METRICS", "SummarizationScorer", "SummaryScore"]
