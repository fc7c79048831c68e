"""A DeepEval metric on the local judge: use it where DeepEval's SummarizationMetric was used.

    from deepeval.test_case import LLMTestCase
    from offline_sumscore.peers.deepeval import LocalSummarizationMetric

    metric = LocalSummarizationMetric(threshold=0.5, include_reason=True)
    metric.measure(LLMTestCase(input=document, actual_output=summary))
    metric.score, metric.reason, metric.success, metric.is_successful()

As in DeepEval, the test case's `input` is the text summarised and `actual_output` the summary;
`assessment_questions` replace the generated questions; `strict_mode` makes the score 0 unless it is 1. The scorer
runs with flavor="deepeval": exactly n questions, each asked of the source and of the summary, only those the source
answers counted, no rounding.
Works without deepeval installed (any object with input and actual_output); with deepeval, it subclasses
BaseMetric, so `assert_test` and `evaluate` accept it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from offline_sumscore.scorers import SummarizationScorer

try:  # deepeval is an optional extra: the class works with or without it
    from deepeval.metrics import BaseMetric as _Base
except ImportError:  # pragma: no cover - exercised where deepeval is absent
    _Base = object


class LocalSummarizationMetric(_Base):
    def __init__(
        self,
        threshold: float = 0.5,
        *,
        model: Any = None,
        assessment_questions: Sequence[str] | None = None,
        n: int = 5,
        strict_mode: bool = False,
        include_reason: bool = True,
        async_mode: bool = True,
        verbose_mode: bool = False,
        scorer: SummarizationScorer | None = None,
    ):
        self.threshold = 1 if strict_mode else threshold
        self.strict_mode, self.include_reason = strict_mode, include_reason
        self.async_mode, self.verbose_mode = async_mode, verbose_mode
        self.assessment_questions = list(assessment_questions) if assessment_questions else None
        # DeepEval's n is the number of generated questions.
        self.scorer = scorer or SummarizationScorer(
            model,
            flavor="deepeval",
            max_questions=n,
            threshold=self.threshold,
            strict_mode=strict_mode,
            include_reason=include_reason,
        )
        self.score: float | None = None
        self.reason: str | None = None
        self.success: bool | None = None
        self.error: str | None = None
        self.result = None  # our full SummarizationResult: every verdict, prompt and raw output

    def measure(self, test_case: Any, *args, **kwargs) -> float:
        return self._keep(
            self.scorer.score(test_case.input, test_case.actual_output, questions=self.assessment_questions)
        )

    async def a_measure(self, test_case: Any, *args, **kwargs) -> float:
        return self._keep(
            await self.scorer.ascore(test_case.input, test_case.actual_output, questions=self.assessment_questions)
        )

    def _keep(self, result) -> float:
        self.result = result
        self.score = result.score if not self.strict_mode or result.score == 1 else 0.0
        self.reason = result.reason if self.include_reason else None
        self.success = self.score >= self.threshold
        return self.score

    def is_successful(self) -> bool:
        return bool(self.success)

    @property
    def __name__(self) -> str:  # DeepEval reports metrics by this name
        return "Local Summarization"
