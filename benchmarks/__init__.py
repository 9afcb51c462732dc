"""Benchmarks worth rerunning, one module per scenario; ``python -m benchmarks`` runs them
(:mod:`benchmarks.__main__`). A regular package, so that tests/benchmarks/ (on the tests'
import path) is not taken for a part of it."""
