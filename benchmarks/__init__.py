"""durafn benchmarks: `python -m benchmarks` runs them all."""
