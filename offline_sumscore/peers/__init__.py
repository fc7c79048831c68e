"""Shapes and classes that match the tools people move from: Mastra's scorer result, DeepEval's metric, Ragas's
MetricResult (`.value` on SummaryScoreResult), and a pytest assertion. Each adapts our results; none re-scores.
May import every layer below it (core, engine, scorers, analysis, io)."""
