"""``python -m benchmarks [--quick]``: the whole suite (see benchmarks/suite.py)."""

from .suite import cli

cli()
