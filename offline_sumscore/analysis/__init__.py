"""Statistics over scored rows, without a model: systems compared (comparison), a likelihood threshold chosen and
checked (calibration), intervals over resampled documents (bootstrap). May import core/ only: no model, no engine.
Agreement with human ratings and two runs' rows compared are the benchmarks' (benchmarks/lib/)."""
