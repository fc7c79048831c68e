"""This package's version, written once: the package metadata (pyproject.toml reads it), `offline_sumscore.__version__`
and `sumscore --version` all take it from here. CHANGELOG.md says what each version changed."""

VERSION = "0.2.0"
