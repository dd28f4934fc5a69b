"""Benchmark harness for omni-export (see benchmarks/README.md). Not part of the package; never
run by the test suite except for one smoke test on the tiny demo checkpoint."""
