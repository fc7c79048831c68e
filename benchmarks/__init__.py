"""The benchmarks: scripts run from the project root as `python -m benchmarks.NAME`, their shared code in lib/."""
