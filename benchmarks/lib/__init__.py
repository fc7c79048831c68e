"""What the benchmarks and the research scripts share, one concept a module: the ladder's workloads (workloads),
its baseline engine (outlines_engine), its judges (ladder_judge), the machine's peaks and the physical floor
(peaks), the ladder's rungs and runs (ladder), vLLM beside it (vllm_peer), what a rung's rows hold (outcomes) and the
report (ladder_report); the profile's operator categories and replay (engine_profile); agreement statistics and
items (agreement_stats, agreement_items); two runs' rows compared (row_diff); the soak's rows (soak_rows). Scripts
import these, never each other; the package imports none of them."""
